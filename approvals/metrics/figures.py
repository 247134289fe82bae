"""The dashboard's figures: each one's definition, in words and as sums of the per-run facts."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.utils.translation import gettext_lazy as _

from runs.models import SNAPSHOT_FIELDS


@dataclass
class Figure:
    key: str
    label: Any
    definition: Any
    unit: str  # "ratio", "seconds", "ms", "count", "per100"
    value: float | None
    # (numerator, denominator) behind a ratio, for the reader who wants the counts.
    counts: tuple[int, int] | None = None
    series: list[float | None] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    # True when a higher value is better (drives the trend colour).
    higher_is_better: bool | None = None

    def as_json(self) -> dict:
        return {
            "label": str(self.label),
            "definition": str(self.definition),
            "unit": self.unit,
            "value": _round(self.value),
            "counts": list(self.counts) if self.counts else None,
            "series": [_round(v) for v in self.series],
            **({"extra": self.extra} if self.extra else {}),
        }


def _round(value):
    return None if value is None else round(float(value), 4)


def ratio(n, d) -> float | None:
    return (n / d) if d else None


def _num(value) -> float | None:
    return None if value is None else float(value)


@dataclass
class Data:
    """The sums of a set of runs' facts: one row per trend bucket and one (key None) for them
    all."""

    buckets: list[datetime]
    rows: dict[Any, dict]
    tools: list[dict]

    def total(self) -> dict:
        return self.rows.get(None) or {}

    def series(self, fn: Callable[[dict], Any]) -> list[float | None]:
        out = []
        for bucket in self.buckets:
            row = self.rows.get(bucket)
            out.append(_num(fn(row)) if row else None)
        return out

    def rate(self, num: str, den: str) -> tuple[float | None, tuple, list]:
        total = self.total()
        n, d = total.get(num) or 0, total.get(den) or 0
        return ratio(n, d), (int(n), int(d)), self.series(lambda r: ratio(r[num], r[den]))


FIGURES: list[Callable[[Data], Figure]] = []


def figure(fn: Callable[[Data], Figure]) -> Callable[[Data], Figure]:
    FIGURES.append(fn)
    return fn


def _rate_figure(data, key, label, definition, num, den, *, better=True) -> Figure:
    value, counts, series = data.rate(num, den)
    return Figure(key, label, definition, "ratio", value, counts, series, higher_is_better=better)


@figure
def execution_success_rate(data: Data) -> Figure:
    return _rate_figure(
        data,
        "execution_success_rate",
        _("Execution success rate"),
        _("Runs started in the window that ended succeeded, out of those that have ended "
          "(succeeded, failed, cancelled or compensated). Runs still open are not counted."),
        "succeeded", "finished",
    )  # fmt: skip


@figure
def tool_failure_rate(data: Data) -> Figure:
    failures = {(r["tool"], r["failure_class"]): r["n"] for r in data.tools if r["failure_class"]}
    calls = {r["tool"]: r["n"] for r in data.tools if r["failure_class"] == ""}
    total_failures = data.total().get("tool_failures") or 0
    total_calls = data.total().get("tool_calls") or 0
    by_tool = []
    for tool in sorted(calls):
        tool_failures = {cls: n for (t, cls), n in failures.items() if t == tool}
        failed = sum(tool_failures.values())
        by_tool.append({
            "tool": tool,
            "calls": int(calls[tool]),
            "failures": int(failed),
            "rate": _round(ratio(failed, calls[tool])),
            "by_class": {cls: {"failures": int(n), "rate": _round(ratio(n, calls[tool]))}
                         for cls, n in sorted(tool_failures.items())},
        })  # fmt: skip
    by_tool.sort(key=lambda row: (-(row["rate"] or 0), row["tool"]))
    by_class: dict[str, int] = {}
    for (_tool, cls), n in failures.items():
        by_class[cls] = by_class.get(cls, 0) + int(n)
    series = data.series(lambda r: ratio(r["tool_failures"], r["tool_calls"]))
    return Figure(
        "tool_failure_rate",
        _("Tool failure rate"),
        _("Failed tool attempts ÷ tool attempts, in runs started in the window. A failed "
          "attempt is one the engine routed as a failure (retry scheduled, waiting for the tool, "
          "escalated, failed, or outcome unknown), with its failure class; attempts are the "
          "steps' attempt counts. Broken down by tool and by class."),
        "ratio",
        ratio(total_failures, total_calls),
        (int(total_failures), int(total_calls)),
        series,
        extra={"by_tool": by_tool,
               "by_class": {cls: {"failures": n, "rate": _round(ratio(n, total_calls))}
                            for cls, n in sorted(by_class.items())}},
        higher_is_better=False,
    )  # fmt: skip


@figure
def auto_recovery_rate(data: Data) -> Figure:
    return _rate_figure(
        data,
        "auto_recovery_rate",
        _("Auto-recovery rate"),
        _("Of the ended runs that hit at least one tool failure, the share that succeeded with "
          "no person stepping in: never escalated, never taken over, and no human decision "
          "other than an approval."),
        "auto_recovered", "faulted_finished",
    )  # fmt: skip


@figure
def local_recovery_rate(data: Data) -> Figure:
    return _rate_figure(
        data,
        "local_recovery_rate",
        _("Local-recovery success rate"),
        _("Of the steps that had at least one tool failure, the share that then finished done "
          "(succeeded or degraded to the fallback) at that same step with no human decision on "
          "the step: resumed in place, not re-run, no person needed. Steps still open count "
          "as not recovered yet."),
        "recovered_locally", "failed_steps",
    )  # fmt: skip


@figure
def human_takeover_rate(data: Data) -> Figure:
    return _rate_figure(
        data,
        "human_takeover_rate",
        _("Human takeover rate"),
        _("Runs in which a person stepped in to recover, out of all runs started in the "
          "window: the run was taken over, or someone settled it (confirmed an outcome, retried, "
          "fixed data, skipped, did it by hand, cancelled). Approval decisions alone do not "
          "count."),
        "human_stepped_in", "runs", better=False,
    )  # fmt: skip


@figure
def takeovers_per_100_runs(data: Data) -> Figure:
    total = data.total()
    runs = total.get("runs") or 0
    takeovers = total.get("takeovers") or 0
    return Figure(
        "takeovers_per_100_runs",
        _("Takeovers per 100 runs"),
        _("Explicit takeovers (a person clicked “Take over”) of runs started in the window, "
          "per 100 of those runs."),
        "per100",
        ratio(takeovers * 100, runs),
        (int(takeovers), int(runs)),
        data.series(lambda r: ratio(r["takeovers"] * 100, r["runs"])),
        higher_is_better=False,
    )  # fmt: skip


def _duration_figure(
    data, key, label, definition, name, counts_col=None, *, extra: tuple[str, ...] = ()
) -> Figure:
    """The median of the `name` durations (in ms for latency, else seconds), with the `extra`
    statistics ("mean", "p95") beside it."""
    total = data.total()
    counts = None
    if counts_col:
        counts = (int(total.get(counts_col) or 0), int(total.get(counts_col) or 0))
    column = f"{name}_p50"
    return Figure(
        key,
        label,
        definition,
        "ms" if name == "latency" else "seconds",
        _num(total.get(column)),
        counts,
        data.series(lambda r: r.get(column)),
        extra={stat: _round(_num(total.get(f"{name}_{stat}"))) for stat in extra},
        higher_is_better=False,
    )


@figure
def time_to_recover(data: Data) -> Figure:
    return _duration_figure(
        data, "time_to_recover_median", _("Time to recover (median)"),
        _("For each step with a tool failure that later finished done: from its first failed "
          "attempt to the step finishing (by the engine or a person). Median; the mean is shown "
          "beside it."),
        "recover", "recovered", extra=("mean",),
    )  # fmt: skip


@figure
def time_to_close(data: Data) -> Figure:
    return _duration_figure(
        data, "time_to_close_median", _("Time to close after a failure (median)"),
        _("For each ended run that hit a tool failure: from its first failed tool attempt to "
          "the run ending, whatever the ending. Median; the mean is shown beside it."),
        "close", "closed_after_failure", extra=("mean",),
    )  # fmt: skip


@figure
def pause_to_resume(data: Data) -> Figure:
    return _duration_figure(
        data, "pause_to_resume_median", _("Pause-to-resume time (median)"),
        _("For every wait that was resolved (timer fired, event delivered, approval decided, "
          "tool back): from the wait being created to it being resolved. Median."),
        "resume",
    )  # fmt: skip


@figure
def duplicate_side_effect_rate(data: Data) -> Figure:
    return _rate_figure(
        data,
        "duplicate_side_effect_rate",
        _("Duplicate side-effect rate"),
        _("Side-effect steps whose effect was committed under more than one idempotency key "
          "(the outside world saw it twice), out of side-effect steps with a committed effect. "
          "Inferred from TaskPilots' own ledger; a duplicate the ledger never learned of cannot "
          "be seen here."),
        "steps_duplicated", "steps_committed", better=False,
    )  # fmt: skip


@figure
def wrong_retry_rate(data: Data) -> Figure:
    return _rate_figure(
        data,
        "wrong_retry_rate",
        _("Wrong-retry rate"),
        _("Of the side-effect steps that were sent again (the outcome was judged not committed, "
          "the tool was re-called with the same key, or a new key was issued), the share whose "
          "earlier attempt had in fact landed: a reconcile by key later found it committed, a "
          "person confirmed it happened after the resend, or the step ended with two committed "
          "keys."),
        "wrong_retries", "steps_resent", better=False,
    )  # fmt: skip


@figure
def snapshot_coverage(data: Data) -> Figure:
    return _rate_figure(
        data,
        "snapshot_coverage",
        _("Snapshot coverage"),
        _("Committed side effects whose snapshot was written before the commit "
          "(snapshot created_at ≤ side effect committed_at), out of all committed side effects."),
        "covered", "committed",
    )  # fmt: skip


@figure
def missing_field_rate(data: Data) -> Figure:
    total = data.total()
    snapshots, missing = total.get("snapshots") or 0, total.get("missing") or 0
    width = len(SNAPSHOT_FIELDS)
    return Figure(
        "missing_field_rate",
        _("Snapshot missing-field rate"),
        _(
            "Fields the engine could not fill, summed over the snapshots of runs started in the "
            "window, out of snapshots × %(fields)d expected fields (%(names)s)."
        )
        % {"fields": width, "names": ", ".join(SNAPSHOT_FIELDS)},
        "ratio",
        ratio(missing, snapshots * width),
        (int(missing), int(snapshots * width)),
        data.series(lambda r: ratio(r["missing"], r["snapshots"] * width)),
        higher_is_better=False,
    )


@figure
def snapshot_latency(data: Data) -> Figure:
    return _duration_figure(
        data, "snapshot_latency_p50", _("Snapshot-to-side-effect latency (p50)"),
        _("For committed side effects with a snapshot before them: snapshot created_at → side "
          "effect committed_at, in milliseconds. p50; p95 beside it. Includes the tool call "
          "and, for reconciled or human-confirmed effects, the time to confirm."),
        "latency", extra=("p95",),
    )  # fmt: skip


@figure
def waits_timed_out(data: Data) -> Figure:
    return _rate_figure(
        data,
        "waits_timed_out",
        _("Waits that timed out undecided"),
        _("Waits (events, timers, approvals, tool recoveries) that reached their deadline with "
          "nothing resolving them, out of waits that have ended (resolved or timed out)."),
        "expired", "settled", better=False,
    )  # fmt: skip


@figure
def approval_handling_time(data: Data) -> Figure:
    return _duration_figure(
        data, "approval_handling_median", _("Approval handling time (median)"),
        _("For decided approval requests: from the request to the decision. Median; the mean "
          "is shown beside it."),
        "handling", "decided", extra=("mean",),
    )  # fmt: skip


@figure
def second_interventions(data: Data) -> Figure:
    return _rate_figure(
        data,
        "second_intervention_rate",
        _("Takeovers needing a second intervention"),
        _("Of the runs that were taken over, the share that needed a person again: taken over "
          "twice or more, or a human decision made after the run was released."),
        "second_intervention", "runs_taken_over", better=False,
    )  # fmt: skip


INCONSISTENCIES = {
    "running_without_step": _(
        "Runs marked running for over %(minutes)d minutes with no unfinished step."
    ),
    "expired_leases": _(
        "Steps running whose worker lease ran out over %(minutes)d minutes ago (the sweeper "
        "should have taken them back)."
    ),
    "intended_too_long": _(
        "Side effects still ‘about to be sent’ %(minutes)d minutes after the attempt (past any "
        "settle window): the call's outcome was never recorded."
    ),
    "waiting_without_wait": _("Runs waiting with no pending wait to wake them."),
}
INCONSISTENCY_LABELS = {
    "running_without_step": _("Running, no step"),
    "expired_leases": _("Expired leases"),
    "intended_too_long": _("Intents never settled"),
    "waiting_without_wait": _("Waiting on nothing"),
}


def median(values):  # used by tests and docs to state the hand-computed answers
    return statistics.median(values) if values else None

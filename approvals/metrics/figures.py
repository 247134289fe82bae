"""The dashboard's figures: each one's definition, in words and as sums of the per-run facts."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.utils.functional import Promise
from django.utils.translation import gettext_lazy as _

from approvals.metrics.facts import MISSING_METADATA
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


@dataclass(frozen=True)
class Rate:
    """A figure that is one sum over another: `numerator` ÷ `denominator`."""

    key: str
    label: Promise
    definition: Promise
    numerator: str
    denominator: str
    higher_is_better: bool = True

    def __call__(self, data: Data) -> Figure:
        value, counts, series = data.rate(self.numerator, self.denominator)
        return Figure(
            self.key,
            self.label,
            self.definition,
            "ratio",
            value,
            counts,
            series,
            higher_is_better=self.higher_is_better,
        )


@dataclass(frozen=True)
class Duration:
    """The median of one kind of duration (`durations`: "recover", "close", "resume",
    "handling" or "latency"), with the `extra` statistics ("mean", "p95") beside it. The sum
    `counted_by`, when given, shows how many durations there are."""

    key: str
    label: Promise
    definition: Promise
    durations: str
    counted_by: str | None = None
    extra: tuple[str, ...] = ()
    unit: str = "seconds"

    def __call__(self, data: Data) -> Figure:
        total = data.total()
        counts = None
        if self.counted_by:
            counted = int(total.get(self.counted_by) or 0)
            counts = (counted, counted)
        column = f"{self.durations}_p50"
        extra = {stat: _round(_num(total.get(f"{self.durations}_{stat}"))) for stat in self.extra}
        return Figure(
            self.key,
            self.label,
            self.definition,
            self.unit,
            _num(total.get(column)),
            counts,
            data.series(lambda r: r.get(column)),
            extra=extra,
            higher_is_better=False,
        )


def tool_failure_rate(data: Data) -> Figure:
    total_failures = data.total().get("tool_failures") or 0
    total_calls = data.total().get("tool_calls") or 0
    by_tool, by_class = _tool_breakdown(data.tools, total_calls)
    return Figure(
        "tool_failure_rate",
        _("Tool failure rate"),
        _(
            "Failed tool attempts ÷ tool attempts, in runs started in the window. A failed "
            "attempt is one the engine routed as a failure (retry scheduled, waiting for the tool, "
            "escalated, failed, or outcome unknown), with its failure class; attempts are the "
            "steps' attempt counts. Broken down by tool and by class."
        ),
        "ratio",
        ratio(total_failures, total_calls),
        (int(total_failures), int(total_calls)),
        data.series(lambda r: ratio(r["tool_failures"], r["tool_calls"])),
        extra={"by_tool": by_tool, "by_class": by_class},
        higher_is_better=False,
    )


def _tool_breakdown(tools: list[dict], total_calls: int) -> tuple[list[dict], dict[str, dict]]:
    """Failures by tool (worst rate first, each by class) and by class over every tool. `tools`
    holds each tool's attempts (class "") and its failures by class."""
    failures = {(r["tool"], r["failure_class"]): r["n"] for r in tools if r["failure_class"]}
    calls = {r["tool"]: r["n"] for r in tools if r["failure_class"] == ""}
    by_tool = []
    for tool in sorted(calls):
        tool_failures = {cls: n for (t, cls), n in failures.items() if t == tool}
        failed = sum(tool_failures.values())
        row = {"tool": tool, "calls": int(calls[tool]), "failures": int(failed)}
        row["rate"] = _round(ratio(failed, calls[tool]))
        row["by_class"] = {cls: _share(n, calls[tool]) for cls, n in sorted(tool_failures.items())}
        by_tool.append(row)
    by_tool.sort(key=lambda row: (-(row["rate"] or 0), row["tool"]))
    overall: dict[str, int] = {}
    for (_tool, cls), n in failures.items():
        overall[cls] = overall.get(cls, 0) + int(n)
    return by_tool, {cls: _share(n, total_calls) for cls, n in sorted(overall.items())}


def _share(failures, calls) -> dict:
    return {"failures": int(failures), "rate": _round(ratio(failures, calls))}


def takeovers_per_100_runs(data: Data) -> Figure:
    total = data.total()
    runs = total.get("runs") or 0
    takeovers = total.get("takeovers") or 0
    return Figure(
        "takeovers_per_100_runs",
        _("Takeovers per 100 runs"),
        _(
            "Explicit takeovers (a person clicked “Take over”) of runs started in the window, "
            "per 100 of those runs."
        ),
        "per100",
        ratio(takeovers * 100, runs),
        (int(takeovers), int(runs)),
        data.series(lambda r: ratio(r["takeovers"] * 100, r["runs"])),
        higher_is_better=False,
    )


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


# Why a resume went to a person for want of metadata, and the column counting each cause.
MISSING_METADATA_COLUMNS = {str(cause.value): col for cause, col in MISSING_METADATA.items()}


def _total_of(row: dict, columns) -> int:
    return sum(int(row.get(column) or 0) for column in columns)


def recovery_failed_missing_metadata(data: Data) -> Figure:
    total = data.total()
    columns = MISSING_METADATA_COLUMNS.values()
    by_cause = {cause: int(total.get(col) or 0) for cause, col in MISSING_METADATA_COLUMNS.items()}
    return Figure(
        "recovery_failed_missing_metadata",
        _("Recoveries stopped by missing metadata"),
        _(
            "Times the engine could not resume a run by itself because something it needs to "
            "resume was gone, and handed the run to a person: the workflow version is no longer "
            "registered, the recorded step is no longer in the workflow, or the run was waiting "
            "with nothing to wait for. Counted from the run.needs_human timeline events that "
            "name the cause, in runs started in the window; broken down by cause."
        ),
        "count",
        float(sum(by_cause.values())),
        None,
        data.series(lambda r: _total_of(r, columns)),
        extra={"total": sum(by_cause.values()), "by_cause": by_cause},
        higher_is_better=False,
    )


def takeover_handling_time(data: Data) -> Figure:
    figure = Duration(
        "takeover_handling_time",
        label=_("Takeover handling time (median)"),
        definition=_(
            "For each ended takeover of a run started in the window: from the person taking the "
            "run over to them releasing it (or to the cancel or rejection that ended it). Median; "
            "p90 beside it. The actions are the human decisions recorded during the takeover, "
            "its own take over and release aside."
        ),
        durations="takeover",
        counted_by="takeovers_ended",
        extra=("p90", "mean"),
    )(data)
    total = data.total()
    count = int(total.get("takeovers_ended") or 0)
    actions = int(total.get("takeover_actions") or 0)
    figure.extra.update(
        {
            "median": _round(figure.value),
            "count": count,
            "actions": actions,
            "actions_per_takeover": _round(ratio(actions, count)),
        }
    )
    return figure


def takeovers_needing_engineer(data: Data) -> Figure:
    figure = Rate(
        "takeovers_needing_engineer",
        label=_("Takeovers that needed an engineer"),
        definition=_(
            "Of the takeovers released in runs started in the window, the share whose person "
            "answered yes to “Did this need an engineer?” when releasing the run. Takeovers "
            "ended by a cancel or a rejection are not asked and not counted."
        ),
        numerator="takeovers_needing_engineer",
        denominator="takeovers_answered",
        higher_is_better=False,
    )(data)
    needing, released = figure.counts or (0, 0)
    figure.extra = {"count": needing, "released": released, "share": _round(figure.value)}
    return figure


def duplicates_after_resume(data: Data) -> Figure:
    total = data.total()
    resumes = int(total.get("resumes") or 0)
    with_duplicate = int(total.get("resumes_with_duplicate") or 0)
    duplicates = int(total.get("duplicates_after_resume") or 0)
    return Figure(
        "duplicates_after_resume",
        _("Duplicate side effects after a resume"),
        _(
            "For every resume of a run started in the window (a wait resolved or a person put it "
            "back to work, a person released it to the engine, or a crashed worker's step was "
            "taken back): the side effects duplicated after it, i.e. a step's second or later "
            "committed idempotency key, sent after that resume and before the next. The value "
            "is the duplicates; beside it, the resumes followed by at least one, of all resumes."
        ),
        "count",
        float(duplicates),
        (with_duplicate, resumes),
        data.series(lambda r: r.get("duplicates_after_resume") or 0),
        extra={
            "resumes": resumes,
            "resumes_with_duplicate": with_duplicate,
            "duplicates": duplicates,
        },
        higher_is_better=False,
    )


# Every figure of the dashboard, in this order.
FIGURES: list[Callable[[Data], Figure]] = [
    Rate(
        "execution_success_rate",
        label=_("Execution success rate"),
        definition=_(
            "Runs started in the window that ended succeeded, out of those that have ended "
            "(succeeded, failed, cancelled or compensated). Runs still open are not counted."
        ),
        numerator="succeeded",
        denominator="finished",
    ),
    tool_failure_rate,
    Rate(
        "auto_recovery_rate",
        label=_("Auto-recovery rate"),
        definition=_(
            "Of the ended runs that hit at least one tool failure, the share that succeeded with "
            "no person stepping in: never escalated, never taken over, and no human decision "
            "other than an approval."
        ),
        numerator="auto_recovered",
        denominator="faulted_finished",
    ),
    Rate(
        "local_recovery_rate",
        label=_("Local-recovery success rate"),
        definition=_(
            "Of the steps that had at least one tool failure, the share that then finished done "
            "(succeeded or degraded to the fallback) at that same step with no human decision on "
            "the step: resumed in place, not re-run, no person needed. Steps still open count "
            "as not recovered yet."
        ),
        numerator="recovered_locally",
        denominator="failed_steps",
    ),
    Rate(
        "human_takeover_rate",
        label=_("Human takeover rate"),
        definition=_(
            "Runs in which a person stepped in to recover, out of all runs started in the "
            "window: the run was taken over, or someone settled it (confirmed an outcome, retried, "
            "fixed data, skipped, did it by hand, cancelled). Approval decisions alone do not "
            "count."
        ),
        numerator="human_stepped_in",
        denominator="runs",
        higher_is_better=False,
    ),
    takeovers_per_100_runs,
    Duration(
        "time_to_recover_median",
        label=_("Time to recover (median)"),
        definition=_(
            "For each step with a tool failure that later finished done: from its first failed "
            "attempt to the step finishing (by the engine or a person). Median; the mean is shown "
            "beside it."
        ),
        durations="recover",
        counted_by="recovered",
        extra=("mean",),
    ),
    Duration(
        "time_to_close_median",
        label=_("Time to close after a failure (median)"),
        definition=_(
            "For each ended run that hit a tool failure: from its first failed tool attempt to "
            "the run ending, whatever the ending. Median; the mean is shown beside it."
        ),
        durations="close",
        counted_by="closed_after_failure",
        extra=("mean",),
    ),
    Duration(
        "pause_to_resume_median",
        label=_("Pause-to-resume time (median)"),
        definition=_(
            "For every wait that was resolved (timer fired, event delivered, approval decided, "
            "tool back): from the wait being created to it being resolved. Median."
        ),
        durations="resume",
    ),
    Rate(
        "duplicate_side_effect_rate",
        label=_("Duplicate side-effect rate"),
        definition=_(
            "Side-effect steps whose effect was committed under more than one idempotency key "
            "(the outside world saw it twice), out of side-effect steps with a committed effect. "
            "Inferred from TaskPilots' own ledger; a duplicate the ledger never learned of cannot "
            "be seen here."
        ),
        numerator="steps_duplicated",
        denominator="steps_committed",
        higher_is_better=False,
    ),
    Rate(
        "wrong_retry_rate",
        label=_("Wrong-retry rate"),
        definition=_(
            "Of the side-effect steps that were sent again (the outcome was judged not committed, "
            "the tool was re-called with the same key, or a new key was issued), the share whose "
            "earlier attempt had in fact landed: a reconcile by key later found it committed, a "
            "person confirmed it happened after the resend, or the step ended with two committed "
            "keys."
        ),
        numerator="wrong_retries",
        denominator="steps_resent",
        higher_is_better=False,
    ),
    Rate(
        "snapshot_coverage",
        label=_("Snapshot coverage"),
        definition=_(
            "Committed side effects whose snapshot was written before the commit "
            "(snapshot created_at ≤ side effect committed_at), out of all committed side effects."
        ),
        numerator="covered",
        denominator="committed",
    ),
    missing_field_rate,
    Duration(
        "snapshot_latency_p50",
        label=_("Snapshot-to-side-effect latency (p50)"),
        definition=_(
            "For committed side effects with a snapshot before them: snapshot created_at → side "
            "effect committed_at, in milliseconds. p50; p95 beside it. Includes the tool call "
            "and, for reconciled or human-confirmed effects, the time to confirm."
        ),
        durations="latency",
        extra=("p95",),
        unit="ms",
    ),
    Rate(
        "waits_timed_out",
        label=_("Waits that timed out undecided"),
        definition=_(
            "Waits (events, timers, approvals, tool recoveries) that reached their deadline with "
            "nothing resolving them, out of waits that have ended (resolved or timed out)."
        ),
        numerator="expired",
        denominator="settled",
        higher_is_better=False,
    ),
    Duration(
        "approval_handling_median",
        label=_("Approval handling time (median)"),
        definition=_(
            "For decided approval requests: from the request to the decision. Median; the mean "
            "is shown beside it."
        ),
        durations="handling",
        counted_by="decided",
        extra=("mean",),
    ),
    Rate(
        "second_intervention_rate",
        label=_("Takeovers needing a second intervention"),
        definition=_(
            "Of the runs that were taken over, the share that needed a person again: taken over "
            "twice or more, or a human decision made after the run was released."
        ),
        numerator="second_intervention",
        denominator="runs_taken_over",
        higher_is_better=False,
    ),
    recovery_failed_missing_metadata,
    takeover_handling_time,
    takeovers_needing_engineer,
    duplicates_after_resume,
]

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
    "external_mismatches": _(
        "Committed side effects that their system, asked by key, shows missing or different "
        "(the consistency check; open until a later check finds them agreeing)."
    ),
}
INCONSISTENCY_LABELS = {
    "running_without_step": _("Running, no step"),
    "expired_leases": _("Expired leases"),
    "intended_too_long": _("Intents never settled"),
    "waiting_without_wait": _("Waiting on nothing"),
    "external_mismatches": _("Missing or different externally"),
}


def median(values):  # used by tests and docs to state the hand-computed answers
    return statistics.median(values) if values else None

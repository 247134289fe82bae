"""Recovery metrics: is recovery getting better? Definitions and the queries behind them.

Every windowed figure describes the *cohort* of runs started in the window (`Run.created_at` in
[start, end)), whatever happened to them later; its trend buckets those runs by the hour or day
they started. The cohort is read through `run_created_idx`, and every other table is joined to
it by run id, so the dashboard costs a fixed number of aggregate queries (see QUERIES) whatever
the amount of data. State-inconsistency alerts and the "needs a person" gauge describe *now*.

A **tool failure** is one failed tool attempt as the engine routed it: a timeline event
`step.retry_scheduled`, `step.waiting_for_tool`, `step.failed`, `step.escalated` (with the
failure class the escalation rule saw, `data.routing.failure_class`) or `step.unknown_outcome`
(class `unknown_outcome`), on a step that calls a tool. Wait and approval deadlines (class
`timeout`) and human actions are not tool failures.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db import connection, transaction
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from approvals.models import ApprovalRequest, HumanDecision, Takeover
from runs.models import SNAPSHOT_FIELDS, Run, SideEffect, Snapshot, Step, TimelineEvent, Wait

# A run, step or side effect stuck this long in a state that should not last is an alert.
STALE_MINUTES = 10
WINDOWS = {"24h": timedelta(hours=24), "7d": timedelta(days=7), "30d": timedelta(days=30)}
DEFAULT_WINDOW = "7d"
MAX_CUSTOM_DAYS = 366
# Verbs whose event records one failed tool attempt (see the module docstring).
FAILURE_VERBS = (
    "step.retry_scheduled",
    "step.waiting_for_tool",
    "step.failed",
    "step.escalated",
    "step.unknown_outcome",
)
RESEND_VERBS = ("side_effect.not_committed", "side_effect.resend_with_same_key")
TERMINAL = tuple(sorted(Run.TERMINAL))

T = {
    "run": Run._meta.db_table,
    "step": Step._meta.db_table,
    "event": TimelineEvent._meta.db_table,
    "effect": SideEffect._meta.db_table,
    "snapshot": Snapshot._meta.db_table,
    "wait": Wait._meta.db_table,
    "approval": ApprovalRequest._meta.db_table,
    "takeover": Takeover._meta.db_table,
    "decision": HumanDecision._meta.db_table,
}


# --------------------------------------------------------------------------------------------
# The window


class BadWindow(ValueError):
    pass


@dataclass(frozen=True)
class Window:
    key: str
    start: datetime
    end: datetime

    @property
    def bucket(self) -> str:
        return "hour" if self.end - self.start <= timedelta(hours=48) else "day"

    def buckets(self) -> list[datetime]:
        """Every bucket's start (naive, in the current time zone), oldest first."""
        tz = timezone.get_current_timezone()
        step = timedelta(hours=1) if self.bucket == "hour" else timedelta(days=1)
        first = timezone.localtime(self.start, tz).replace(minute=0, second=0, microsecond=0)
        if self.bucket == "day":
            first = first.replace(hour=0)
        last = timezone.localtime(self.end - timedelta(microseconds=1), tz)
        out, at = [], first.replace(tzinfo=None)
        while at <= last.replace(tzinfo=None):
            out.append(at)
            at += step
        return out


def parse_window(params, *, now: datetime | None = None) -> Window:
    """`window=24h|7d|30d`, or `window=custom&start=YYYY-MM-DD&end=YYYY-MM-DD` (end inclusive)."""
    now = now or timezone.now()
    key = params.get("window") or DEFAULT_WINDOW
    if key in WINDOWS:
        return Window(key, now - WINDOWS[key], now)
    if key != "custom":
        raise BadWindow(_("Choose a window of 24h, 7d, 30d or custom."))
    try:
        start_day = datetime.strptime(params.get("start", ""), "%Y-%m-%d")
        end_day = datetime.strptime(params.get("end", ""), "%Y-%m-%d")
    except ValueError:
        raise BadWindow(_("A custom window needs a start and an end date (YYYY-MM-DD).")) from None
    if end_day < start_day:
        raise BadWindow(_("The end date is before the start date."))
    if (end_day - start_day).days > MAX_CUSTOM_DAYS:
        raise BadWindow(_("A custom window can span at most a year."))
    tz = timezone.get_current_timezone()
    start = timezone.make_aware(start_day, tz)
    end = timezone.make_aware(end_day + timedelta(days=1), tz)
    return Window("custom", start, end)


# --------------------------------------------------------------------------------------------
# Queries. Each returns {bucket or None (the whole window): row}; figures read them.

_COHORT = f"""
cohort AS (
  SELECT r.id, r.status, r.created_at, r.finished_at, r.failure_count, r.escalation_level,
         date_trunc(%(bucket)s, r.created_at AT TIME ZONE %(tz)s) AS bucket
  FROM {T["run"]} r
  WHERE r.created_at >= %(start)s AND r.created_at < %(end)s
)"""
# Joins from the timeline go to the run table itself (a primary-key lookup per event), not to
# the cohort CTE: PostgreSQL cannot estimate the JSON-key joins and would otherwise pick a
# nested loop over the whole cohort for each event.
_IN_WINDOW = "c.created_at >= %(start)s AND c.created_at < %(end)s"
_BUCKET = "date_trunc(%(bucket)s, c.created_at AT TIME ZONE %(tz)s)"
_FAILURE_CLASS = (
    "CASE WHEN e.verb = 'step.unknown_outcome' THEN 'unknown_outcome' "
    "ELSE e.data #>> '{routing,failure_class}' END"
)
# One row per tool failure of a cohort run, with its step and tool. `e.at >= start` is implied
# by the cohort (events follow the run's creation) and lets PostgreSQL use timeline_verb_idx.
_FAILURES = f"""
failures AS (
  SELECT e.run_id, s.id AS step_id, s.tool, {_FAILURE_CLASS} AS failure_class, e.at,
         {_BUCKET} AS bucket
  FROM {T["event"]} e
  JOIN {T["run"]} c ON c.id = e.run_id AND {_IN_WINDOW}
  JOIN {T["step"]} s ON s.run_id = e.run_id AND s.name = e.data ->> 'step'
       AND s.iteration = COALESCE((e.data ->> 'iteration')::int, 0)
  WHERE e.verb = ANY(%(failure_verbs)s) AND e.at >= %(start)s AND s.tool <> ''
    AND COALESCE({_FAILURE_CLASS}, 'timeout') <> 'timeout'
)"""


def _epoch(expr: str) -> str:
    return f"EXTRACT(EPOCH FROM ({expr}))"


def _median(expr: str, where: str) -> str:
    return f"percentile_cont(0.5) WITHIN GROUP (ORDER BY {expr}) FILTER (WHERE {where})"


QUERIES: dict[str, str] = {}

QUERIES["runs"] = f"""
WITH {_COHORT},
first_failure AS (
  SELECT e.run_id, min(e.at) AS at
  FROM {T["event"]} e JOIN {T["run"]} c ON c.id = e.run_id AND {_IN_WINDOW}
  WHERE e.verb = ANY(%(failure_verbs)s) AND e.at >= %(start)s
    AND COALESCE({_FAILURE_CLASS}, 'timeout') <> 'timeout'
  GROUP BY e.run_id
),
humans AS (
  SELECT d.run_id, count(*) FILTER (WHERE d.approval_id IS NULL) AS recovery_decisions
  FROM {T["decision"]} d JOIN cohort c ON c.id = d.run_id GROUP BY d.run_id
),
takeovers AS (
  SELECT t.run_id, count(*) AS n FROM {T["takeover"]} t JOIN cohort c ON c.id = t.run_id
  GROUP BY t.run_id
),
after_release AS (
  SELECT DISTINCT d.run_id FROM {T["decision"]} d JOIN cohort c ON c.id = d.run_id
  WHERE d.verb <> 'release' AND EXISTS (
    SELECT 1 FROM {T["decision"]} r
    WHERE r.run_id = d.run_id AND r.verb = 'release' AND r.created_at < d.created_at)
)
SELECT c.bucket,
  count(*) AS runs,
  count(*) FILTER (WHERE c.status = ANY(%(terminal)s)) AS finished,
  count(*) FILTER (WHERE c.status = 'succeeded') AS succeeded,
  count(*) FILTER (WHERE c.failure_count > 0 AND c.status = ANY(%(terminal)s)) AS faulted_finished,
  count(*) FILTER (WHERE c.failure_count > 0 AND c.status = 'succeeded'
                   AND c.escalation_level = 0 AND COALESCE(h.recovery_decisions, 0) = 0
                   AND t.n IS NULL) AS auto_recovered,
  count(*) FILTER (WHERE COALESCE(h.recovery_decisions, 0) > 0 OR t.n IS NOT NULL)
    AS human_stepped_in,
  COALESCE(sum(t.n), 0) AS takeovers,
  count(*) FILTER (WHERE t.n IS NOT NULL) AS runs_taken_over,
  count(*) FILTER (WHERE t.n >= 2 OR (t.n IS NOT NULL AND ar.run_id IS NOT NULL))
    AS second_intervention,
  count(*) FILTER (WHERE f.at IS NOT NULL AND c.status = ANY(%(terminal)s)) AS closed_after_failure,
  avg({_epoch("c.finished_at - f.at")})
    FILTER (WHERE f.at IS NOT NULL AND c.status = ANY(%(terminal)s)) AS close_mean_s,
  {_median(_epoch("c.finished_at - f.at"), "f.at IS NOT NULL AND c.status = ANY(%(terminal)s)")}
    AS close_median_s
FROM cohort c
LEFT JOIN first_failure f ON f.run_id = c.id
LEFT JOIN humans h ON h.run_id = c.id
LEFT JOIN takeovers t ON t.run_id = c.id
LEFT JOIN after_release ar ON ar.run_id = c.id
GROUP BY GROUPING SETS ((c.bucket), ())
"""

QUERIES["steps"] = f"""
WITH {_COHORT}, {_FAILURES},
failed_steps AS (
  SELECT step_id, min(at) AS first_at, min(bucket) AS bucket FROM failures GROUP BY step_id
)
SELECT fs.bucket,
  count(*) AS failed_steps,
  count(*) FILTER (WHERE s.status IN ('succeeded', 'degraded')) AS recovered,
  count(*) FILTER (WHERE s.status IN ('succeeded', 'degraded') AND NOT EXISTS (
    SELECT 1 FROM {T["decision"]} d WHERE d.step_id = s.id)) AS recovered_locally,
  avg({_epoch("s.finished_at - fs.first_at")})
    FILTER (WHERE s.status IN ('succeeded', 'degraded')) AS recover_mean_s,
  {_median(_epoch("s.finished_at - fs.first_at"), "s.status IN ('succeeded', 'degraded')")}
    AS recover_median_s
FROM failed_steps fs JOIN {T["step"]} s ON s.id = fs.step_id
GROUP BY GROUPING SETS ((fs.bucket), ())
"""

# kind 'failures': per (tool, class) and per bucket; kind 'calls': tool attempts, same groupings.
QUERIES["tools"] = f"""
WITH {_COHORT}, {_FAILURES}
SELECT 'failures' AS kind, bucket, tool, failure_class, count(*) AS n FROM failures
GROUP BY GROUPING SETS ((tool, failure_class), (bucket), ())
UNION ALL
SELECT 'calls', c.bucket, s.tool, NULL, sum(s.attempts)
FROM {T["step"]} s JOIN cohort c ON c.id = s.run_id
WHERE s.tool <> '' AND s.attempts > 0
GROUP BY GROUPING SETS ((s.tool), (c.bucket), ())
"""

QUERIES["effects"] = f"""
WITH {_COHORT},
effects AS (
  SELECT e.step_id, e.status, e.idempotency_key, c.bucket
  FROM {T["effect"]} e JOIN cohort c ON c.id = e.run_id
),
resends AS (
  SELECT ef.step_id, min(ev.at) AS first_at
  FROM {T["event"]} ev
  JOIN {T["effect"]} ef ON ef.idempotency_key = ev.data ->> 'key'
  JOIN {T["run"]} c ON c.id = ef.run_id AND {_IN_WINDOW}
  WHERE ev.verb = ANY(%(resend_verbs)s) AND ev.at >= %(start)s
  GROUP BY ef.step_id
),
reconciled_after_resend AS (
  SELECT DISTINCT ef.step_id
  FROM {T["event"]} ev
  JOIN {T["effect"]} ef ON ef.idempotency_key = ev.data ->> 'key'
  JOIN resends r ON r.step_id = ef.step_id
  WHERE ev.verb = 'side_effect.committed' AND ev.data ->> 'confirmed_by' = 'reconcile'
    AND ev.at >= %(start)s AND ev.at > r.first_at
),
per_step AS (
  SELECT step_id, min(bucket) AS bucket, count(*) AS keys,
         count(*) FILTER (WHERE status IN ('committed', 'compensated')) AS committed_keys
  FROM effects GROUP BY step_id
)
SELECT p.bucket,
  count(*) FILTER (WHERE p.committed_keys >= 1) AS steps_committed,
  count(*) FILTER (WHERE p.committed_keys >= 2) AS steps_duplicated,
  count(*) FILTER (WHERE r.step_id IS NOT NULL OR p.keys >= 2) AS steps_resent,
  count(*) FILTER (WHERE (r.step_id IS NOT NULL OR p.keys >= 2) AND (
      p.committed_keys >= 2 OR ra.step_id IS NOT NULL OR EXISTS (
        SELECT 1 FROM {T["decision"]} d WHERE d.step_id = p.step_id
        AND d.verb = 'confirm_happened' AND d.created_at > r.first_at))) AS wrong_retries
FROM per_step p
LEFT JOIN resends r ON r.step_id = p.step_id
LEFT JOIN reconciled_after_resend ra ON ra.step_id = p.step_id
GROUP BY GROUPING SETS ((p.bucket), ())
"""

_LATENCY_MS = _epoch("e.committed_at - sn.created_at") + " * 1000"
QUERIES["coverage"] = f"""
WITH {_COHORT}
SELECT c.bucket,
  count(*) AS committed,
  count(*) FILTER (WHERE sn.created_at <= e.committed_at) AS covered,
  {_median(_LATENCY_MS, "sn.created_at <= e.committed_at")} AS latency_p50_ms,
  percentile_cont(0.95) WITHIN GROUP (ORDER BY {_LATENCY_MS})
    FILTER (WHERE sn.created_at <= e.committed_at) AS latency_p95_ms
FROM {T["effect"]} e JOIN cohort c ON c.id = e.run_id
JOIN {T["snapshot"]} sn ON sn.id = e.snapshot_id
WHERE e.committed_at IS NOT NULL
GROUP BY GROUPING SETS ((c.bucket), ())
"""

QUERIES["snapshots"] = f"""
WITH {_COHORT}
SELECT c.bucket, count(*) AS snapshots,
  COALESCE(sum(jsonb_array_length(sn.missing_fields)), 0) AS missing
FROM {T["snapshot"]} sn JOIN cohort c ON c.id = sn.run_id
GROUP BY GROUPING SETS ((c.bucket), ())
"""

QUERIES["waits"] = f"""
WITH {_COHORT}
SELECT c.bucket,
  count(*) FILTER (WHERE w.status IN ('resolved', 'expired')) AS settled,
  count(*) FILTER (WHERE w.status = 'expired') AS expired,
  {_median(_epoch("w.resolved_at - w.created_at"), "w.status = 'resolved'")} AS resume_median_s
FROM {T["wait"]} w JOIN cohort c ON c.id = w.run_id
GROUP BY GROUPING SETS ((c.bucket), ())
"""

QUERIES["approvals"] = f"""
WITH {_COHORT}
SELECT c.bucket,
  count(*) FILTER (WHERE a.status = 'decided') AS decided,
  avg({_epoch("a.decided_at - a.created_at")}) FILTER (WHERE a.status = 'decided')
    AS handling_mean_s,
  {_median(_epoch("a.decided_at - a.created_at"), "a.status = 'decided'")} AS handling_median_s
FROM {T["approval"]} a JOIN cohort c ON c.id = a.run_id
GROUP BY GROUPING SETS ((c.bucket), ())
"""

# Now, not windowed. Each count reads a partial or status index.
QUERIES["now"] = f"""
SELECT
  (SELECT count(*) FROM {T["run"]} r WHERE r.status = 'running' AND r.updated_at < %(stale)s
     AND NOT EXISTS (SELECT 1 FROM {T["step"]} s WHERE s.run_id = r.id
                     AND s.status <> ALL(%(finished_steps)s))) AS running_without_step,
  (SELECT count(*) FROM {T["step"]} s WHERE s.status = 'running'
     AND s.lease_expires_at < %(stale)s) AS expired_leases,
  (SELECT count(*) FROM {T["effect"]} e WHERE e.status = 'intended'
     AND e.updated_at < %(stale)s AND e.attempted_at < %(stale)s) AS intended_too_long,
  (SELECT count(*) FROM {T["run"]} r WHERE r.status = 'waiting'
     AND NOT EXISTS (SELECT 1 FROM {T["wait"]} w WHERE w.run_id = r.id
                     AND w.status = 'pending')) AS waiting_without_wait,
  (SELECT count(*) FROM {T["run"]} r WHERE r.status IN ('needs_human', 'taken_over'))
    AS needing_human
"""


def _run(name: str, params: dict) -> list[dict]:
    with connection.cursor() as cursor:
        cursor.execute(QUERIES[name], params)
        columns = [c.name for c in cursor.description]
        return [
            {name: _plain(value) for name, value in zip(columns, row, strict=True)}
            for row in cursor.fetchall()
        ]


@contextmanager
def _no_jit():
    """PostgreSQL JIT-compiles plans this size (cost > jit_above_cost) and spends ~1 s per query
    doing it, to save milliseconds: switch it off for these reads only."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL jit = off")
        yield


def _plain(value):
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    return value


def _by_bucket(rows: list[dict]) -> dict[Any, dict]:
    return {row["bucket"]: row for row in rows}


def _params(window: Window, now: datetime) -> dict:
    return {
        "start": window.start,
        "end": window.end,
        "bucket": window.bucket,
        "tz": timezone.get_current_timezone_name(),
        "terminal": list(TERMINAL),
        "failure_verbs": list(FAILURE_VERBS),
        "resend_verbs": list(RESEND_VERBS),
    }


def now_params(now: datetime) -> dict:
    return {
        "stale": now - timedelta(minutes=STALE_MINUTES),
        "finished_steps": sorted(Step.FINISHED),
    }


# --------------------------------------------------------------------------------------------
# Figures


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
    window: Window
    buckets: list[datetime]
    rows: dict[str, dict[Any, dict]]

    def total(self, query: str) -> dict:
        return self.rows[query].get(None) or {}

    def series(self, query: str, fn: Callable[[dict], Any]) -> list[float | None]:
        by_bucket = self.rows[query]
        out = []
        for bucket in self.buckets:
            row = by_bucket.get(bucket)
            out.append(_num(fn(row)) if row else None)
        return out

    def rate(self, query, num, den, **kw) -> tuple[float | None, tuple, list]:
        total = self.total(query)
        n, d = total.get(num) or 0, total.get(den) or 0
        return (
            ratio(n, d),
            (int(n), int(d)),
            self.series(query, lambda r: ratio(r[num], r[den])),
        )


FIGURES: list[Callable[[Data], Figure]] = []


def figure(fn: Callable[[Data], Figure]) -> Callable[[Data], Figure]:
    FIGURES.append(fn)
    return fn


def _rate_figure(data, key, label, definition, query, num, den, *, better=True) -> Figure:
    value, counts, series = data.rate(query, num, den)
    return Figure(key, label, definition, "ratio", value, counts, series, higher_is_better=better)


@figure
def execution_success_rate(data: Data) -> Figure:
    return _rate_figure(
        data,
        "execution_success_rate",
        _("Execution success rate"),
        _("Runs started in the window that ended succeeded, out of those that have ended "
          "(succeeded, failed, cancelled or compensated). Runs still open are not counted."),
        "runs", "succeeded", "finished",
    )  # fmt: skip


@figure
def tool_failure_rate(data: Data) -> Figure:
    rows = data.rows["tools"]
    failures = {(r["tool"], r["failure_class"]): r["n"] for r in rows["failures"] if r["tool"]}
    calls = {r["tool"]: r["n"] for r in rows["calls"] if r["tool"]}
    total_failures = (rows["failures_total"] or {}).get("n") or 0
    total_calls = (rows["calls_total"] or {}).get("n") or 0
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
    series = []
    for bucket in data.buckets:
        f = rows["failures_by_bucket"].get(bucket, 0)
        c = rows["calls_by_bucket"].get(bucket, 0)
        series.append(_num(ratio(f, c)) if c else None)
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
        "runs", "auto_recovered", "faulted_finished",
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
        "steps", "recovered_locally", "failed_steps",
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
        "runs", "human_stepped_in", "runs", better=False,
    )  # fmt: skip


@figure
def takeovers_per_100_runs(data: Data) -> Figure:
    total = data.total("runs")
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
        data.series("runs", lambda r: ratio(r["takeovers"] * 100, r["runs"])),
        higher_is_better=False,
    )  # fmt: skip


def _duration_figure(data, key, label, definition, query, column, counts_col=None) -> Figure:
    total = data.total(query)
    counts = None
    if counts_col:
        counts = (int(total.get(counts_col) or 0), int(total.get(counts_col) or 0))
    return Figure(
        key,
        label,
        definition,
        "ms" if column.endswith("_ms") else "seconds",
        _num(total.get(column)),
        counts,
        data.series(query, lambda r: r[column]),
        higher_is_better=False,
    )


@figure
def time_to_recover(data: Data) -> Figure:
    fig = _duration_figure(
        data, "time_to_recover_median", _("Time to recover (median)"),
        _("For each step with a tool failure that later finished done: from its first failed "
          "attempt to the step finishing (by the engine or a person). Median; the mean is shown "
          "beside it."),
        "steps", "recover_median_s", "recovered",
    )  # fmt: skip
    fig.extra["mean"] = _round(_num(data.total("steps").get("recover_mean_s")))
    return fig


@figure
def time_to_close(data: Data) -> Figure:
    fig = _duration_figure(
        data, "time_to_close_median", _("Time to close after a failure (median)"),
        _("For each ended run that hit a tool failure: from its first failed tool attempt to "
          "the run ending, whatever the ending. Median; the mean is shown beside it."),
        "runs", "close_median_s", "closed_after_failure",
    )  # fmt: skip
    fig.extra["mean"] = _round(_num(data.total("runs").get("close_mean_s")))
    return fig


@figure
def pause_to_resume(data: Data) -> Figure:
    return _duration_figure(
        data, "pause_to_resume_median", _("Pause-to-resume time (median)"),
        _("For every wait that was resolved (timer fired, event delivered, approval decided, "
          "tool back): from the wait being created to it being resolved. Median."),
        "waits", "resume_median_s",
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
        "effects", "steps_duplicated", "steps_committed", better=False,
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
        "effects", "wrong_retries", "steps_resent", better=False,
    )  # fmt: skip


@figure
def snapshot_coverage(data: Data) -> Figure:
    return _rate_figure(
        data,
        "snapshot_coverage",
        _("Snapshot coverage"),
        _("Committed side effects whose snapshot was written before the commit "
          "(snapshot created_at ≤ side effect committed_at), out of all committed side effects."),
        "coverage", "covered", "committed",
    )  # fmt: skip


@figure
def missing_field_rate(data: Data) -> Figure:
    total = data.total("snapshots")
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
        data.series("snapshots", lambda r: ratio(r["missing"], r["snapshots"] * width)),
        higher_is_better=False,
    )


@figure
def snapshot_latency(data: Data) -> Figure:
    fig = _duration_figure(
        data, "snapshot_latency_p50", _("Snapshot-to-side-effect latency (p50)"),
        _("For committed side effects with a snapshot before them: snapshot created_at → side "
          "effect committed_at, in milliseconds. p50; p95 beside it. Includes the tool call "
          "and, for reconciled or human-confirmed effects, the time to confirm."),
        "coverage", "latency_p50_ms",
    )  # fmt: skip
    fig.extra["p95"] = _round(_num(data.total("coverage").get("latency_p95_ms")))
    return fig


@figure
def waits_timed_out(data: Data) -> Figure:
    return _rate_figure(
        data,
        "waits_timed_out",
        _("Waits that timed out undecided"),
        _("Waits (events, timers, approvals, tool recoveries) that reached their deadline with "
          "nothing resolving them, out of waits that have ended (resolved or timed out)."),
        "waits", "expired", "settled", better=False,
    )  # fmt: skip


@figure
def approval_handling_time(data: Data) -> Figure:
    fig = _duration_figure(
        data, "approval_handling_median", _("Approval handling time (median)"),
        _("For decided approval requests: from the request to the decision. Median; the mean "
          "is shown beside it."),
        "approvals", "handling_median_s", "decided",
    )  # fmt: skip
    fig.extra["mean"] = _round(_num(data.total("approvals").get("handling_mean_s")))
    return fig


@figure
def second_interventions(data: Data) -> Figure:
    return _rate_figure(
        data,
        "second_intervention_rate",
        _("Takeovers needing a second intervention"),
        _("Of the runs that were taken over, the share that needed a person again: taken over "
          "twice or more, or a human decision made after the run was released."),
        "runs", "second_intervention", "runs_taken_over", better=False,
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


@dataclass
class Dashboard:
    window: Window
    buckets: list[datetime]
    figures: list[Figure]
    inconsistencies: dict[str, int]
    needing_human: int

    @property
    def inconsistency_total(self) -> int:
        return sum(self.inconsistencies.values())

    def as_json(self) -> dict:
        return {
            "window": {
                "key": self.window.key,
                "start": self.window.start.isoformat(),
                "end": self.window.end.isoformat(),
                "bucket": self.window.bucket,
                "buckets": [b.isoformat() for b in self.buckets],
            },
            "figures": {f.key: f.as_json() for f in self.figures},
            "state_inconsistencies": {
                "total": self.inconsistency_total,
                "stale_minutes": STALE_MINUTES,
                "by_kind": {
                    kind: {"count": n, "definition": str(INCONSISTENCIES[kind] % _minutes())}
                    for kind, n in self.inconsistencies.items()
                },
            },
            "runs_needing_human": self.needing_human,
        }


def _minutes() -> dict:
    return {"minutes": STALE_MINUTES}


def current_state(now: datetime | None = None) -> dict[str, int]:
    """Counts that describe now: inconsistencies and runs needing a person (one query)."""
    row = _run("now", now_params(now or timezone.now()))[0]
    return {k: int(v) for k, v in row.items()}


def compute(window: Window, *, now: datetime | None = None) -> Dashboard:
    """Every figure of the dashboard: nine aggregate queries (and one SET), whatever the size."""
    now = now or timezone.now()
    params = _params(window, now)
    rows: dict[str, Any] = {}
    with _no_jit():
        for name in ("runs", "steps", "effects", "coverage", "snapshots", "waits", "approvals"):
            rows[name] = _by_bucket(_run(name, params))
        tools = _run("tools", params)
        state = current_state(now)
    grouped: dict[str, Any] = {"failures": [], "calls": [], "failures_by_bucket": {},
                               "calls_by_bucket": {}, "failures_total": None,
                               "calls_total": None}  # fmt: skip
    for row in tools:
        kind = row["kind"]
        if row["tool"] is not None:
            grouped[kind].append(row)
        elif row["bucket"] is not None:
            grouped[f"{kind}_by_bucket"][row["bucket"]] = row["n"]
        else:
            grouped[f"{kind}_total"] = row
    rows["tools"] = grouped
    data = Data(window, window.buckets(), rows)
    needing_human = state.pop("needing_human")
    return Dashboard(window, data.buckets, [fn(data) for fn in FIGURES], state, needing_human)


def median(values):  # used by tests and docs to state the hand-computed answers
    return statistics.median(values) if values else None


# --------------------------------------------------------------------------------------------
# Prometheus text format 0.0.4 (/metrics): all-time counters and current gauges.

PROMETHEUS_QUERIES = {
    "runs": f"SELECT workflow, status, count(*) FROM {T['run']} GROUP BY workflow, status",
    "effects": f"""
        SELECT tool, status, count(*), count(*) FILTER (WHERE committed_at IS NOT NULL)
        FROM {T["effect"]} GROUP BY tool, status""",
    "failures": f"""
        SELECT s.tool, {_FAILURE_CLASS} AS failure_class, count(*)
        FROM {T["event"]} e
        JOIN {T["step"]} s ON s.run_id = e.run_id AND s.name = e.data ->> 'step'
             AND s.iteration = COALESCE((e.data ->> 'iteration')::int, 0)
        WHERE e.verb = ANY(%(failure_verbs)s) AND s.tool <> ''
          AND COALESCE({_FAILURE_CLASS}, 'timeout') <> 'timeout'
        GROUP BY 1, 2""",
}


def _label(value: Any) -> str:
    text = str(value)
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _sample(name: str, labels: dict[str, Any], value: float | int) -> str:
    inner = ",".join(f'{key}="{_label(val)}"' for key, val in labels.items())
    return f"{name}{{{inner}}} {value}" if inner else f"{name} {value}"


def prometheus_text(now: datetime | None = None) -> str:
    """Counters of everything that ever happened and gauges of the current state (4 queries).

    Counters only grow: runs are counted once they have ended (a terminal status never
    changes); side effects once committed (compensated ones included) and once compensated.
    Live states are gauges.
    """
    results = {}
    with _no_jit(), connection.cursor() as cursor:
        for name, sql in PROMETHEUS_QUERIES.items():
            cursor.execute(sql, {"failure_verbs": list(FAILURE_VERBS)})
            results[name] = cursor.fetchall()
        state = current_state(now)
    lines: list[str] = []

    def family(name: str, kind: str, help_text: str, samples: list[str]) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(samples)

    family(
        "taskpilots_runs_total", "counter", "Runs that have ended, by workflow and final status.",
        [_sample("taskpilots_runs_total", {"workflow": w, "status": s}, n)
         for w, s, n in sorted(results["runs"]) if s in Run.TERMINAL],
    )  # fmt: skip
    family(
        "taskpilots_runs", "gauge", "Runs not yet ended, by workflow and current status.",
        [_sample("taskpilots_runs", {"workflow": w, "status": s}, n)
         for w, s, n in sorted(results["runs"]) if s not in Run.TERMINAL],
    )  # fmt: skip
    committed: dict[str, int] = {}
    compensated: dict[str, int] = {}
    open_effects = []
    for tool, status, n, ever_committed in sorted(results["effects"]):
        committed[tool] = committed.get(tool, 0) + ever_committed
        if status == "compensated":
            compensated[tool] = n
        if status in ("intended", "unknown"):
            open_effects.append(_sample("taskpilots_side_effects_open",
                                        {"tool": tool, "status": status}, n))  # fmt: skip
    family(
        "taskpilots_side_effects_total", "counter",
        "Side effects committed (status=committed, compensated ones included) and compensated, "
        "by tool.",
        [_sample("taskpilots_side_effects_total", {"tool": t, "status": "committed"}, n)
         for t, n in sorted(committed.items())]
        + [_sample("taskpilots_side_effects_total", {"tool": t, "status": "compensated"}, n)
           for t, n in sorted(compensated.items())],
    )  # fmt: skip
    family(
        "taskpilots_side_effects_open",
        "gauge",
        "Side effects whose outcome is not settled yet (intended or unknown), by tool.",
        open_effects,
    )
    family(
        "taskpilots_step_failures_total", "counter",
        "Failed tool attempts routed by the engine, by tool and failure class.",
        [_sample("taskpilots_step_failures_total", {"tool": t, "class": c}, n)
         for t, c, n in sorted(results["failures"])],
    )  # fmt: skip
    family(
        "taskpilots_runs_needing_human",
        "gauge",
        "Runs waiting for a person (needs a person or taken over).",
        [_sample("taskpilots_runs_needing_human", {}, state["needing_human"])],
    )
    family(
        "taskpilots_state_inconsistencies", "gauge",
        f"State-inconsistency alerts by kind (stale after {STALE_MINUTES} minutes).",
        [_sample("taskpilots_state_inconsistencies", {"kind": kind}, state[kind])
         for kind in INCONSISTENCIES],
    )  # fmt: skip
    return "\n".join(lines) + "\n"

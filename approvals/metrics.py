"""Recovery metrics: is recovery getting better? Definitions and the queries behind them.

Every windowed figure describes the *cohort* of runs started in the window (`Run.created_at` in
[start, end)), whatever happened to them later; its trend buckets those runs by the hour or day
they started. State-inconsistency alerts and the "needs a person" gauge describe *now*.

How it stays fast: FACTS is everything the dashboard counts about one run, as one row. The
rollup stores that row (RunMetrics) once a run has been still for a minute, and sums the rows of
each past day's ended runs (MetricsDay). A window adds up day rows and run rows, and computes
live, by the same SQL, only the runs without a current row. A fixed number of queries, whatever
the amount of data; docs/metrics.md has the figures.

A **tool failure** is one failed tool attempt as the engine routed it: a timeline event
`step.retry_scheduled`, `step.waiting_for_tool`, `step.failed`, `step.escalated` (with the
failure class the escalation rule saw, `data.routing.failure_class`) or `step.unknown_outcome`
(class `unknown_outcome`), on a step that calls a tool. Wait and approval deadlines (class
`timeout`) and human actions are not tool failures.
"""

from __future__ import annotations

import json
import logging
import statistics
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from django.db import connection, transaction
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from approvals.models import (
    SUM_FIELDS,
    TOOL_FIELDS,
    VALUE_FIELDS,
    ApprovalRequest,
    HumanDecision,
    MetricsDay,
    RunMetrics,
    Takeover,
)
from runs.models import SNAPSHOT_FIELDS, Run, SideEffect, Snapshot, Step, TimelineEvent, Wait

logger = logging.getLogger("taskpilots.metrics")

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
    "metrics": RunMetrics._meta.db_table,
    "day": MetricsDay._meta.db_table,
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
# Per-run facts. FACTS works out, for a cohort of runs, one row per run holding everything the
# dashboard counts about it; a window adds those rows up (WINDOW_SQL). An ended run never
# changes again, so rollup() stores its row in RunMetrics a few minutes after it ends, and a
# window reads the stored rows and computes live only the runs without one (still open, or just
# ended). Stored or live, a run's row comes from the same SQL, so the figures are the same.

_FAILURE_CLASS = (
    "CASE WHEN e.verb = 'step.unknown_outcome' THEN 'unknown_outcome' "
    "ELSE e.data #>> '{routing,failure_class}' END"
)
_NOT_TIMEOUT = f"COALESCE({_FAILURE_CLASS}, 'timeout') <> 'timeout'"
_DONE = "s.status IN ('succeeded', 'degraded')"


def _epoch(expr: str) -> str:
    return f"EXTRACT(EPOCH FROM ({expr}))::float8"


# The caller supplies `cohort` (id, status, created_at, finished_at, failure_count,
# escalation_level). Every join starts from it by run id, so the cost follows the cohort's size.
_FACTS_CTES = f"""
events AS MATERIALIZED (
  -- The cohort's events that count, read run by run: the OFFSET keeps the verb test out of the
  -- index scan (a BitmapAnd with timeline_verb_idx reads every such event of every run).
  SELECT e.* FROM cohort c CROSS JOIN LATERAL (
    SELECT e.run_id, e.verb, e.at, e.data FROM {T["event"]} e WHERE e.run_id = c.id OFFSET 0
  ) e
  WHERE e.verb = ANY(%(fact_verbs)s)
),
failures AS (
  SELECT e.run_id, s.id AS step_id, s.tool, {_FAILURE_CLASS} AS failure_class, e.at
  FROM events e
  JOIN {T["step"]} s ON s.run_id = e.run_id AND s.name = e.data ->> 'step'
       AND s.iteration = COALESCE((e.data ->> 'iteration')::int, 0)
  WHERE e.verb = ANY(%(failure_verbs)s) AND s.tool <> '' AND {_NOT_TIMEOUT}
),
first_failure AS (
  SELECT e.run_id, min(e.at) AS at FROM events e
  WHERE e.verb = ANY(%(failure_verbs)s) AND {_NOT_TIMEOUT}
  GROUP BY e.run_id
),
humans AS (
  SELECT d.run_id, count(*) FILTER (WHERE d.approval_id IS NULL) AS recovery_decisions
  FROM cohort c JOIN {T["decision"]} d ON d.run_id = c.id GROUP BY d.run_id
),
takeovers AS (
  SELECT t.run_id, count(*) AS n
  FROM cohort c JOIN {T["takeover"]} t ON t.run_id = c.id GROUP BY t.run_id
),
after_release AS (
  SELECT DISTINCT d.run_id FROM cohort c JOIN {T["decision"]} d ON d.run_id = c.id
  WHERE d.verb <> 'release' AND EXISTS (
    SELECT 1 FROM {T["decision"]} r
    WHERE r.run_id = d.run_id AND r.verb = 'release' AND r.created_at < d.created_at)
),
step_f AS (
  SELECT fs.run_id, count(*) AS failed_steps,
    count(*) FILTER (WHERE {_DONE}) AS recovered_steps,
    count(*) FILTER (WHERE {_DONE} AND NOT EXISTS (
      SELECT 1 FROM {T["decision"]} d WHERE d.step_id = s.id)) AS recovered_locally,
    array_agg({_epoch("s.finished_at - fs.first_at")})
      FILTER (WHERE {_DONE} AND s.finished_at IS NOT NULL) AS recover_s
  FROM (SELECT run_id, step_id, min(at) AS first_at FROM failures GROUP BY run_id, step_id) fs
  JOIN {T["step"]} s ON s.id = fs.step_id
  GROUP BY fs.run_id
),
tool_f AS (
  SELECT x.run_id,
    array_agg(x.tool ORDER BY x.tool, x.failure_class) AS tool_names,
    array_agg(x.failure_class ORDER BY x.tool, x.failure_class) AS tool_classes,
    array_agg(x.n ORDER BY x.tool, x.failure_class) AS tool_counts,
    sum(x.n) FILTER (WHERE x.failure_class = '') AS calls,
    sum(x.n) FILTER (WHERE x.failure_class <> '') AS failures
  FROM (
    SELECT s.run_id, s.tool, ''::text AS failure_class, sum(s.attempts)::int AS n
    FROM cohort c JOIN {T["step"]} s ON s.run_id = c.id
    WHERE s.tool <> '' AND s.attempts > 0
    GROUP BY s.run_id, s.tool
    UNION ALL
    SELECT run_id, tool, failure_class, count(*)::int FROM failures
    GROUP BY run_id, tool, failure_class
  ) x
  GROUP BY x.run_id
),
effects AS (
  SELECT e.run_id, e.step_id, e.status FROM cohort c JOIN {T["effect"]} e ON e.run_id = c.id
),
resend_events AS (
  SELECT ef.step_id, ev.verb, ev.at, ev.data ->> 'confirmed_by' AS confirmed_by
  FROM events ev JOIN {T["effect"]} ef ON ef.idempotency_key = ev.data ->> 'key'
  WHERE ev.verb = ANY(%(resend_verbs)s) OR (ev.verb = 'side_effect.committed'
    AND ev.data ->> 'confirmed_by' = 'reconcile')
),
resends AS (
  SELECT step_id, min(at) AS first_at FROM resend_events
  WHERE verb = ANY(%(resend_verbs)s) GROUP BY step_id
),
reconciled_after_resend AS (
  SELECT DISTINCT ev.step_id FROM resend_events ev JOIN resends r ON r.step_id = ev.step_id
  WHERE ev.verb = 'side_effect.committed' AND ev.confirmed_by = 'reconcile'
    AND ev.at > r.first_at
),
effect_f AS (
  SELECT p.run_id,
    count(*) FILTER (WHERE p.committed_keys >= 1) AS steps_committed,
    count(*) FILTER (WHERE p.committed_keys >= 2) AS steps_duplicated,
    count(*) FILTER (WHERE r.step_id IS NOT NULL OR p.keys >= 2) AS steps_resent,
    count(*) FILTER (WHERE (r.step_id IS NOT NULL OR p.keys >= 2) AND (
        p.committed_keys >= 2 OR ra.step_id IS NOT NULL OR EXISTS (
          SELECT 1 FROM {T["decision"]} d WHERE d.step_id = p.step_id
          AND d.verb = 'confirm_happened' AND d.created_at > r.first_at))) AS wrong_retries
  FROM (
    SELECT run_id, step_id, count(*) AS keys,
      count(*) FILTER (WHERE status IN ('committed', 'compensated')) AS committed_keys
    FROM effects GROUP BY run_id, step_id
  ) p
  LEFT JOIN resends r ON r.step_id = p.step_id
  LEFT JOIN reconciled_after_resend ra ON ra.step_id = p.step_id
  GROUP BY p.run_id
),
cov_f AS (
  SELECT e.run_id, count(*) AS committed,
    count(*) FILTER (WHERE sn.created_at <= e.committed_at) AS covered,
    array_agg({_epoch("e.committed_at - sn.created_at")} * 1000)
      FILTER (WHERE sn.created_at <= e.committed_at) AS latency_ms
  FROM cohort c JOIN {T["effect"]} e ON e.run_id = c.id
  JOIN {T["snapshot"]} sn ON sn.id = e.snapshot_id
  WHERE e.committed_at IS NOT NULL
  GROUP BY e.run_id
),
snap_f AS (
  SELECT sn.run_id, count(*) AS snapshots,
    COALESCE(sum(jsonb_array_length(sn.missing_fields)), 0) AS missing
  FROM cohort c JOIN {T["snapshot"]} sn ON sn.run_id = c.id GROUP BY sn.run_id
),
wait_f AS (
  SELECT w.run_id,
    count(*) FILTER (WHERE w.status IN ('resolved', 'expired')) AS settled,
    count(*) FILTER (WHERE w.status = 'expired') AS expired,
    array_agg({_epoch("w.resolved_at - w.created_at")})
      FILTER (WHERE w.status = 'resolved' AND w.resolved_at IS NOT NULL) AS resume_s
  FROM cohort c JOIN {T["wait"]} w ON w.run_id = c.id GROUP BY w.run_id
),
approval_f AS (
  SELECT a.run_id, count(*) FILTER (WHERE a.status = 'decided') AS decided,
    array_agg({_epoch("a.decided_at - a.created_at")})
      FILTER (WHERE a.status = 'decided' AND a.decided_at IS NOT NULL) AS handling_s
  FROM cohort c JOIN {T["approval"]} a ON a.run_id = c.id GROUP BY a.run_id
)"""

_ENDED = "c.status = ANY(%(terminal)s)"
_NONE = "'{}'::float8[]"


def _flag(condition: str) -> str:
    return f"({condition})::int"


# (column, expression): a run's row (RunMetrics), in this order; the counts are 0/1 flags or
# tallies so that any set of rows, or of MetricsDay rows, adds up with sum().
FACTS: list[tuple[str, str]] = [
    ("run_id", "c.id"),
    ("created_at", "c.created_at"),
    ("finished_at", "c.finished_at"),
    ("event_seq", "c.event_seq"),
    ("status", "c.status"),
    ("runs", "1"),
    ("finished", _flag(_ENDED)),
    ("succeeded", _flag("c.status = 'succeeded'")),
    ("faulted_finished", _flag(f"c.failure_count > 0 AND {_ENDED}")),
    ("auto_recovered", _flag("c.failure_count > 0 AND c.status = 'succeeded' AND "
     "c.escalation_level = 0 AND COALESCE(h.recovery_decisions, 0) = 0 AND t.n IS NULL")),
    ("human_stepped_in", _flag("COALESCE(h.recovery_decisions, 0) > 0 OR t.n IS NOT NULL")),
    ("takeovers", "COALESCE(t.n, 0)"),
    ("runs_taken_over", _flag("t.n IS NOT NULL")),
    ("second_intervention",
     _flag("COALESCE(t.n >= 2 OR (t.n IS NOT NULL AND ar.run_id IS NOT NULL), false)")),
    ("failed_steps", "COALESCE(sf.failed_steps, 0)"),
    ("recovered", "COALESCE(sf.recovered_steps, 0)"),
    ("recovered_locally", "COALESCE(sf.recovered_locally, 0)"),
    ("tool_calls", "COALESCE(tf.calls, 0)"),
    ("tool_failures", "COALESCE(tf.failures, 0)"),
    ("steps_committed", "COALESCE(ef.steps_committed, 0)"),
    ("steps_duplicated", "COALESCE(ef.steps_duplicated, 0)"),
    ("steps_resent", "COALESCE(ef.steps_resent, 0)"),
    ("wrong_retries", "COALESCE(ef.wrong_retries, 0)"),
    ("committed", "COALESCE(cv.committed, 0)"),
    ("covered", "COALESCE(cv.covered, 0)"),
    ("snapshots", "COALESCE(sp.snapshots, 0)"),
    ("missing", "COALESCE(sp.missing, 0)"),
    ("settled", "COALESCE(wf.settled, 0)"),
    ("expired", "COALESCE(wf.expired, 0)"),
    ("decided", "COALESCE(af.decided, 0)"),
    ("close_s", f"CASE WHEN {_ENDED} AND ff.at IS NOT NULL AND c.finished_at IS NOT NULL "
     f"THEN ARRAY[{_epoch('c.finished_at - ff.at')}] ELSE {_NONE} END"),
    ("recover_s", f"COALESCE(sf.recover_s, {_NONE})"),
    ("resume_s", f"COALESCE(wf.resume_s, {_NONE})"),
    ("handling_s", f"COALESCE(af.handling_s, {_NONE})"),
    ("latency_ms", f"COALESCE(cv.latency_ms, {_NONE})"),
    ("tool_names", "COALESCE(tf.tool_names, '{}'::text[])"),
    ("tool_classes", "COALESCE(tf.tool_classes, '{}'::text[])"),
    ("tool_counts", "COALESCE(tf.tool_counts, '{}'::int[])"),
]  # fmt: skip
assert [name for name, _expr in FACTS[5:]] == [*SUM_FIELDS, *VALUE_FIELDS, *TOOL_FIELDS]
FACT_COLUMNS = ", ".join(name for name, _expr in FACTS)


def facts_sql(cohort: str) -> str:
    """One row per run of `cohort` (a SELECT of the cohort columns), in FACTS' column order."""
    select = ",\n  ".join(f"{expr} AS {name}" for name, expr in FACTS)
    return f"""
WITH cohort AS MATERIALIZED ({cohort}),
{_FACTS_CTES}
SELECT {select}
FROM cohort c
LEFT JOIN first_failure ff ON ff.run_id = c.id
LEFT JOIN humans h ON h.run_id = c.id
LEFT JOIN takeovers t ON t.run_id = c.id
LEFT JOIN after_release ar ON ar.run_id = c.id
LEFT JOIN step_f sf ON sf.run_id = c.id
LEFT JOIN tool_f tf ON tf.run_id = c.id
LEFT JOIN effect_f ef ON ef.run_id = c.id
LEFT JOIN cov_f cv ON cv.run_id = c.id
LEFT JOIN snap_f sp ON sp.run_id = c.id
LEFT JOIN wait_f wf ON wf.run_id = c.id
LEFT JOIN approval_f af ON af.run_id = c.id"""


_COHORT_COLUMNS = (
    "r.id, r.status, r.created_at, r.finished_at, r.event_seq, r.failure_count, r.escalation_level"
)
# The cohort is passed as a list of run ids (read by a first query): PostgreSQL then knows its
# size and plans the joins for it, where a subquery's estimate (often one row) led it into
# nested loops over whole aggregates.
_COHORT = f"SELECT {_COHORT_COLUMNS} FROM {T['run']} r WHERE r.id = ANY(%(ids)s::uuid[])"
# A stored row counts while the run's timeline head is the one it was computed at. A run has no
# current row when none is stored, or the stored one was computed at another head. A scalar
# subquery is one primary-key lookup per run, where NOT EXISTS let the planner hash every stored
# row to check a few thousand open runs.
_NO_CURRENT_ROW = (
    f"(SELECT m.event_seq FROM {T['metrics']} m WHERE m.run_id = r.id) IS DISTINCT FROM r.event_seq"
)
# The window's runs without a current stored row (running, just changed, or not rolled up yet)
# are computed live. An ended run whose row went stale after its
# day was summed (an event appended after the end, which the engine never does) stays counted
# by its day row until the rollup rebuilds it.
_LIVE_FILTER = f"""r.created_at >= %(start)s AND r.created_at < %(end)s
  AND {_NO_CURRENT_ROW}
  AND NOT (r.status = ANY(%(terminal)s)
           AND EXISTS (SELECT 1 FROM {T["metrics"]} m WHERE m.run_id = r.id AND m.finished = 1)
           AND EXISTS (SELECT 1 FROM {T["day"]} d WHERE d.tz = %(tz)s
                       AND d.day = (r.created_at AT TIME ZONE %(tz)s)::date
                       AND d.day >= %(first_day)s AND d.day < %(last_day)s))"""
# Where such runs are, once the rollup runs: open runs (the status index) and runs that ended
# after the stored rows' high-water mark (run_finished_idx). WINDOW_SQL checks that the rows
# it adds up cover every run of the window; if they do not (runs loaded with old ends after
# the rollup passed them), compute() falls back to LIVE_IDS_ALL_SQL.
LIVE_IDS_SQL = f"""
SELECT r.id FROM {T["run"]} r WHERE r.status = ANY(%(open)s) AND {_LIVE_FILTER}
UNION ALL
SELECT r.id FROM {T["run"]} r
WHERE r.finished_at >= %(recent)s AND r.status = ANY(%(terminal)s) AND {_LIVE_FILTER}"""
LIVE_IDS_ALL_SQL = f"SELECT r.id FROM {T['run']} r WHERE {_LIVE_FILTER}"

# The columns any row of a window (a run's, a day's) has, in this order.
SUM_COLUMNS = ", ".join([*SUM_FIELDS, *VALUE_FIELDS, *TOOL_FIELDS])
# Sums over the window's rows, per trend bucket and for the whole window (bucket NULL).
_COUNTS = {name: f"sum({name})" for name in SUM_FIELDS} | {
    "closed_after_failure": "sum(cardinality(close_s))"
}
# Durations whose mean, median and p95 the figures show: (name, column).
_VALUES = [(name.rsplit("_", 1)[0], name) for name in VALUE_FIELDS]
_VALUE_COLUMNS = ", ".join(name for name, _array in _VALUES)
_VALUE_STATS = ",\n    ".join(
    f"avg({name}) AS {name}_mean, "
    f"percentile_cont(ARRAY[0.5, 0.95]) WITHIN GROUP (ORDER BY {name}) AS {name}_p"
    for name, _array in _VALUES
)
_BUCKET_OF = "date_trunc(%(bucket)s, m.created_at AT TIME ZONE %(tz)s)"
_DAY_START = "(u.day::timestamp AT TIME ZONE %(tz)s)"
_DAY_END = "((u.day + 1)::timestamp AT TIME ZONE %(tz)s)"
_NOT_LIVE = "NOT EXISTS (SELECT 1 FROM live l WHERE l.run_id = m.run_id)"
# A window's rows: the MetricsDay rows of its whole past days (with day buckets), and the run
# rows of everything else: the edges of the window, today, open runs, any whole day without a
# day row yet, and the runs computed live. Each part reads its rows through an index, and each
# aggregate reads only the columns it needs: wide rows are never copied into an intermediate.
_ROWS_CTES = f"""
WITH live AS MATERIALIZED ({facts_sql(_COHORT)}),
days AS MATERIALIZED (
  SELECT * FROM {T["day"]} d
  WHERE d.tz = %(tz)s AND d.day >= %(first_day)s AND d.day < %(last_day)s
),
uncovered AS MATERIALIZED (
  SELECT g::date AS day FROM generate_series(%(first_day)s::date, %(last_day)s::date - 1,
                                             interval '1 day') AS g
  WHERE NOT EXISTS (SELECT 1 FROM days d WHERE d.day = g::date)
),
src AS NOT MATERIALIZED (
  SELECT {SUM_COLUMNS}, d.day::timestamp AS bucket FROM days d
  UNION ALL
  SELECT {SUM_COLUMNS}, {_BUCKET_OF} FROM {T["metrics"]} m
  WHERE ((m.created_at >= %(start)s AND m.created_at < %(days_start)s)
         OR (m.created_at >= %(days_end)s AND m.created_at < %(end)s)) AND {_NOT_LIVE}
  UNION ALL
  SELECT {SUM_COLUMNS}, {_BUCKET_OF} FROM {T["metrics"]} m
  WHERE m.finished = 0 AND m.created_at >= %(days_start)s AND m.created_at < %(days_end)s
    AND {_NOT_LIVE}
  UNION ALL
  SELECT {SUM_COLUMNS}, {_BUCKET_OF} FROM uncovered u JOIN {T["metrics"]} m
    ON m.created_at >= {_DAY_START} AND m.created_at < {_DAY_END}
  WHERE m.finished = 1 AND {_NOT_LIVE}
  UNION ALL
  SELECT {SUM_COLUMNS}, {_BUCKET_OF} FROM live m
)
"""
WINDOW_SQL = f"""
{_ROWS_CTES},
counts AS (
  SELECT bucket, {", ".join(f"{expr} AS {name}" for name, expr in _COUNTS.items())}
  FROM src GROUP BY GROUPING SETS ((bucket), ())
),
vals AS (
  SELECT bucket, {_VALUE_STATS}
  FROM (
    SELECT src.bucket, u.*
    FROM src CROSS JOIN LATERAL unnest({", ".join(a for _n, a in _VALUES)}) AS u({_VALUE_COLUMNS})
  ) v
  GROUP BY GROUPING SETS ((bucket), ())
),
tools AS (
  SELECT t.tool, t.failure_class, sum(t.n) AS n
  FROM src CROSS JOIN LATERAL unnest(src.tool_names, src.tool_classes, src.tool_counts)
    AS t(tool, failure_class, n)
  GROUP BY 1, 2
)
SELECT 'counts' AS part, bucket, to_jsonb(counts) - 'bucket' AS data FROM counts
UNION ALL SELECT 'values', bucket, to_jsonb(vals) - 'bucket' FROM vals
UNION ALL SELECT 'tools', NULL::timestamp, to_jsonb(tools) FROM tools
UNION ALL SELECT 'expected', NULL::timestamp, to_jsonb(count(*)) FROM {T["run"]} r
  WHERE r.created_at >= %(start)s AND r.created_at < %(end)s
"""
# All-time tool failures by tool and class (the Prometheus counter), from the same rows, with
# the window's run count and the count the rows cover (see compute()).
TOOL_FAILURES_SQL = f"""
{_ROWS_CTES}
SELECT t.tool, t.failure_class, sum(t.n)
FROM src CROSS JOIN LATERAL unnest(src.tool_names, src.tool_classes, src.tool_counts)
  AS t(tool, failure_class, n)
WHERE t.failure_class <> ''
GROUP BY 1, 2
UNION ALL SELECT '', 'runs', COALESCE(sum(runs), 0) FROM src
UNION ALL SELECT '', 'expected', count(*) FROM {T["run"]} r
  WHERE r.created_at >= %(start)s AND r.created_at < %(end)s
"""

# One MetricsDay row per day of %(days)s (dates in %(tz)s): the sums of the stored rows of the
# ended runs that started that day.
_IN_DAY = f"m.finished = 1 AND m.created_at >= {_DAY_START} AND m.created_at < {_DAY_END}"
_DAY_COLUMNS = ["tz", "day", "computed_at", *SUM_FIELDS, *VALUE_FIELDS, *TOOL_FIELDS]
DAY_SQL = f"""
INSERT INTO {T["day"]} AS d ({", ".join(_DAY_COLUMNS)})
SELECT %(tz)s, u.day, %(now)s, s.*,
  {
    ", ".join(
        f"ARRAY(SELECT x FROM {T['metrics']} m, unnest(m.{col}) AS x WHERE {_IN_DAY})"
        for col in VALUE_FIELDS
    )
},
  t.*
FROM unnest(%(days)s::date[]) AS u(day)
CROSS JOIN LATERAL (
  SELECT {", ".join(f"COALESCE(sum(m.{col}), 0)" for col in SUM_FIELDS)}
  FROM {T["metrics"]} m WHERE {_IN_DAY}
) AS s
CROSS JOIN LATERAL (
  SELECT COALESCE(array_agg(x.tool ORDER BY x.tool, x.cls), '{{}}'),
         COALESCE(array_agg(x.cls ORDER BY x.tool, x.cls), '{{}}'),
         COALESCE(array_agg(x.n ORDER BY x.tool, x.cls), '{{}}')
  FROM (
    SELECT t.tool, t.cls, sum(t.n)::int AS n
    FROM {T["metrics"]} m, unnest(m.tool_names, m.tool_classes, m.tool_counts) AS t(tool, cls, n)
    WHERE {_IN_DAY} GROUP BY 1, 2
  ) x
) AS t
ON CONFLICT (tz, day) DO UPDATE SET
  {", ".join(f"{col} = EXCLUDED.{col}" for col in _DAY_COLUMNS[2:])}
"""

# Ended runs without a current row, oldest end first, from `since` on (see rollup()).
ROLLUP_ENDED_SQL = f"""
SELECT r.id, r.finished_at FROM {T["run"]} r
WHERE r.finished_at >= %(since)s AND r.finished_at < %(cutoff)s AND r.status = ANY(%(terminal)s)
  AND {_NO_CURRENT_ROW}
ORDER BY r.finished_at LIMIT %(limit)s"""
# Open runs without a current row that have not changed for ROLLUP_AFTER (parked for a person,
# waiting, or stalled). Their row stays current until the run moves again.
ROLLUP_OPEN_SQL = f"""
SELECT r.id, r.finished_at FROM {T["run"]} r
WHERE r.status = ANY(%(open)s) AND r.updated_at < %(cutoff)s
  AND {_NO_CURRENT_ROW}
LIMIT %(limit)s"""
_UPDATES = ", ".join(f"{name} = EXCLUDED.{name}" for name, _expr in FACTS[1:])
ROLLUP_SQL = f"""
INSERT INTO {T["metrics"]} AS m ({FACT_COLUMNS}, computed_at)
SELECT {FACT_COLUMNS}, %(now)s FROM ({facts_sql(_COHORT)}) AS facts
ON CONFLICT (run_id) DO UPDATE SET {_UPDATES}, computed_at = EXCLUDED.computed_at
  WHERE m.event_seq < EXCLUDED.event_seq
RETURNING (m.created_at AT TIME ZONE %(tz)s)::date, m.finished
"""

QUERIES: dict[str, str] = {}

# Now, not windowed. Each count reads a partial or status index.
QUERIES["now"] = f"""
SELECT
  (SELECT count(*) FROM {T["run"]} r WHERE r.status = 'running' AND r.updated_at < %(stale)s
     -- A scalar subquery runs per run, through the step index (not a scan of every step).
     AND (SELECT count(*) FROM {T["step"]} s WHERE s.run_id = r.id
          AND s.status <> ALL(%(finished_steps)s)) = 0) AS running_without_step,
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
    """Settings for these aggregate queries only, in one transaction (so SET LOCAL ends with it):
    PostgreSQL JIT-compiles plans this size (cost > jit_above_cost) and spends ~1 s per query
    doing it, to save milliseconds; and the medians sort a month's durations (~200k values),
    which spills to disk at the default 4 MB of work_mem."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL jit = off; SET LOCAL work_mem = '64MB'")
        yield


def _plain(value):
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    return value


def _whole_days(window: Window, now: datetime) -> tuple[date, date]:
    """The window's whole past days [first, last) in the current time zone, which MetricsDay
    rows can stand for (none for an hourly window)."""
    tz = timezone.get_current_timezone()
    start, end = timezone.localtime(window.start, tz), timezone.localtime(window.end, tz)
    first = start.date() if start.time() == time(0) else start.date() + timedelta(days=1)
    last = min(end.date(), timezone.localtime(now, tz).date())
    if window.bucket != "day" or last <= first:
        return first, first
    return first, last


def _params(window: Window, now: datetime) -> dict:
    tz = timezone.get_current_timezone()
    first_day, last_day = _whole_days(window, now)
    return {
        "first_day": first_day,
        "last_day": last_day,
        "days_start": timezone.make_aware(datetime.combine(first_day, time(0)), tz),
        "days_end": timezone.make_aware(datetime.combine(last_day, time(0)), tz),
        "start": window.start,
        "end": window.end,
        "bucket": window.bucket,
        "tz": timezone.get_current_timezone_name(),
        "terminal": list(TERMINAL),
        "failure_verbs": list(FAILURE_VERBS),
        "resend_verbs": list(RESEND_VERBS),
        "fact_verbs": [*FAILURE_VERBS, *RESEND_VERBS, "side_effect.committed"],
        "open": sorted(set(Run.Status) - Run.TERMINAL),
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
    """The window's sums: one row per trend bucket and one (key None) for the whole window."""

    window: Window
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


@dataclass
class Dashboard:
    window: Window
    buckets: list[datetime]
    figures: list[Figure]
    inconsistencies: dict[str, int]
    needing_human: int
    # The window's runs, how many of them were computed live, and whether the rollup missed
    # some (runs with no stored row behind its high-water mark).
    runs: int = 0
    live_runs: int = 0
    missed_runs: bool = False

    @property
    def inconsistency_total(self) -> int:
        return sum(self.inconsistencies.values())

    @property
    def rollup_behind(self) -> bool:
        """The rollup is not keeping up (beat stopped?): the page is computing many runs live.
        A few hundred runs moving at any moment is normal."""
        return self.missed_runs or self.live_runs > max(ROLLUP_BEHIND_RUNS, self.runs // 10)

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
            "rollup": {"live_runs": self.live_runs, "behind": self.rollup_behind},
        }


def _minutes() -> dict:
    return {"minutes": STALE_MINUTES}


def current_state(now: datetime | None = None) -> dict[str, int]:
    """Counts that describe now: inconsistencies and runs needing a person (one query)."""
    row = _run("now", now_params(now or timezone.now()))[0]
    return {k: int(v) for k, v in row.items()}


def compute(window: Window, *, now: datetime | None = None) -> Dashboard:
    """Every figure of the dashboard: the live runs, one query over the window, one for now,
    whatever the size (plus the SET that turns JIT off)."""
    now = now or timezone.now()
    params = _params(window, now)
    with _no_jit(), connection.cursor() as cursor:
        result, missed = _over_rows(cursor, WINDOW_SQL, params, _window_covered)
        rows, tools = _window_rows(result)
        state = current_state(now)
    data = Data(window, window.buckets(), rows, tools)
    needing_human = state.pop("needing_human")
    figures = [fn(data) for fn in FIGURES]
    runs = int(data.total().get("runs") or 0)
    return Dashboard(
        window, data.buckets, figures, state, needing_human, runs, len(params["ids"]), missed
    )


def _high_water(cursor) -> datetime:
    """The stored rows' latest end less HIGH_WATER_MARGIN: every run that ended before it has
    its row (see rollup())."""
    cursor.execute(f"SELECT max(finished_at) FROM {T['metrics']}")
    high = cursor.fetchone()[0]
    return high - HIGH_WATER_MARGIN if high else EPOCH


def _over_rows(
    cursor, sql: str, params: dict, covered: Callable[[list], bool]
) -> tuple[list, bool]:
    """Run `sql` (built on _ROWS_CTES) with the runs that lack a current row computed live.

    Those runs are looked for where the rollup leaves them (LIVE_IDS_SQL). If the result does
    not cover every run of the window (`covered`), the rollup missed some: the query runs again
    with every run that lacks a current row. Returns the result and whether runs were missed.
    """
    params["recent"] = _high_water(cursor)
    cursor.execute(LIVE_IDS_SQL, params)
    params["ids"] = [run_id for (run_id,) in cursor.fetchall()]
    cursor.execute(sql, params)
    result = cursor.fetchall()
    if covered(result):
        return result, False
    logger.warning("metrics: the rollup missed runs; run rollup_metrics --full")
    cursor.execute(LIVE_IDS_ALL_SQL, params)
    params["ids"] = [run_id for (run_id,) in cursor.fetchall()]
    cursor.execute(sql, params)
    return cursor.fetchall(), True


def _window_covered(result: list) -> bool:
    runs = expected = 0
    for part, bucket, text in result:
        if part == "expected":
            expected = json.loads(text)
        elif part == "counts" and bucket is None:
            runs = json.loads(text).get("runs") or 0  # an empty window sums to NULL
    return runs == expected


def _window_rows(result: list) -> tuple[dict[Any, dict], list[dict]]:
    rows: dict[Any, dict] = {}
    tools: list[dict] = []
    for part, bucket, text in result:
        data = json.loads(text)  # Django reads jsonb as text
        if part == "tools":
            tools.append(data)
        elif part == "counts":
            rows.setdefault(bucket, {}).update(data)
        elif part == "values":
            row = rows.setdefault(bucket, {})
            for name, _array in _VALUES:
                row[f"{name}_mean"] = data[f"{name}_mean"]
                row[f"{name}_p50"], row[f"{name}_p95"] = data[f"{name}_p"] or (None, None)
    return rows, tools


# --------------------------------------------------------------------------------------------
# The rollup: the rows of runs that have been still for a while, and the day sums.

# A run's row is stored once the run has been still this long (so a run in motion is not
# recomputed at every step); until then the dashboard computes it live.
ROLLUP_AFTER = timedelta(minutes=1)
# Ends are read from the stored rows' latest end less this margin, for transactions that
# committed well after they set finished_at.
HIGH_WATER_MARGIN = timedelta(minutes=10)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
ROLLUP_BATCH = 2000
# Above this many runs computed live (or a tenth of the window), the page says the rollup is
# behind.
ROLLUP_BEHIND_RUNS = 1000


def rollup(
    *,
    now: datetime | None = None,
    full: bool = False,
    batch_size: int = ROLLUP_BATCH,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Store the rows of runs still for ROLLUP_AFTER whose row is missing or stale, and keep
    the MetricsDay rows of whole past days in step with them.

    Two passes, `batch_size` runs per transaction:
    1. Ended runs, in order of ending. A pass starts at the stored rows' latest end (less
       HIGH_WATER_MARGIN), so it reads only recent ends through run_finished_idx; `full` starts
       at the beginning instead (after loading old runs in bulk, or to repair rows made stale
       by an event appended after the end).
    2. Open runs (parked for a person, waiting, stalled), through the status index.
    Each batch rebuilds, in its own transaction, the day rows of the past days its ended runs
    started on; then the days that ended since the last pass get their row (with `full`,
    every day within MAX_CUSTOM_DAYS). Rollups take turns (an advisory lock per transaction),
    so a day row is always built from every row committed before it. Safe to run at any time.
    Returns how many run rows it wrote.
    """
    now = now or timezone.now()
    tz = timezone.get_default_timezone()
    params = {
        **_params(Window("rollup", now, now), now),
        "tz": timezone.get_default_timezone_name(),
        "now": now,
        "cutoff": now - ROLLUP_AFTER,
        "limit": batch_size,
    }
    today = timezone.localtime(now, tz).date()
    params["days_end_today"] = timezone.make_aware(datetime.combine(today, time(0)), tz)
    since = EPOCH
    if not full:
        with connection.cursor() as cursor:
            since = _high_water(cursor)
    stored = 0
    for finder in (ROLLUP_ENDED_SQL, ROLLUP_OPEN_SQL):
        while True:
            with _no_jit(), connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [ROLLUP_LOCK])
                cursor.execute(finder, {**params, "since": since})
                batch = cursor.fetchall()
                if batch:
                    cursor.execute(ROLLUP_SQL, {**params, "ids": [run_id for run_id, _ in batch]})
                    written = cursor.fetchall()
                    stored += len(written)
                    days = sorted({day for day, ended in written if ended and day < today})
                    if days:
                        cursor.execute(DAY_SQL, {**params, "days": days})
            if progress:
                progress(stored)
            if len(batch) < batch_size:
                break
            if finder is ROLLUP_ENDED_SQL:
                # Every run that ended before the batch's last end now has its row.
                since = batch[-1][1]
    _build_missing_days(params, today, MAX_CUSTOM_DAYS + 1 if full else 3)
    return stored


ROLLUP_LOCK = 0x7461736B  # pg_advisory_xact_lock key of the metrics rollup ("task")


def _build_missing_days(params: dict, today: date, lookback: int) -> None:
    """Build the day rows of the last `lookback` whole days that have ended runs but no row."""
    with _no_jit(), connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [ROLLUP_LOCK])
        start = timezone.make_aware(
            datetime.combine(today - timedelta(days=lookback), time(0)),
            timezone.get_default_timezone(),
        )
        cursor.execute(
            f"""SELECT DISTINCT (m.created_at AT TIME ZONE %(tz)s)::date AS day
            FROM {T["metrics"]} m
            WHERE m.finished = 1 AND m.created_at >= %(from)s AND m.created_at < %(to)s
              AND NOT EXISTS (SELECT 1 FROM {T["day"]} d WHERE d.tz = %(tz)s
                              AND d.day = (m.created_at AT TIME ZONE %(tz)s)::date)""",
            {**params, "from": start, "to": params["days_end_today"]},
        )
        days = [day for (day,) in cursor.fetchall()]
        if days:
            cursor.execute(DAY_SQL, {**params, "days": days})


def median(values):  # used by tests and docs to state the hand-computed answers
    return statistics.median(values) if values else None


# --------------------------------------------------------------------------------------------
# Prometheus text format 0.0.4 (/metrics): all-time counters and current gauges.

PROMETHEUS_QUERIES = {
    "runs": f"SELECT workflow, status, count(*) FROM {T['run']} GROUP BY workflow, status",
    "effects": f"""
        SELECT tool, status, count(*), count(*) FILTER (WHERE committed_at IS NOT NULL)
        FROM {T["effect"]} GROUP BY tool, status""",
}


def _label(value: Any) -> str:
    text = str(value)
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _all_time_failures(cursor, now: datetime) -> list[tuple[str, str, int]]:
    """Tool failures of every run ever, from the day rows, the run rows and the live runs, in
    four queries (whatever the history) plus two more when the rollup missed runs."""
    cursor.execute(f"SELECT min(created_at) FROM {T['run']}")
    first = cursor.fetchone()[0]
    if first is None:
        return []
    # Up to now (and at least three days long, so that it is bucketed by day).
    window = Window("all", first, max(now + timedelta(microseconds=1), first + timedelta(days=3)))
    result, _missed = _over_rows(cursor, TOOL_FAILURES_SQL, _params(window, now), _tools_covered)
    return [(tool, cls, int(n)) for tool, cls, n in result if tool != ""]


def _tools_covered(result: list) -> bool:
    totals = {cls: n for tool, cls, n in result if tool == ""}
    return totals.get("runs") == totals.get("expected")


def _sample(name: str, labels: dict[str, Any], value: float | int) -> str:
    inner = ",".join(f'{key}="{_label(val)}"' for key, val in labels.items())
    return f"{name}{{{inner}}} {value}" if inner else f"{name} {value}"


def prometheus_text(now: datetime | None = None) -> str:
    """Counters of everything that ever happened and gauges of the current state (7 queries,
    whatever the history: the failure counter is added up from the stored rows).

    Counters only grow: runs are counted once they have ended (a terminal status never
    changes); side effects once committed (compensated ones included) and once compensated.
    Live states are gauges.
    """
    now = now or timezone.now()
    results = {}
    with _no_jit(), connection.cursor() as cursor:
        for name, sql in PROMETHEUS_QUERIES.items():
            cursor.execute(sql)
            results[name] = cursor.fetchall()
        results["failures"] = _all_time_failures(cursor, now)
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

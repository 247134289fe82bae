"""Reading the figures: a window's sums (stored day rows, stored run rows, and the runs computed
live by the same FACTS SQL), the all-time tool failures, and the state of things now.

A fixed number of queries, whatever the amount of data; docs/metrics.md has the figures.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import date, datetime, time, timedelta
from typing import Any

from django.db import connection
from django.utils import timezone

from approvals.metrics.facts import COHORT_SQL, NO_CURRENT_ROW, fact_params, facts_sql
from approvals.metrics.sql import DAY_END, DAY_START, T
from approvals.metrics.store import high_water
from approvals.metrics.window import Window
from approvals.models import SUM_FIELDS, TOOL_FIELDS, VALUE_FIELDS
from runs.models import Step

logger = logging.getLogger("taskpilots.metrics")

# A run, step or side effect stuck this long in a state that should not last is an alert.
STALE_MINUTES = 10

# The window's runs without a current stored row (running, just changed, or not rolled up yet)
# are computed live. An ended run whose row went stale after its day was summed (an event
# appended after the end, which the engine never does) stays counted by its day row until the
# rollup rebuilds it.
_LIVE_FILTER = f"""r.created_at >= %(start)s AND r.created_at < %(end)s
  AND {NO_CURRENT_ROW}
  AND NOT (r.status = ANY(%(terminal)s)
           AND EXISTS (SELECT 1 FROM {T["metrics"]} m WHERE m.run_id = r.id AND m.finished = 1)
           AND EXISTS (SELECT 1 FROM {T["day"]} d WHERE d.tz = %(tz)s
                       AND d.day = (r.created_at AT TIME ZONE %(tz)s)::date
                       AND d.day >= %(first_day)s AND d.day < %(last_day)s))"""
# Where such runs are, once the rollup runs: open runs (the status index) and runs that ended
# after the stored rows' high-water mark (run_finished_idx). WINDOW_SQL checks that the rows
# it adds up cover every run of the window; if they do not (runs loaded with old ends after
# the rollup passed them), over_rows() falls back to LIVE_IDS_ALL_SQL.
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
_NOT_LIVE = "NOT EXISTS (SELECT 1 FROM live l WHERE l.run_id = m.run_id)"
# A window's rows: the MetricsDay rows of its whole past days (with day buckets), and the run
# rows of everything else: the edges of the window, today, open runs, any whole day without a
# day row yet, and the runs computed live. Each part reads its rows through an index, and each
# aggregate reads only the columns it needs: wide rows are never copied into an intermediate.
_ROWS_CTES = f"""
WITH live AS MATERIALIZED ({facts_sql(COHORT_SQL)}),
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
    ON m.created_at >= {DAY_START} AND m.created_at < {DAY_END}
  WHERE m.finished = 1 AND {_NOT_LIVE}
  UNION ALL
  SELECT {SUM_COLUMNS}, {_BUCKET_OF} FROM live m
)
"""
# The sums of `src`'s rows, per trend bucket and for them all (bucket NULL), as (part, bucket,
# jsonb) rows: "counts", "values" (the mean, p50 and p95 of each kind of duration), "tools".
_SUMS = f"""
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
UNION ALL SELECT 'tools', NULL::timestamp, to_jsonb(tools) FROM tools"""
WINDOW_SQL = f"""
{_ROWS_CTES},
{_SUMS}
UNION ALL SELECT 'expected', NULL::timestamp, to_jsonb(count(*)) FROM {T["run"]} r
  WHERE r.created_at >= %(start)s AND r.created_at < %(end)s
"""
# The sums of the runs %(ids)s, wherever they started, all computed live (one bucket, NULL).
SEED_SQL = f"""
WITH live AS MATERIALIZED ({facts_sql(COHORT_SQL)}),
src AS NOT MATERIALIZED (SELECT {SUM_COLUMNS}, NULL::timestamp AS bucket FROM live),
{_SUMS}
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

# Now, not windowed. Each count reads a partial or status index.
NOW_SQL = f"""
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


def window_params(window: Window, now: datetime) -> dict:
    """The parameters of the window's queries (WINDOW_SQL, TOOL_FAILURES_SQL)."""
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
        **fact_params(),
    }


def current_state(now: datetime | None = None) -> dict[str, int]:
    """Counts that describe now: inconsistencies and runs needing a person (one query)."""
    params = {
        "stale": (now or timezone.now()) - timedelta(minutes=STALE_MINUTES),
        "finished_steps": sorted(Step.FINISHED),
    }
    with connection.cursor() as cursor:
        cursor.execute(NOW_SQL, params)
        columns = [c.name for c in cursor.description]
        row = cursor.fetchone()
    return {name: int(value) for name, value in zip(columns, row, strict=True)}


def over_rows(cursor, sql: str, params: dict, covered: Callable[[list], bool]) -> tuple[list, bool]:
    """Run `sql` (built on _ROWS_CTES) with the runs that lack a current row computed live.

    Those runs are looked for where the rollup leaves them (LIVE_IDS_SQL). If the result does
    not cover every run of the window (`covered`), the rollup missed some: the query runs again
    with every run that lacks a current row. Returns the result and whether runs were missed.
    """
    params["recent"] = high_water(cursor)
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


def window_covered(result: list) -> bool:
    runs = expected = 0
    for part, bucket, text in result:
        if part == "expected":
            expected = json.loads(text)
        elif part == "counts" and bucket is None:
            runs = json.loads(text).get("runs") or 0  # an empty window sums to NULL
    return runs == expected


def window_rows(result: list) -> tuple[dict[Any, dict], list[dict]]:
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

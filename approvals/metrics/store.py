"""The rollup: the stored rows (RunMetrics) of runs that have been still for a while, and the
day sums (MetricsDay) of their ended runs."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, date, datetime, time, timedelta

from django.db import connection
from django.utils import timezone

from approvals.metrics.facts import (
    COHORT_SQL,
    FACT_COLUMNS,
    FACTS,
    NO_CURRENT_ROW,
    fact_params,
    facts_sql,
)
from approvals.metrics.sql import DAY_END, DAY_START, T, no_jit
from approvals.metrics.window import MAX_CUSTOM_DAYS
from approvals.models import SUM_FIELDS, TOOL_FIELDS, VALUE_FIELDS

# A run's row is stored once the run has been still this long (so a run in motion is not
# recomputed at every step); until then the dashboard computes it live.
ROLLUP_AFTER = timedelta(minutes=1)
# Ends are read from the stored rows' latest end less this margin, for transactions that
# committed well after they set finished_at.
HIGH_WATER_MARGIN = timedelta(minutes=10)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
ROLLUP_BATCH = 2000
ROLLUP_LOCK = 0x7461736B  # pg_advisory_xact_lock key of the metrics rollup ("task")

# One MetricsDay row per day of %(days)s (dates in %(tz)s): the sums of the stored rows of the
# ended runs that started that day.
_IN_DAY = f"m.finished = 1 AND m.created_at >= {DAY_START} AND m.created_at < {DAY_END}"
_DAY_COLUMNS = ["tz", "day", "computed_at", *SUM_FIELDS, *VALUE_FIELDS, *TOOL_FIELDS]
_DAY_SUMS = ", ".join(f"COALESCE(sum(m.{col}), 0)" for col in SUM_FIELDS)
# Every duration of the day's rows, so that the day's medians stay exact.
_DAY_DURATIONS = ", ".join(
    f"ARRAY(SELECT x FROM {T['metrics']} m, unnest(m.{col}) AS x WHERE {_IN_DAY})"
    for col in VALUE_FIELDS
)
_DAY_UPDATES = ", ".join(f"{col} = EXCLUDED.{col}" for col in _DAY_COLUMNS[2:])
DAY_SQL = f"""
INSERT INTO {T["day"]} AS d ({", ".join(_DAY_COLUMNS)})
SELECT %(tz)s, u.day, %(now)s, s.*, {_DAY_DURATIONS}, t.*
FROM unnest(%(days)s::date[]) AS u(day)
CROSS JOIN LATERAL (SELECT {_DAY_SUMS} FROM {T["metrics"]} m WHERE {_IN_DAY}) AS s
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
ON CONFLICT (tz, day) DO UPDATE SET {_DAY_UPDATES}
"""

# Ended runs without a current row, oldest end first, from `since` on (see rollup()).
ROLLUP_ENDED_SQL = f"""
SELECT r.id, r.finished_at FROM {T["run"]} r
WHERE r.finished_at >= %(since)s AND r.finished_at < %(cutoff)s AND r.status = ANY(%(terminal)s)
  AND {NO_CURRENT_ROW}
ORDER BY r.finished_at LIMIT %(limit)s"""
# Open runs without a current row that have not changed for ROLLUP_AFTER (parked for a person,
# waiting, or stalled). Their row stays current until the run moves again.
ROLLUP_OPEN_SQL = f"""
SELECT r.id, r.finished_at FROM {T["run"]} r
WHERE r.status = ANY(%(open)s) AND r.updated_at < %(cutoff)s
  AND {NO_CURRENT_ROW}
LIMIT %(limit)s"""
_UPDATES = ", ".join(f"{name} = EXCLUDED.{name}" for name, _expr in FACTS[1:])
ROLLUP_SQL = f"""
INSERT INTO {T["metrics"]} AS m ({FACT_COLUMNS}, computed_at)
SELECT {FACT_COLUMNS}, %(now)s FROM ({facts_sql(COHORT_SQL)}) AS facts
ON CONFLICT (run_id) DO UPDATE SET {_UPDATES}, computed_at = EXCLUDED.computed_at
  WHERE m.event_seq < EXCLUDED.event_seq
RETURNING (m.created_at AT TIME ZONE %(tz)s)::date, m.finished
"""


def high_water(cursor) -> datetime:
    """The stored rows' latest end less HIGH_WATER_MARGIN: every run that ended before it has
    its row (see rollup())."""
    cursor.execute(f"SELECT max(finished_at) FROM {T['metrics']}")
    high = cursor.fetchone()[0]
    return high - HIGH_WATER_MARGIN if high else EPOCH


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
        **fact_params(),
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
            since = high_water(cursor)
    stored = 0
    for finder in (ROLLUP_ENDED_SQL, ROLLUP_OPEN_SQL):
        while True:
            with no_jit(), connection.cursor() as cursor:
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


def _build_missing_days(params: dict, today: date, lookback: int) -> None:
    """Build the day rows of the last `lookback` whole days that have ended runs but no row."""
    with no_jit(), connection.cursor() as cursor:
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


def before_pruning(sender, now=None, **kwargs) -> None:
    """runs.signals.payloads_pruning: the dashboard's figures come from the payloads (failure
    classes, keys), so every ended run's figures are stored before they are dropped."""
    rollup(now=now, full=True)

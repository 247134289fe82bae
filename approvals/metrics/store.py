"""The rollup: the stored rows (RunMetrics) of runs that have been still for a while, and the
day and hour sums (MetricsDay, MetricsHour) of their ended runs."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, date, datetime, time, timedelta

from django.db import connection
from django.utils import timezone

from approvals.metrics import sketch
from approvals.metrics.facts import (
    COHORT_SQL,
    FACT_COLUMNS,
    FACTS,
    NO_CURRENT_ROW,
    fact_params,
    facts_sql,
)
from approvals.metrics.sql import DAY_END, DAY_START, T, durations_of, no_jit
from approvals.metrics.tables import SKETCH_FIELDS, SUM_FIELDS, TOOL_FIELDS
from approvals.metrics.window import MAX_CUSTOM_DAYS

# A run's row is stored once the run has been still this long (so a run in motion is not
# recomputed at every step); until then the dashboard computes it live.
ROLLUP_AFTER = timedelta(minutes=1)
# Ends are read from the stored rows' latest end less this margin, for transactions that
# committed well after they set finished_at.
HIGH_WATER_MARGIN = timedelta(minutes=10)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
ROLLUP_BATCH = 2000
ROLLUP_LOCK = 0x7461736B  # pg_advisory_xact_lock key of the metrics rollup ("task")

_PERIOD_COLUMNS = [*SUM_FIELDS, *TOOL_FIELDS, *SKETCH_FIELDS]
_PERIOD_SUMS = ", ".join(f"COALESCE(sum(m.{col}), 0)" for col in SUM_FIELDS)


def _period_sql(table: str, keys: dict[str, str], periods: str, in_period: str) -> str:
    """INSERT or replace one row of `table` per period of `periods` (a FROM item aliased u):
    the sums of the stored rows of the ended runs `in_period` (a condition on m and u), their
    tool tallies, and the sketch of their durations. `keys` are the row's key columns and their
    values."""
    columns = [*keys, "computed_at", *_PERIOD_COLUMNS]
    updates = ", ".join(f"{col} = EXCLUDED.{col}" for col in columns[len(keys) :])
    return f"""
INSERT INTO {table} AS p ({", ".join(columns)})
SELECT {", ".join(keys.values())}, %(now)s, s.*, t.*, k.*
FROM {periods}
CROSS JOIN LATERAL (SELECT {_PERIOD_SUMS} FROM {T["metrics"]} m WHERE {in_period}) AS s
CROSS JOIN LATERAL (
  SELECT COALESCE(array_agg(x.tool ORDER BY x.tool, x.cls), '{{}}'),
         COALESCE(array_agg(x.cls ORDER BY x.tool, x.cls), '{{}}'),
         COALESCE(array_agg(x.n ORDER BY x.tool, x.cls), '{{}}')
  FROM (
    SELECT t.tool, t.cls, sum(t.n)::int AS n
    FROM {T["metrics"]} m, unnest(m.tool_names, m.tool_classes, m.tool_counts) AS t(tool, cls, n)
    WHERE {in_period} GROUP BY 1, 2
  ) x
) AS t
CROSS JOIN LATERAL (
  SELECT COALESCE(array_agg(x.kind ORDER BY x.kind, x.bin), '{{}}'),
         COALESCE(array_agg(x.bin ORDER BY x.kind, x.bin), '{{}}'),
         COALESCE(array_agg(x.n ORDER BY x.kind, x.bin), '{{}}')
  FROM (
    SELECT v.kind::smallint AS kind, {sketch.bin_sql("v.x")} AS bin, count(*)::int AS n
    FROM {T["metrics"]} m CROSS JOIN {durations_of("m")} v
    WHERE {in_period} GROUP BY 1, 2
  ) x
) AS k
ON CONFLICT ({", ".join(keys)}) DO UPDATE SET {updates}
"""


# One MetricsDay row per day of %(days)s (dates in %(tz)s), one MetricsHour row per hour of
# %(hours)s: the ended runs that started then.
DAY_SQL = _period_sql(
    T["day"],
    {"tz": "%(tz)s", "day": "u.day"},
    "unnest(%(days)s::date[]) AS u(day)",
    f"m.created_at >= {DAY_START} AND m.created_at < {DAY_END}",
)
HOUR_SQL = _period_sql(
    T["hour"],
    {"hour": "u.hour"},
    "unnest(%(hours)s::timestamptz[]) AS u(hour)",
    "m.created_at >= u.hour AND m.created_at < u.hour + interval '1 hour'",
)

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
RETURNING (m.created_at AT TIME ZONE %(tz)s)::date, date_trunc('hour', m.created_at, 'UTC')
"""


# The /metrics counters (MetricsCounter) of the runs that ended in [since, through): runs by
# workflow and final status, their side effects committed (compensated ones included) and
# compensated, and their failed tool attempts (from their stored rows). An ended run never
# changes again, so each is counted once, when the mark passes its end.
ENDED_COUNTS_SQL = f"""
WITH ended AS MATERIALIZED (
  SELECT r.id, r.workflow, r.status FROM {T["run"]} r
  WHERE r.finished_at >= %(since)s AND r.finished_at < %(through)s
    AND r.status = ANY(%(terminal)s)
)
SELECT 'runs', workflow, status, count(*) FROM ended GROUP BY 2, 3
UNION ALL
SELECT 'committed', e.tool, '', count(*) FROM ended JOIN {T["effect"]} e ON e.run_id = ended.id
WHERE e.committed_at IS NOT NULL GROUP BY 2
UNION ALL
SELECT 'compensated', e.tool, '', count(*) FROM ended JOIN {T["effect"]} e ON e.run_id = ended.id
WHERE e.status = 'compensated' GROUP BY 2
UNION ALL
SELECT 'failures', t.tool, t.cls, sum(t.n) FROM ended JOIN {T["metrics"]} m ON m.run_id = ended.id
CROSS JOIN LATERAL unnest(m.tool_names, m.tool_classes, m.tool_counts) AS t(tool, cls, n)
WHERE t.cls <> '' GROUP BY 2, 3"""
# The issue-18 tallies of a stored row `m` behind /metrics, as (name, value) rows: missing
# metadata by cause, takeover cost (durations summed in ms, for a BigInteger counter), resumes
# and the duplicates after them.
RECOVERY_TALLIES = [
    "recovery_missing_workflow",
    "recovery_missing_step",
    "recovery_missing_wait",
    "takeovers_ended",
    "takeover_actions",
    "takeovers_answered",
    "takeovers_needing_engineer",
    "resumes",
    "resumes_with_duplicate",
    "duplicates_after_resume",
]


def recovery_sums(rows: str, row: str) -> str:
    """A SELECT of ('recovery', name, '', n) rows: RECOVERY_TALLIES and `takeover_ms` summed
    over `rows` (a FROM clause; `row` names its stored row), in one pass over them; no rows
    when `rows` has none. Takeover durations are rounded to the millisecond per run."""
    names = [*RECOVERY_TALLIES, "takeover_ms"]
    sums = [f"sum({row}.{name})::bigint" for name in RECOVERY_TALLIES]
    sums.append(
        f"sum((SELECT COALESCE(round(sum(x) * 1000), 0) FROM unnest({row}.takeover_s) AS x))"
        "::bigint"
    )
    columns = ", ".join(f"{expr} AS n{i}" for i, expr in enumerate(sums))
    pairs = ", ".join(f"('{name}', s.n{i})" for i, name in enumerate(names))
    return (
        f"SELECT 'recovery', t.name, '', t.n FROM (SELECT {columns} FROM {rows} "
        f"HAVING count(*) > 0) s CROSS JOIN LATERAL (VALUES {pairs}) AS t(name, n)"
    )


ENDED_COUNTS_SQL += f"""
UNION ALL
{recovery_sums(f"ended JOIN {T['metrics']} m ON m.run_id = ended.id", "m")}"""
ADVANCE_COUNTERS_SQL = f"""
WITH counts(family, name, detail, n) AS ({ENDED_COUNTS_SQL}),
added AS (
  INSERT INTO {T["counter"]} AS c (family, name, detail, value)
  SELECT family, name, detail, n FROM counts
  ON CONFLICT (family, name, detail) DO UPDATE SET value = c.value + EXCLUDED.value
)
INSERT INTO {T["mark"]} (name, through) VALUES ('counters', %(through)s)
ON CONFLICT (name) DO UPDATE SET through = EXCLUDED.through"""


def advance_counters(cursor, params: dict) -> None:
    """Count the runs that ended since the counters' mark and before the stored rows'
    high-water mark (each has its row), and move the mark there. In the rollup's lock."""
    cursor.execute(f"SELECT through FROM {T['mark']} WHERE name = 'counters' FOR UPDATE")
    row = cursor.fetchone()
    since, through = (row[0] if row else EPOCH), high_water(cursor)
    if through > since:
        cursor.execute(ADVANCE_COUNTERS_SQL, {**params, "since": since, "through": through})


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
    this_hour = now.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
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
                    _rebuild_periods(cursor, params, written, today, this_hour)
            if progress:
                progress(stored)
            if len(batch) < batch_size:
                break
            if finder is ROLLUP_ENDED_SQL:
                # Every run that ended before the batch's last end now has its row.
                since = batch[-1][1]
    _build_missing_days(params, today, MAX_CUSTOM_DAYS + 1 if full else 3)
    _build_missing_hours(params, this_hour, (MAX_CUSTOM_DAYS + 1) * 24 if full else 48)
    with no_jit(), connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [ROLLUP_LOCK])
        advance_counters(cursor, params)
    return stored


def _rebuild_periods(cursor, params: dict, written: list, today: date, this_hour) -> None:
    """The day and hour rows of the past days and hours whose ended runs just got a row."""
    days = sorted({day for day, _hour in written if day < today})
    hours = sorted({hour for _day, hour in written if hour < this_hour})
    if days:
        cursor.execute(DAY_SQL, {**params, "days": days})
    if hours:
        cursor.execute(HOUR_SQL, {**params, "hours": hours})


def _build_missing_hours(params: dict, this_hour: datetime, lookback: int) -> None:
    """Build the hour rows of the last `lookback` whole hours that have ended runs but no row."""
    with no_jit(), connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [ROLLUP_LOCK])
        cursor.execute(
            f"""SELECT DISTINCT date_trunc('hour', m.created_at, 'UTC') AS hour
            FROM {T["metrics"]} m
            WHERE m.created_at >= %(from)s AND m.created_at < %(to)s
              AND NOT EXISTS (SELECT 1 FROM {T["hour"]} h
                              WHERE h.hour = date_trunc('hour', m.created_at, 'UTC'))""",
            {"from": this_hour - timedelta(hours=lookback), "to": this_hour},
        )
        hours = [hour for (hour,) in cursor.fetchall()]
        if hours:
            cursor.execute(HOUR_SQL, {**params, "hours": hours})


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
            WHERE m.created_at >= %(from)s AND m.created_at < %(to)s
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

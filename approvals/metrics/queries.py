"""Reading the figures: a window's sums (stored day rows, stored run rows, and the runs computed
live by the same FACTS SQL), the all-time tool failures, and the state of things now.

A fixed number of queries, whatever the amount of data; docs/metrics.md has the figures.
"""

from __future__ import annotations

import json
import logging
import threading
import time as time_module
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from django.db import connection
from django.utils import timezone

from approvals.metrics import sketch
from approvals.metrics.facts import (
    COHORT_SQL,
    FACT_COLUMNS,
    NO_CURRENT_ROW,
    fact_params,
    facts_sql,
)
from approvals.metrics.sql import DAY_END, DAY_START, T, durations_of
from approvals.metrics.store import EPOCH, HIGH_WATER_MARGIN
from approvals.metrics.tables import SUM_FIELDS, TOOL_FIELDS, VALUE_FIELDS
from approvals.metrics.window import Window
from runs.models import ExternalMismatch, Step

logger = logging.getLogger("taskpilots.metrics")

# A run, step or side effect stuck this long in a state that should not last is an alert.
STALE_MINUTES = 10

# A window's rows (see Coverage): the day rows of its whole past days, the hour rows of its
# whole past hours that no day row covers, and run rows for the rest: the stored rows of the
# runs started in the spans no day or hour row covers (the window's partial first and last
# hours, the current hour, any day or hour whose row is missing), and the runs computed live.

# The runs without a current stored row (running, just changed, or not rolled up yet) are
# computed live. A day or hour row sums every stored row of its runs, so the stored row of such
# a run, if it has one, is taken back out of its day or hour row (see _rows_ctes).
_LIVE_FILTER = f"""r.created_at >= %(start)s AND r.created_at < %(end)s AND {NO_CURRENT_ROW}"""
# Where such runs are, once the rollup runs: open runs (the status index) and runs that ended
# after the stored rows' high-water mark (run_finished_idx). WINDOW_SQL checks that the rows
# it adds up cover every run of the window; if they do not (runs loaded with old ends after
# the rollup passed them), over_rows() falls back to LIVE_IDS_ALL_SQL.
LIVE_IDS_SQL = f"""
SELECT r.id FROM {T["run"]} r
-- An open run's current row is an open one (finished = 0): the two sides of one hash join.
LEFT JOIN {T["metrics"]} m ON m.run_id = r.id AND m.finished = 0
  AND m.created_at >= %(start)s AND m.created_at < %(end)s
WHERE r.status = ANY(%(open)s) AND r.created_at >= %(start)s AND r.created_at < %(end)s
  AND m.event_seq IS DISTINCT FROM r.event_seq
UNION ALL
SELECT r.id FROM {T["run"]} r
WHERE r.finished_at >= %(recent)s AND r.status = ANY(%(terminal)s) AND {_LIVE_FILTER}"""
LIVE_IDS_ALL_SQL = f"SELECT r.id FROM {T['run']} r WHERE {_LIVE_FILTER}"

# Which day and hour rows a window could use (with when they were computed and their row
# version: their sketches are kept in memory by those), and the stored rows' latest end.
COVERAGE_SQL = f"""
SELECT 'day', d.day, NULL::timestamptz, d.computed_at, d.xmin::text FROM {T["day"]} d
WHERE d.tz = %(tz)s AND d.day >= %(first_day)s AND d.day < %(last_day)s
UNION ALL
SELECT 'hour', NULL, h.hour, h.computed_at, h.xmin::text FROM {T["hour"]} h
WHERE h.hour >= %(first_hour)s AND h.hour < %(last_hour)s
  AND NOT EXISTS (SELECT 1 FROM {T["day"]} u WHERE u.tz = %(tz)s
                  AND u.day >= %(first_day)s AND u.day < %(last_day)s
                  AND h.hour >= {DAY_START} AND h.hour < {DAY_END})
UNION ALL
SELECT 'high', NULL, max(m.finished_at), NULL, NULL FROM {T["metrics"]} m"""

# The columns every row of a window has (a day's, an hour's, a run's), in this order: a day or
# hour row's durations are its sketch, read apart (PERIOD_SKETCHES_SQL).
_NO_DURATIONS = ", ".join(f"'{{}}'::float8[] AS {name}" for name in VALUE_FIELDS)
_NO_SKETCH = (
    "'{}'::smallint[] AS sketch_kinds, '{}'::int[] AS sketch_bins, '{}'::int[] AS sketch_counts"
)
_COUNTS_AND_TOOLS = ", ".join([*SUM_FIELDS, *TOOL_FIELDS])
_PERIOD_COLUMNS = f"{_COUNTS_AND_TOOLS}, {_NO_DURATIONS}, {_NO_SKETCH}"
_RUN_COLUMNS = f"{_COUNTS_AND_TOOLS}, {', '.join(VALUE_FIELDS)}, {_NO_SKETCH}"
_STALE_COLUMNS = ", ".join(f"m.{name}" for name in [*SUM_FIELDS, *TOOL_FIELDS, *VALUE_FIELDS])
_BUCKET_OF = "date_trunc(%(bucket)s, {} AT TIME ZONE %(tz)s)"
# `live` when no run is computed live: no rows, the same columns.
NO_LIVE = f"SELECT {FACT_COLUMNS} FROM {T['metrics']} WHERE false"
_NOT_LIVE = "NOT EXISTS (SELECT 1 FROM live l WHERE l.run_id = m.run_id)"


# Each part reads its rows through an index. `src` is materialized: the sums read it three
# times, and a single plan of it keeps planning short (the window's rows are few: periods,
# partial hours, runs that move). `sign` is -1 for a row taken out again.
def _rows_ctes(live: str) -> str:
    return f"""
WITH live AS MATERIALIZED ({live}),
src AS MATERIALIZED (
  SELECT {_PERIOD_COLUMNS}, d.day::timestamp AS bucket, 1 AS sign FROM {T["day"]} d
  WHERE d.tz = %(tz)s AND d.day = ANY(%(days)s::date[])
  UNION ALL
  SELECT {_PERIOD_COLUMNS}, {_BUCKET_OF.format("h.hour")}, 1 FROM {T["hour"]} h
  WHERE h.hour = ANY(%(hours)s::timestamptz[])
  UNION ALL
  SELECT {_RUN_COLUMNS}, {_BUCKET_OF.format("m.created_at")}, 1
  FROM unnest(%(spans_lo)s::timestamptz[], %(spans_hi)s::timestamptz[]) AS s(lo, hi)
  JOIN {T["metrics"]} m ON m.created_at >= s.lo AND m.created_at < s.hi
  WHERE {_NOT_LIVE}
  UNION ALL
  -- The stale stored rows of the runs computed live, out of the day and hour rows again.
  SELECT {_STALE_COLUMNS}, {_NO_SKETCH}, {_BUCKET_OF.format("m.created_at")}, -1
  FROM live l JOIN {T["metrics"]} m ON m.run_id = l.run_id
  WHERE EXISTS (SELECT 1 FROM unnest(%(covered_lo)s::timestamptz[], %(covered_hi)s::timestamptz[])
                AS c(lo, hi) WHERE m.created_at >= c.lo AND m.created_at < c.hi)
  UNION ALL
  SELECT {_RUN_COLUMNS}, {_BUCKET_OF.format("m.created_at")}, 1 FROM live m
)
"""


# The sums of `src`'s rows, per trend bucket and for them all (bucket NULL), as (part, bucket,
# jsonb) rows: "counts", "tools", and "sketch": one per bucket, of the durations of its run rows
# (window_rows() adds them to the sketches of its day and hour rows).
_COUNTS = {name: f"sum(sign * {name})" for name in SUM_FIELDS}
_SUMS = f"""
counts AS (
  SELECT bucket, {", ".join(f"{expr} AS {name}" for name, expr in _COUNTS.items())}
  FROM src GROUP BY GROUPING SETS ((bucket), ())
),
sketches AS (
  SELECT bucket, array_agg(kind::smallint ORDER BY kind, bin) AS kinds,
    array_agg(bin ORDER BY kind, bin) AS bins, array_agg(n ORDER BY kind, bin) AS counts
  FROM (
    SELECT src.bucket, v.kind, {sketch.bin_sql("v.x")} AS bin, sum(src.sign)::int AS n
    FROM src CROSS JOIN {durations_of("src")} v
    WHERE {" + ".join(f"cardinality(src.{name})" for name in VALUE_FIELDS)} > 0
    GROUP BY 1, 2, 3
  ) entries
  GROUP BY bucket
),
tools AS (
  SELECT t.tool, t.failure_class, sum(src.sign * t.n) AS n
  FROM src CROSS JOIN LATERAL unnest(src.tool_names, src.tool_classes, src.tool_counts)
    AS t(tool, failure_class, n)
  GROUP BY 1, 2
)
SELECT 'counts' AS part, bucket, to_jsonb(counts) - 'bucket' AS data,
  NULL::smallint[] AS kinds, NULL::int[] AS bins, NULL::int[] AS counts FROM counts
UNION ALL SELECT 'sketch', bucket, NULL, kinds, bins, counts FROM sketches
UNION ALL SELECT 'tools', NULL::timestamp, to_jsonb(tools), NULL, NULL, NULL FROM tools"""
# How many runs the window has, to check the rows above stand for every one of them: counted
# outside the day rows' days, and per day for the days whose count this process has not kept
# (Coverage.expected: a past day's runs stay as they are, so its count is kept with its row).
_EXPECTED = f"""
UNION ALL SELECT 'expected', NULL::timestamp, to_jsonb(count(*)), NULL, NULL, NULL
  FROM unnest(%(count_lo)s::timestamptz[], %(count_hi)s::timestamptz[]) AS s(lo, hi)
  JOIN {T["run"]} r ON r.created_at >= s.lo AND r.created_at < s.hi
UNION ALL SELECT 'expected_day', c.day::timestamp, to_jsonb(count(r.id)), NULL, NULL, NULL
  FROM unnest(%(count_days)s::date[], %(count_days_lo)s::timestamptz[],
              %(count_days_hi)s::timestamptz[]) AS c(day, lo, hi)
  LEFT JOIN {T["run"]} r ON r.created_at >= c.lo AND r.created_at < c.hi
  GROUP BY c.day
UNION ALL SELECT 'day', NULL, to_jsonb(d.day), d.sketch_kinds, d.sketch_bins, d.sketch_counts
  FROM {T["day"]} d WHERE d.tz = %(tz)s AND d.day = ANY(%(sketch_days)s::date[])
UNION ALL SELECT 'hour', NULL, to_jsonb(h.hour), h.sketch_kinds, h.sketch_bins, h.sketch_counts
  FROM {T["hour"]} h WHERE h.hour = ANY(%(sketch_hours)s::timestamptz[])"""
# With the runs %(ids)s computed live; and the same when there are none, without planning FACTS
# (a few ms of planning for a statement this size).
WINDOW_SQL = f"{_rows_ctes(facts_sql(COHORT_SQL))},\n{_SUMS}\n{_EXPECTED}"
WINDOW_NO_LIVE_SQL = f"{_rows_ctes(NO_LIVE)},\n{_SUMS}\n{_EXPECTED}"
# The sums of the runs %(ids)s, wherever they started, all computed live (one bucket, NULL).
SEED_SQL = f"""
WITH live AS MATERIALIZED ({facts_sql(COHORT_SQL)}),
src AS NOT MATERIALIZED (
  SELECT {_RUN_COLUMNS}, NULL::timestamp AS bucket, 1 AS sign FROM live
),
{_SUMS}
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
    AS needing_human,
  (SELECT count(*) FROM {ExternalMismatch._meta.db_table} m WHERE m.resolved_at IS NULL)
    AS external_mismatches
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


def _whole_hours(window: Window, now: datetime) -> tuple[datetime, datetime]:
    """The window's whole past hours [first, last), which MetricsHour rows can stand for."""
    start = window.start.astimezone(UTC)
    first = start.replace(minute=0, second=0, microsecond=0)
    if first < start:
        first += timedelta(hours=1)
    last = min(window.end, now).astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    return first, max(first, last)


def window_params(window: Window, now: datetime) -> dict:
    """The parameters of the window's queries (COVERAGE_SQL; Coverage adds the rest)."""
    first_day, last_day = _whole_days(window, now)
    first_hour, last_hour = _whole_hours(window, now)
    return {
        "first_day": first_day,
        "last_day": last_day,
        "first_hour": first_hour,
        "last_hour": last_hour,
        "start": window.start,
        "end": window.end,
        "bucket": window.bucket,
        "tz": timezone.get_current_timezone_name(),
        **fact_params(),
    }


@dataclass
class Coverage:
    """Which rows stand for which runs of a window: the day rows of its whole past days, the
    hour rows of its whole past hours outside those days (hours that start on the hour in the
    current zone, so that each lies in one trend bucket), and run rows for the spans left."""

    bucket: str
    days: list[date] = field(default_factory=list)
    hours: list[datetime] = field(default_factory=list)
    # Each day or hour row's version (computed_at, xmin): its sketch is read once per process
    # and kept by it.
    computed: dict[tuple, tuple] = field(default_factory=dict)
    covered: list[tuple[datetime, datetime]] = field(default_factory=list)
    spans: list[tuple[datetime, datetime]] = field(default_factory=list)
    high_water: datetime = EPOCH
    start: datetime = EPOCH
    end: datetime = EPOCH
    day_spans: dict[date, tuple[datetime, datetime]] = field(default_factory=dict)
    # The day counts params() found kept (expected() adds them up).
    kept_runs: dict[date, int] = field(default_factory=dict)

    @classmethod
    def read(cls, cursor, params: dict) -> Coverage:
        cursor.execute(COVERAGE_SQL, params)
        rows = cursor.fetchall()
        tz = timezone.get_current_timezone()
        coverage = cls(params["bucket"], start=params["start"], end=params["end"])
        for kind, day, hour, *version in rows:
            if kind == "high" and hour is not None:
                coverage.high_water = hour - HIGH_WATER_MARGIN
            elif kind == "day":
                start = timezone.make_aware(datetime.combine(day, time(0)), tz)
                end = timezone.make_aware(datetime.combine(day + timedelta(days=1), time(0)), tz)
                coverage.days.append(day)
                coverage.computed[("day", day)] = tuple(version)
                coverage.covered.append((start, end))
                coverage.day_spans[day] = (start, end)
        days = set(coverage.days)
        for kind, _day, hour, *version in rows:
            local = timezone.localtime(hour, tz) if kind == "hour" else None
            # An hour that starts on the hour here lies in one day (and one hourly bucket).
            if local is not None and local.minute == 0 and local.date() not in days:
                coverage.hours.append(hour)
                coverage.computed[("hour", hour)] = tuple(version)
                coverage.covered.append((hour, hour + timedelta(hours=1)))
        coverage.covered.sort()
        coverage.spans = _gaps(params["start"], params["end"], coverage.covered)
        return coverage

    def params(self) -> dict:
        unknown = [key for key in self.computed if _SKETCHES.get(self._cache_key(key)) is None]
        self.kept_runs = {}
        for day in self.day_spans:
            kept = _DAY_RUNS.get(self._cache_key(("day", day)))
            if kept is not None and time_module.monotonic() - kept[1] < DAY_RUNS_MAX_AGE:
                self.kept_runs[day] = kept[0]
        uncounted = [
            (day, lo, hi) for day, (lo, hi) in self.day_spans.items() if day not in self.kept_runs
        ]
        outside_days = _gaps(self.start, self.end, sorted(self.day_spans.values()))
        return {
            "count_lo": [lo for lo, _hi in outside_days],
            "count_hi": [hi for _lo, hi in outside_days],
            "count_days": [day for day, _lo, _hi in uncounted],
            "count_days_lo": [lo for _day, lo, _hi in uncounted],
            "count_days_hi": [hi for _day, _lo, hi in uncounted],
            "days": self.days,
            "hours": self.hours,
            "sketch_days": [day for kind, day in unknown if kind == "day"],
            "sketch_hours": [hour for kind, hour in unknown if kind == "hour"],
            "covered_lo": [lo for lo, _hi in self.covered],
            "covered_hi": [hi for _lo, hi in self.covered],
            "spans_lo": [lo for lo, _hi in self.spans],
            "spans_hi": [hi for _lo, hi in self.spans],
            "recent": self.high_water,
        }

    def expected(self, outside_days: int, counted: dict[date, int]) -> int:
        """The window's runs: those outside the day rows' days, and each day's (`counted` by
        the query, the others kept from an earlier request). Runs are never deleted and start
        when they are created, so a past day's count only changes when runs are written into
        the past (an import); it is kept with its day row's version (a row the rollup rebuilt
        is counted again) for DAY_RUNS_MAX_AGE, so such runs are still found missing from the
        stored rows within minutes, while the other requests skip counting every run."""
        now = time_module.monotonic()
        for day, runs in counted.items():
            _DAY_RUNS.put(self._cache_key(("day", day)), (runs, now))
        return outside_days + sum(counted.values()) + sum(self.kept_runs.values())

    def _cache_key(self, key: tuple) -> tuple:
        return (timezone.get_current_timezone_name(), *key, *self.computed[key])

    def bucket_of(self, key: tuple) -> datetime:
        """The trend bucket of a day or hour row, as WINDOW_SQL names it (naive, local)."""
        kind, at = key
        if kind == "day":
            return datetime.combine(at, time(0))
        local = timezone.localtime(at, timezone.get_current_timezone()).replace(tzinfo=None)
        return local if self.bucket == "hour" else local.replace(hour=0)

    def sketches(self, fetched: dict[tuple, dict]) -> tuple[dict[datetime, list[dict]], list]:
        """The day and hour rows' sketches by trend bucket (`fetched` from the database, the
        others from memory), and the same for the window's total: the day rows' added up once
        (and kept, by the versions of those rows), and the hour rows'."""
        parts_of: dict[tuple, dict] = {}
        for key in self.computed:
            parts = fetched.get(key)
            if parts is None:
                parts = _SKETCHES.get(self._cache_key(key))
            else:
                _SKETCHES.put(self._cache_key(key), parts)
            parts_of[key] = parts
        by_bucket: dict[datetime, list[dict]] = {}
        for key, parts in parts_of.items():
            by_bucket.setdefault(self.bucket_of(key), []).append(parts)
        days = [key for key in parts_of if key[0] == "day"]
        total = [parts for key, parts in parts_of.items() if key[0] == "hour"]
        if days:
            whole = ("days", *(self._cache_key(key) for key in days))
            added = _SKETCHES.get(whole)
            if added is None:
                added = sketch.added([parts_of[key] for key in days])
                _SKETCHES.put(whole, added)
            total.append(added)
        return by_bucket, total


class _Sketches:
    """What was read of day and hour rows (their sketches, a day's count of runs) by (zone,
    kind, key, computed_at, xmin), the last `limit` used: a rebuilt row is a new row version,
    so what is kept is never out of date."""

    def __init__(self, limit: int):
        self.limit = limit
        self.kept: OrderedDict[tuple, dict] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, key: tuple) -> dict | None:
        with self.lock:
            found = self.kept.get(key)
            if found is not None:
                self.kept.move_to_end(key)
            return found

    def put(self, key: tuple, parts: dict) -> None:
        with self.lock:
            self.kept[key] = parts
            self.kept.move_to_end(key)
            while len(self.kept) > self.limit:
                self.kept.popitem(last=False)


# A year of days and a few days of hours (a day's sketch holds ~1,500 buckets, an hour's ~300).
_SKETCHES = _Sketches(limit=500)
_DAY_RUNS = _Sketches(limit=500)
# How long a past day's count of runs is kept (Coverage.expected).
DAY_RUNS_MAX_AGE = 300.0


def _gaps(start: datetime, end: datetime, covered: list[tuple[datetime, datetime]]) -> list:
    """[start, end) less the sorted, disjoint spans `covered`."""
    gaps, at = [], start
    for lo, hi in covered:
        if lo > at:
            gaps.append((at, min(lo, end)))
        at = max(at, hi)
    if at < end:
        gaps.append((at, end))
    return [(lo, hi) for lo, hi in gaps if lo < hi]


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


def over_rows(cursor, params: dict) -> tuple[list, bool, int, Coverage]:
    """WINDOW_SQL with the runs that lack a current row computed live.

    Which stored rows stand for which runs comes first (Coverage). The runs without a current
    row are looked for where the rollup leaves them (LIVE_IDS_SQL). If the result does not cover
    every run of the window, the rollup missed some: the query runs again with every run that
    lacks a current row. Returns the result, whether runs were missed, how many runs were
    computed live, and the coverage.
    """
    coverage = Coverage.read(cursor, params)
    params.update(coverage.params())
    cursor.execute(LIVE_IDS_SQL, params)
    params["ids"] = [run_id for (run_id,) in cursor.fetchall()]
    cursor.execute(WINDOW_SQL if params["ids"] else WINDOW_NO_LIVE_SQL, params)
    result = cursor.fetchall()
    if window_covered(result, coverage):
        return result, False, len(params["ids"]), coverage
    logger.warning("metrics: the rollup missed runs; run rollup_metrics --full")
    cursor.execute(LIVE_IDS_ALL_SQL, params)
    params["ids"] = [run_id for (run_id,) in cursor.fetchall()]
    cursor.execute(WINDOW_SQL if params["ids"] else WINDOW_NO_LIVE_SQL, params)
    return cursor.fetchall(), True, len(params["ids"]), coverage


def window_covered(result: list, coverage: Coverage) -> bool:
    runs = outside_days = 0
    counted: dict[date, int] = {}
    for part, bucket, text, *_sketch in result:
        if part == "expected":
            outside_days = json.loads(text)
        elif part == "expected_day":
            counted[bucket.date()] = json.loads(text)
        elif part == "counts" and bucket is None:
            runs = json.loads(text).get("runs") or 0  # an empty window sums to NULL
    return runs == coverage.expected(outside_days, counted)


# Each kind of duration by its index in VALUE_FIELDS: the prefix of its statistics in a row
# ("close" for close_s: close_mean, close_p50, close_p95).
_PREFIXES = [name.rsplit("_", 1)[0] for name in VALUE_FIELDS]


def window_rows(
    result: list, coverage: Coverage | None = None
) -> tuple[dict[Any, dict], list[dict]]:
    """The sums per bucket (and for them all, None), with each kind of duration's statistics
    read from the bucket's sketches added up (its day and hour rows' and its run rows'); and the
    tool tallies."""
    rows: dict[Any, dict] = {None: {}}
    tools: list[dict] = []
    sketches: dict[Any, list[dict]] = {}
    fetched: dict[tuple, dict] = {}
    for part, bucket, text, *arrays in result:
        if part == "sketch":
            sketches.setdefault(bucket, []).append(sketch.parts(*arrays))
            continue
        data = json.loads(text)  # Django reads jsonb as text
        if part == "tools":
            tools.append(data)
        elif part == "counts":
            rows.setdefault(bucket, {}).update(data)
        elif part == "day":
            fetched[("day", date.fromisoformat(data))] = sketch.parts(*arrays)
        elif part == "hour":
            fetched[("hour", datetime.fromisoformat(data))] = sketch.parts(*arrays)
    # The window's total: the run rows' sketches, and the day and hour rows' (added up).
    every = [found for bucket_sketches in sketches.values() for found in bucket_sketches]
    if coverage is not None:
        by_bucket, periods = coverage.sketches(fetched)
        for bucket, found in by_bucket.items():
            sketches.setdefault(bucket, []).extend(found)
        every.extend(periods)
    for bucket, found in [*sketches.items(), (None, every)]:
        row = rows.setdefault(bucket, {})
        for kind, prefix in enumerate(_PREFIXES):
            stats = sketch.statistics([s[kind] for s in found if kind in s])
            for name, value in stats.items():
                row[f"{prefix}_{name}"] = value
    for row in rows.values():
        row["closed_after_failure"] = row.get("close_n", 0)
    return rows, tools

"""Prometheus text format 0.0.4 (/metrics): all-time counters and current gauges.

prometheus_client writes the text from a custom collector that reads everything in 4 queries,
whatever the history: the counters the rollup stores for the runs that ended before its mark
(MetricsCounter), plus what ended since or is still open. Counters only grow: runs are counted
once they have ended (a terminal status never changes); side effects once committed
(compensated ones included) and once compensated. Live states are gauges.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

from django.db import connection
from django.utils import timezone
from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from approvals.metrics.facts import COHORT_SQL, fact_params, facts_sql
from approvals.metrics.figures import INCONSISTENCIES, MISSING_METADATA_COLUMNS
from approvals.metrics.queries import NO_LIVE, STALE_MINUTES, current_state
from approvals.metrics.sql import T, no_jit
from approvals.metrics.store import EPOCH, RECOVERY_TALLIES, recovery_sums
from runs.models import Run

# The text format generate_latest() writes.
PROMETHEUS_CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4

# The stored counters and their mark (the rollup keeps them: store.advance_counters).
_STORED_SQL = f"""
SELECT family, name, detail, value FROM {T["counter"]}
UNION ALL SELECT 'mark', '', '', extract(epoch FROM through)::float8 FROM {T["mark"]}
WHERE name = 'counters'"""
# The columns of a stored row the scrape reads.
_ROW_COLUMNS = ", ".join(
    f"m.{name}"
    for name in ["run_id", "committed", "tool_names", "tool_classes", "tool_counts"]
    + [*RECOVERY_TALLIES, "takeover_s"]
)
# What the counters do not hold yet: the open runs (their status index) and the runs that ended
# at or after the mark (run_finished_idx).
_RECENT = f"""recent AS MATERIALIZED (
  SELECT r.id, r.workflow, r.status, r.event_seq, true AS open FROM {T["run"]} r
  WHERE r.status = ANY(%(open)s)
  UNION ALL
  SELECT r.id, r.workflow, r.status, r.event_seq, false FROM {T["run"]} r
  WHERE r.finished_at >= %(through)s AND r.status = ANY(%(terminal)s)
),
-- Their stored rows that are current (computed at the run's timeline head). An open run's
-- current row is an open one (finished = 0, runmetrics_open_idx): the open runs and the open
-- rows meet in one hash join, where a lookup per open run cost a few thousand index descents.
-- The few runs that ended since the mark are looked up by key (OFFSET 0: one lookup each).
current AS MATERIALIZED (
  SELECT {_ROW_COLUMNS} FROM recent r
  JOIN {T["metrics"]} m ON m.run_id = r.id AND m.event_seq = r.event_seq AND m.finished = 0
  WHERE r.open
  UNION ALL
  SELECT {_ROW_COLUMNS} FROM recent r CROSS JOIN LATERAL (
    SELECT * FROM {T["metrics"]} m WHERE m.run_id = r.id AND m.event_seq = r.event_seq OFFSET 0
  ) m WHERE NOT r.open
)"""


def _tallies(rows: str) -> str:
    """The failed tool attempts (by tool and class) and the recovery tallies of `rows`."""
    return f"""SELECT 'failures', t.tool, t.cls, sum(t.n) FROM {rows} f
CROSS JOIN LATERAL unnest(f.tool_names, f.tool_classes, f.tool_counts) AS t(tool, cls, n)
WHERE t.cls <> '' GROUP BY 2, 3
UNION ALL
{recovery_sums(f"{rows} f", "f")}"""


# In one query: those runs by workflow and status; their side effects committed and compensated
# by tool; the side effects whose outcome is open (side_effect_open_idx); the failures and
# tallies of their current rows; and ('live', id) for each run without one.
RECENT_SQL = f"""WITH {_RECENT},
-- Each recent run's rows through its index, never a hash of the whole ledger (OFFSET 0 keeps
-- the planner from flattening the subqueries into a join it would rather hash). A run whose
-- current row counts no committed side effect has none to read: a side effect's commit (and
-- its compensation) appends an event, which would have made the row stale.
read AS MATERIALIZED (
  SELECT r.id FROM recent r
  WHERE NOT EXISTS (SELECT 1 FROM current c WHERE c.run_id = r.id AND c.committed = 0)
),
effects AS MATERIALIZED (
  SELECT e.tool, e.status, e.committed_at FROM read r CROSS JOIN LATERAL (
    SELECT e.tool, e.status, e.committed_at FROM {T["effect"]} e WHERE e.run_id = r.id OFFSET 0
  ) e
)
SELECT 'runs', workflow, status, count(*) FROM recent GROUP BY 2, 3
UNION ALL
SELECT 'committed', tool, '', count(*) FROM effects WHERE committed_at IS NOT NULL GROUP BY 2
UNION ALL
SELECT 'compensated', tool, '', count(*) FROM effects WHERE status = 'compensated' GROUP BY 2
UNION ALL
SELECT 'open', e.tool, e.status, count(*) FROM {T["effect"]} e
WHERE e.status IN ('intended', 'unknown') GROUP BY 2, 3
UNION ALL
{_tallies("current")}
UNION ALL
SELECT 'live', r.id::text, '', 0 FROM recent r
WHERE NOT EXISTS (SELECT 1 FROM current c WHERE c.run_id = r.id)"""
# The failures and tallies of the runs without a current row (%(ids)s), computed live; and
# without planning FACTS when there are none.
LIVE_SQL = f"WITH live AS MATERIALIZED ({facts_sql(COHORT_SQL)})\n{_tallies('live')}"
NO_LIVE_SQL = f"WITH live AS MATERIALIZED ({NO_LIVE})\n{_tallies('live')}"


@dataclass
class _Scrape:
    """What one scrape reads, each list sorted."""

    runs: list[tuple[str, str, int]]  # workflow, status, runs
    committed: list[tuple[str, int]]  # tool, side effects ever committed
    compensated: list[tuple[str, int]]  # tool, side effects compensated
    open_effects: list[tuple[str, str, int]]  # tool, status (intended, unknown), side effects
    failures: list[tuple[str, str, int]]  # tool, failure class, failed attempts
    state: dict[str, int]  # current_state()
    # RECOVERY_TALLIES and takeover_ms, all time (missing metadata, takeover cost, resumes).
    recovery: dict[str, int] = field(default_factory=dict)


def _read(now: datetime) -> _Scrape:
    """Four queries whatever the history (plus the SET): the stored counters, the recent runs'
    counts (with which of them have no current row), those runs' counts computed live, and
    the state of things now."""
    with no_jit(), connection.cursor() as cursor:
        cursor.execute(_STORED_SQL)
        stored = cursor.fetchall()
        marks = [value for family, _n, _d, value in stored if family == "mark"]
        params = {**fact_params(), "through": _at(marks[0]) if marks else EPOCH}
        cursor.execute(RECENT_SQL, params)
        recent = cursor.fetchall()
        params["ids"] = [run_id for family, run_id, _d, _n in recent if family == "live"]
        cursor.execute(LIVE_SQL if params["ids"] else NO_LIVE_SQL, params)
        live = cursor.fetchall()
        state = current_state(now)
    totals: dict[str, dict[tuple, int]] = {}
    for family, name, detail, value in [*stored, *recent, *live]:
        if family not in ("mark", "live"):
            key = (name, detail)
            totals.setdefault(family, {})[key] = totals.get(family, {}).get(key, 0) + int(value)

    def rows(family: str, *, with_detail: bool = True) -> list:
        found = totals.get(family, {})
        return sorted((*key, n) if with_detail else (key[0], n) for key, n in found.items())

    return _Scrape(
        rows("runs"),
        rows("committed", with_detail=False),
        rows("compensated", with_detail=False),
        rows("open"),
        rows("failures"),
        state,
        {name: n for (name, _detail), n in totals.get("recovery", {}).items()},
    )


def _at(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


class RecoveryCollector:
    """The families of /metrics, read when collected (a registry of its own per scrape)."""

    def __init__(self, now: datetime | None = None):
        self.now = now

    def collect(self) -> Iterator[Metric]:
        scrape = _read(self.now or timezone.now())
        yield from _run_families(scrape.runs)
        yield from _side_effect_families(scrape)
        yield _family(
            CounterMetricFamily,
            "taskpilots_step_failures_total",
            "Failed tool attempts routed by the engine, by tool and failure class.",
            ["tool", "class"],
            scrape.failures,
        )
        yield from _recovery_families(scrape.recovery)
        yield GaugeMetricFamily(
            "taskpilots_runs_needing_human",
            "Runs waiting for a person (needs a person or taken over).",
            value=scrape.state["needing_human"],
        )
        yield _family(
            GaugeMetricFamily,
            "taskpilots_state_inconsistencies",
            f"State-inconsistency alerts by kind (stale after {STALE_MINUTES} minutes).",
            ["kind"],
            [(kind, scrape.state[kind]) for kind in INCONSISTENCIES],
        )
        yield GaugeMetricFamily(
            "taskpilots_external_mismatches",
            "Committed side effects their system shows missing or different (consistency check).",
            value=scrape.state["external_mismatches"],
        )


def _family(kind: type[Metric], name: str, help_text: str, labels: list[str], rows) -> Metric:
    """A family with one sample per row: its label values, then its value."""
    family = kind(name, help_text, labels=labels)
    for *values, value in rows:
        family.add_metric([str(v) for v in values], value)
    return family


def _run_families(runs: Iterable[tuple[str, str, int]]) -> Iterator[Metric]:
    ended = [row for row in runs if row[1] in Run.TERMINAL]
    yield _family(
        CounterMetricFamily,
        "taskpilots_runs_total",
        "Runs that have ended, by workflow and final status.",
        ["workflow", "status"],
        ended,
    )
    yield _family(
        GaugeMetricFamily,
        "taskpilots_runs",
        "Runs not yet ended, by workflow and current status.",
        ["workflow", "status"],
        [row for row in runs if row[1] not in Run.TERMINAL],
    )


def _side_effect_families(scrape: _Scrape) -> Iterator[Metric]:
    yield _family(
        CounterMetricFamily,
        "taskpilots_side_effects_total",
        "Side effects committed (status=committed, compensated ones included) and compensated, "
        "by tool.",
        ["tool", "status"],
        [(tool, "committed", n) for tool, n in scrape.committed]
        + [(tool, "compensated", n) for tool, n in scrape.compensated],
    )
    yield _family(
        GaugeMetricFamily,
        "taskpilots_side_effects_open",
        "Side effects whose outcome is not settled yet (intended or unknown), by tool.",
        ["tool", "status"],
        scrape.open_effects,
    )


def _recovery_families(tally: dict[str, int]) -> Iterator[Metric]:
    """Recoveries stopped by missing metadata, takeover cost, duplicates after a resume."""
    yield _family(
        CounterMetricFamily,
        "taskpilots_recovery_failed_missing_metadata",
        "Resumes the engine handed to a person because metadata it needs was missing, by cause.",
        ["cause"],
        [(cause, tally.get(col, 0)) for cause, col in MISSING_METADATA_COLUMNS.items()],
    )
    # A count and a sum (rate() of the one over the other is the mean); the median and p90 are
    # the dashboard's, over a window.
    yield CounterMetricFamily(
        "taskpilots_takeovers_ended",
        "Takeovers ended (released, or ended by a cancel or a rejection).",
        value=tally.get("takeovers_ended", 0),
    )
    yield CounterMetricFamily(
        "taskpilots_takeover_handling_seconds",
        "Time spent in ended takeovers, from taking a run over to releasing it, summed.",
        value=tally.get("takeover_ms", 0) / 1000,
    )
    yield CounterMetricFamily(
        "taskpilots_takeover_actions",
        "Human decisions recorded during takeovers (their own take over and release aside).",
        value=tally.get("takeover_actions", 0),
    )
    answered = tally.get("takeovers_answered", 0)
    needing = tally.get("takeovers_needing_engineer", 0)
    yield _family(
        CounterMetricFamily,
        "taskpilots_takeovers_released",
        "Released takeovers, by the person's answer to 'Did this need an engineer?'.",
        ["needed_engineer"],
        [("yes", needing), ("no", answered - needing)],
    )
    yield CounterMetricFamily(
        "taskpilots_resumes",
        "Runs resumed (wait resolved or a person's action, released to the engine, or a "
        "crashed worker's step taken back).",
        value=tally.get("resumes", 0),
    )
    yield CounterMetricFamily(
        "taskpilots_resumes_with_duplicate",
        "Resumes followed by at least one duplicated side effect before the next resume.",
        value=tally.get("resumes_with_duplicate", 0),
    )
    yield CounterMetricFamily(
        "taskpilots_duplicates_after_resume",
        "Duplicated side effects (a step's second or later committed key) sent after a resume.",
        value=tally.get("duplicates_after_resume", 0),
    )


def prometheus_text(now: datetime | None = None) -> str:
    """The /metrics page: the collector's families in text format 0.0.4."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RecoveryCollector(now))
    return generate_latest(registry).decode()

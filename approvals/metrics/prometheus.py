"""Prometheus text format 0.0.4 (/metrics): all-time counters and current gauges.

prometheus_client writes the text from a custom collector that reads everything in 7 queries,
whatever the history (the failure counter is added up from the stored rows). Counters only
grow: runs are counted once they have ended (a terminal status never changes); side effects once
committed (compensated ones included) and once compensated. Live states are gauges.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connection
from django.utils import timezone
from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from approvals.metrics.figures import INCONSISTENCIES
from approvals.metrics.queries import (
    STALE_MINUTES,
    TOOL_FAILURES_SQL,
    current_state,
    over_rows,
    window_params,
)
from approvals.metrics.sql import T, no_jit
from approvals.metrics.window import Window
from runs.models import Run

# The text format generate_latest() writes.
PROMETHEUS_CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4

_RUNS_SQL = f"SELECT workflow, status, count(*) FROM {T['run']} GROUP BY workflow, status"
_EFFECTS_SQL = f"""
SELECT tool, status, count(*), count(*) FILTER (WHERE committed_at IS NOT NULL)
FROM {T["effect"]} GROUP BY tool, status"""


@dataclass
class _Scrape:
    """What one scrape reads, each list sorted."""

    runs: list[tuple[str, str, int]]  # workflow, status, runs
    effects: list[tuple[str, str, int, int]]  # tool, status, side effects, ever committed
    failures: list[tuple[str, str, int]]  # tool, failure class, failed attempts
    state: dict[str, int]  # current_state()


def _read(now: datetime) -> _Scrape:
    with no_jit(), connection.cursor() as cursor:
        cursor.execute(_RUNS_SQL)
        runs = cursor.fetchall()
        cursor.execute(_EFFECTS_SQL)
        effects = cursor.fetchall()
        failures = _all_time_failures(cursor, now)
        state = current_state(now)
    return _Scrape(sorted(runs), sorted(effects), sorted(failures), state)


def _all_time_failures(cursor, now: datetime) -> list[tuple[str, str, int]]:
    """Tool failures of every run ever, from the day rows, the run rows and the live runs, in
    four queries (whatever the history) plus two more when the rollup missed runs."""
    cursor.execute(f"SELECT min(created_at) FROM {T['run']}")
    first = cursor.fetchone()[0]
    if first is None:
        return []
    # Up to now (and at least three days long, so that it is bucketed by day).
    window = Window("all", first, max(now + timedelta(microseconds=1), first + timedelta(days=3)))
    params = window_params(window, now)
    result, _missed = over_rows(cursor, TOOL_FAILURES_SQL, params, _tools_covered)
    return [(tool, cls, int(n)) for tool, cls, n in result if tool != ""]


def _tools_covered(result: list) -> bool:
    totals = {cls: n for tool, cls, n in result if tool == ""}
    return totals.get("runs") == totals.get("expected")


class RecoveryCollector:
    """The families of /metrics, read when collected (a registry of its own per scrape)."""

    def __init__(self, now: datetime | None = None):
        self.now = now

    def collect(self) -> Iterator[Metric]:
        scrape = _read(self.now or timezone.now())
        yield from _run_families(scrape.runs)
        yield from _side_effect_families(scrape.effects)
        yield _family(
            CounterMetricFamily,
            "taskpilots_step_failures_total",
            "Failed tool attempts routed by the engine, by tool and failure class.",
            ["tool", "class"],
            scrape.failures,
        )
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


def _side_effect_families(effects: Iterable[tuple[str, str, int, int]]) -> Iterator[Metric]:
    committed: dict[str, int] = {}
    compensated: dict[str, int] = {}
    open_effects = []
    for tool, status, n, ever_committed in effects:
        committed[tool] = committed.get(tool, 0) + ever_committed
        if status == "compensated":
            compensated[tool] = n
        if status in ("intended", "unknown"):
            open_effects.append((tool, status, n))
    yield _family(
        CounterMetricFamily,
        "taskpilots_side_effects_total",
        "Side effects committed (status=committed, compensated ones included) and compensated, "
        "by tool.",
        ["tool", "status"],
        [(tool, "committed", n) for tool, n in sorted(committed.items())]
        + [(tool, "compensated", n) for tool, n in sorted(compensated.items())],
    )
    yield _family(
        GaugeMetricFamily,
        "taskpilots_side_effects_open",
        "Side effects whose outcome is not settled yet (intended or unknown), by tool.",
        ["tool", "status"],
        open_effects,
    )


def prometheus_text(now: datetime | None = None) -> str:
    """The /metrics page: the collector's families in text format 0.0.4."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RecoveryCollector(now))
    return generate_latest(registry).decode()

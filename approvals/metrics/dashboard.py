"""The figures put together: a window's for the dashboard (with the state of things now), or a
given set of runs' (seed_figures, for a drill's report)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from django.db import connection
from django.utils import timezone

from approvals.metrics.facts import fact_params
from approvals.metrics.figures import FIGURES, INCONSISTENCIES, Data, Figure
from approvals.metrics.queries import (
    SEED_SQL,
    STALE_MINUTES,
    current_state,
    over_rows,
    window_params,
    window_rows,
)
from approvals.metrics.sql import no_jit
from approvals.metrics.window import Window

# Above this many runs computed live (or a tenth of the window), the page says the rollup is
# behind.
ROLLUP_BEHIND_RUNS = 1000


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
            "external_mismatches": self.inconsistencies.get("external_mismatches", 0),
            "rollup": {"live_runs": self.live_runs, "behind": self.rollup_behind},
        }


def _minutes() -> dict:
    return {"minutes": STALE_MINUTES}


def compute(window: Window, *, now: datetime | None = None) -> Dashboard:
    """Every figure of the dashboard: which stored rows cover the window, the live runs, one
    query over the window, one for now, whatever the size (plus the SET that turns JIT off)."""
    now = now or timezone.now()
    params = window_params(window, now)
    with no_jit(), connection.cursor() as cursor:
        result, missed, live_runs, coverage = over_rows(cursor, params)
        rows, tools = window_rows(result, coverage)
        state = current_state(now)
    data = Data(window.buckets(), rows, tools)
    needing_human = state.pop("needing_human")
    figures = [fn(data) for fn in FIGURES]
    runs = int(data.total().get("runs") or 0)
    return Dashboard(window, data.buckets, figures, state, needing_human, runs, live_runs, missed)


def seed_figures(run_ids: Iterable) -> dict[str, dict]:
    """Every figure of the dashboard for the given runs, wherever they started, computed live by
    the same FACTS SQL (one query, plus the SET that turns JIT off). Made for a drill's report:
    the figures of the runs it started, by the dashboard's definitions.

    Returns {figure key: its JSON form}, as the dashboard's JSON has it but without a trend:
    label, definition, unit, value, counts, and `extra` where the figure has any (the mean, the
    p95, the tool failures by tool and class).
    """
    params = {**fact_params(), "ids": [str(run_id) for run_id in run_ids]}
    with no_jit(), connection.cursor() as cursor:
        cursor.execute(SEED_SQL, params)
        rows, tools = window_rows(cursor.fetchall())
    data = Data([], rows, tools)
    report = {}
    for figure in (fn(data) for fn in FIGURES):
        report[figure.key] = figure.as_json()
        del report[figure.key]["series"]  # no buckets, no trend
    return report

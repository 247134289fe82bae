"""Prometheus text format 0.0.4 (/metrics): all-time counters and current gauges."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db import connection
from django.utils import timezone

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
    params = window_params(window, now)
    result, _missed = over_rows(cursor, TOOL_FAILURES_SQL, params, _tools_covered)
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
    with no_jit(), connection.cursor() as cursor:
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

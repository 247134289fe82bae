"""The recovery benchmark, short (docs/benchmarks.md section 4), and what a worker loads at start.

Times vary between machines and with their load: the guards are that every phase is measured
and that a killed worker's step comes back far inside the lease, never on exact figures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from taskpilots.evidence.workers import ROOT, database_url

pytestmark = pytest.mark.bench

# What a worker never needs to start: the console and its forms, the API (django-ninja and
# pydantic), the URL conf and every view (Django's system checks, which a worker skips), bulk
# actions, the metrics (their tables are models, loaded with the others; their queries and
# rollup are not), the notifications. Imported by the tasks and sweeps that use them.
DEFERRED = (
    "approvals.console",
    "approvals.forms",
    "approvals.views",
    "approvals.bulk",
    "approvals.metrics.dashboard",
    "approvals.metrics.queries",
    "approvals.metrics.store",
    "approvals.metrics.prometheus",
    "prometheus_client",
    "approvals.notifications",
    "taskpilots.urls",
    "taskpilots.api",
    "ninja",
    "pydantic",
    "mcp",
    "agents",
    "openai",
    "schemathesis",
    "jinja2",
)

_WORKER_START = """
import json, os, sys
from celery.bin.celery import celery  # the worker's command line, as `celery -A taskpilots`
from taskpilots.celery import app
from celery.apps.worker import Worker
app.loader.init_worker()  # what WorkController does first: Django, checks, the task modules
print(json.dumps(sorted(sys.modules)))
"""


@pytest.mark.django_db
def test_a_worker_start_imports_none_of_the_deferred_modules():
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["DATABASE_URL"] = database_url()
    out = subprocess.run(
        [sys.executable, "-c", _WORKER_START],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    modules = set(json.loads(out.stdout.strip().splitlines()[-1]))
    assert "runs.tasks" in modules and "approvals.tasks" in modules  # the tasks are registered
    assert "runs.engine.liveness" in modules
    loaded = sorted(m for m in DEFERRED if m in modules)
    assert not loaded, f"a worker's start imports {loaded}: defer them (approvals/tasks.py)"


def test_the_recovery_block_renders_spread_phases_and_load():
    from taskpilots.evidence.bench_recovery import render_recovery

    figure = {"p50_ms": 3900.0, "p95_ms": 4200.0, "min_ms": 3500.0, "max_ms": 4300.0, "n": 5}
    records = [
        {
            "kind": "environment",
            "at": "2026-12-04T10:00:00+00:00",
            "cpus": 2,
            "load_avg": [1, 2, 3],
        },
        {"kind": "sample", "measure": "kill_to_resume", "ms": 3900.0},
        {
            "kind": "result",
            "machine": "busy",
            "kill_to_resume": figure,
            "restart_to_resume": figure,
            "restart_phases_ms": {"spawn": 5.0, "ready": 1500.0, "resumed": 1400.0},
            "load": {"cpu_busy_pct": 97.0, "load1_mean": 6.1, "load1_max": 8.0},
        },
    ]
    text = render_recovery(records)
    assert "| busy | worker SIGKILL mid-call" in text and "**3.90 s** | 4.20 s | 3.50 s" in text
    assert "consuming 1.50 s" in text and "97% busy" in text and "1.00 / 2.00 / 3.00" in text


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(150)
def test_the_recovery_benchmark_measures_kill_restart_approval_and_event(sandbox):
    from taskpilots.evidence.bench_recovery import bench_recovery

    result = bench_recovery(samples=3, say=lambda line: None, kills=2)
    for key in (
        "kill_to_resume",
        "restart_to_resume",
        "approval_to_next_step",
        "event_to_next_step",
    ):
        assert result[key]["n"] >= 2 and 0 < result[key]["min_ms"] <= result[key]["p95_ms"], key
    # With the default lease (60 s) a killed worker's step comes back through the heartbeat:
    # anything near the lease means the heartbeat did not notice.
    assert result["lease_seconds"] == 60
    assert result["kill_to_resume"]["p95_ms"] < 20_000
    assert result["restart_to_resume"]["p95_ms"] < 20_000
    # Every point of the restarted worker's start was seen, in order, before its ready line.
    phases = result["restart_phases_ms"]
    order = ("process", "app", "django", "tasks", "heartbeat", "ready")
    assert all(key in phases for key in ("spawn", *order, "resumed")), phases
    assert [phases[k] for k in order] == sorted(phases[k] for k in order), phases
    assert phases["spawn"] <= phases["process"] + 20  # /proc counts in 10 ms ticks
    assert {s["measure"] for s in result["samples"]} == {
        "kill_to_resume",
        "restart_to_resume",
        "approval_to_next_step",
        "event_to_next_step",
    }
    assert result["load"]["cpus"] and result["machine"] == "idle"

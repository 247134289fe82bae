"""Benchmarks: what the safety costs, measured against references taken in the same run.

    python manage.py bench engine|snapshot|recovery|io|console|inbox|crash [--record FILE]

The engine benchmark is in bench_engine.py, io in bench_io.py, console and inbox in
bench_console.py and bench_live.py; this module keeps snapshot and recovery and the pieces they
share (the worker pool, the sandbox, the plain-psycopg baseline).

Every benchmark reports ratios against a reference measured in the same run on the same machine,
because absolute figures vary between machines, and ends with one JSON line.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from contextlib import contextmanager
from urllib.parse import urlsplit

from django.conf import settings

from runs import engine
from runs.models import Run
from taskpilots.celery import app as celery_app
from taskpilots.evidence import scratch
from taskpilots.evidence.workers import (
    ROOT,
    Workers,
    database_url,
)

Say = Callable[[str], None]
BENCH_MODULES = "taskpilots.demo.tools,taskpilots.demo.workflows,taskpilots.evidence.bench_flows"


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def broker_name() -> str:
    scheme = urlsplit(settings.CELERY_BROKER_URL).scheme or settings.CELERY_BROKER_URL
    return {"amqp": "rabbitmq", "pyamqp": "rabbitmq", "redis": "redis", "rediss": "redis"}.get(
        scheme, scheme.rstrip(":/")
    )


# --------------------------------------------------------------------------------------------
# The physical reference: single-row INSERT commits from plain psycopg.


def _peers(argv_list: list[list[str]], timeout: float) -> list[dict]:
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "taskpilots.evidence.bench_peers", *argv],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for argv in argv_list
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=timeout)
        lines = [line for line in out.splitlines() if line.startswith("{")]
        if proc.returncode != 0 or not lines:
            raise RuntimeError(f"benchmark peer failed: {err.strip()[-800:]}")
        results.append(json.loads(lines[-1]))
    return results


def baseline_commits_per_s(processes: int, seconds: float = 3.0) -> float:
    """Single-row INSERT commits per second from `processes` plain psycopg processes."""
    import psycopg

    dsn = database_url()
    table = f"bench_baseline_{uuid.uuid4().hex[:8]}"
    # The table is the owner's (the application's role may not create one); the peers insert.
    with psycopg.connect(database_url(owner=True), autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id bigserial primary key, payload text)")
    try:
        start_at = time.time() + 3.0
        results = _peers(
            [
                [
                    "inserts",
                    "--dsn",
                    dsn,
                    "--table",
                    table,
                    "--seconds",
                    str(seconds),
                    "--start-at",
                    str(start_at),
                ]
                for _ in range(processes)
            ],
            timeout=seconds + 60,
        )
    finally:
        with psycopg.connect(database_url(owner=True), autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {table}")
    return sum(r["commits"] for r in results) / max(r["elapsed_s"] for r in results)


# --------------------------------------------------------------------------------------------
# 2. Snapshot overhead: a side-effect step against the bare tool call it wraps.


def bench_snapshot(samples: int = 200, say: Say = print) -> dict:
    """In-process, so only the protocol is measured: what a side effect costs as the engine
    runs it — its snapshot and intent written with its claim, the call, its receipt written with
    the next step's claim — against the bare call. Runs of bench.writes (no-op tool) and
    bench.mails (the simulated mail system over HTTP): CHAIN side effects one after another per
    run, each run timed whole and divided by CHAIN; p50 over the runs."""
    from runs import tools
    from runs.tools import CallContext
    from taskpilots.evidence import bench_flows

    previous = settings.TASKPILOTS["DISPATCH"]
    settings.TASKPILOTS["DISPATCH"] = "none"
    results = {}
    sandbox_process = _ensure_sandbox()
    runs = max(3, samples // bench_flows.CHAIN)
    try:
        for label, tool_name, workflow in (
            ("noop", "bench.write", "bench.writes"),
            ("http", "mail.send", "bench.mails"),
        ):
            bare = _bare_calls(tools.get(tool_name), samples, CallContext)
            tag = uuid.uuid4().hex[:6]
            _advance_timed(workflow, f"snap-{label}-{tag}-warm", "warm")  # connections, plans
            wrapped = [
                _advance_timed(workflow, f"snap-{label}-{tag}-{n}", f"{tag}{n}") / bench_flows.CHAIN
                for n in range(runs)
            ]
            b50, w50 = statistics.median(bare), statistics.median(wrapped)
            say(f"{label}: bare call p50 {b50:.3f} ms, as a side-effect step p50 {w50:.3f} ms")
            results[label] = {
                "bare_p50_ms": round(b50, 3),
                "step_p50_ms": round(w50, 3),
                "overhead_ms": round(w50 - b50, 3),
                "ratio": round(w50 / b50, 2),
            }
    finally:
        settings.TASKPILOTS["DISPATCH"] = previous
        if sandbox_process is not None:
            sandbox_process.close()
    return {
        "benchmark": "snapshot",
        "samples": samples,
        "side_effects_per_run": bench_flows.CHAIN,
        **results,
        "ratio": results["http"]["ratio"],
        "overhead_ms": results["noop"]["overhead_ms"],
    }


def _bare_calls(tool, samples: int, CallContext) -> list[float]:
    took = []
    for n in range(samples):
        params = (
            {"n": n}
            if tool.name == "bench.write"
            else {"to": f"bare{n}-{uuid.uuid4().hex[:6]}@example.com", "subject": "s", "body": "b"}
        )
        ctx = CallContext(f"bench-bare-{uuid.uuid4().hex}", "bench", "step", 1, 5.0)
        started = time.perf_counter()
        tool.invoke(params, ctx)
        took.append((time.perf_counter() - started) * 1000)
    return took


def _advance_timed(workflow: str, business_key: str, tag: str) -> float:
    """Start a run and advance it to its end in this process (ms); it must succeed."""
    input = {"n": 0} if workflow == "bench.writes" else {"to": f"snap{tag}"}
    run, _ = engine.start_run(workflow, input, business_key=business_key)
    started = time.perf_counter()
    engine.advance(run.pk, budget=3600)
    took = (time.perf_counter() - started) * 1000
    status = Run.objects.get(pk=run.pk).status
    if status != Run.Status.SUCCEEDED:
        raise RuntimeError(f"benchmark run {run.pk} ended {status}")
    return took


@contextmanager
def _worker_pool(dispatch: str, extra_env: dict[str, str]):
    """Celery workers on a queue of their own, started by the caller; while it lasts, this
    process sends its work there the way `dispatch` says."""
    pool = Workers(extra_env=extra_env)
    previous = (settings.TASKPILOTS["DISPATCH"], celery_app.conf.task_default_queue)
    settings.TASKPILOTS["DISPATCH"] = dispatch
    celery_app.conf.task_default_queue = pool.queue
    try:
        yield pool
    finally:
        pool.close()
        pool.delete_queue()
        settings.TASKPILOTS["DISPATCH"], celery_app.conf.task_default_queue = previous


@contextmanager
def _sandbox():
    """A client of the simulated systems, started for the benchmark when none is running."""
    from taskpilots.sandbox.client import SandboxClient

    sandbox_process = _ensure_sandbox()
    try:
        yield SandboxClient(settings.TASKPILOTS["SANDBOX_URL"], timeout=5)
    finally:
        if sandbox_process is not None:
            sandbox_process.close()


def _ensure_sandbox():
    """The simulated systems at SANDBOX_URL, or a process of our own (returned, to close)."""
    from taskpilots.sandbox.client import SandboxClient, start_sandbox

    try:
        SandboxClient(settings.TASKPILOTS["SANDBOX_URL"], timeout=2).health()
        return None
    except Exception:
        process = start_sandbox()
        settings.TASKPILOTS["SANDBOX_URL"] = process.url
        return process


def run_in_scratch_database(args: list[str], say: Say) -> int:
    """Run `manage.py bench ...` again against a scratch database next to the configured one, so
    benchmark runs never mix with real ones; the database is dropped afterwards."""
    with scratch.scratch_database("bench", say) as url:
        return scratch.run_here("bench", args, url)


def to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)

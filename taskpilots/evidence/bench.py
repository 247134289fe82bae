"""Benchmarks: what the safety costs, measured against references taken in the same run.

    python manage.py bench engine|snapshot|recovery|console [--runs N] [--json]

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
from django.db import connection
from django.db.models import Max
from django.utils import timezone

from runs import engine
from runs.models import Run, TimelineEvent
from taskpilots.celery import app as celery_app
from taskpilots.evidence import scratch
from taskpilots.evidence.workers import (
    ROOT,
    Workers,
    backend_cpu_s,
    database_url,
    process_groups_cpu_s,
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


def _commits() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        )
        return cursor.fetchone()[0]


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
# The peer: the same workflow on DBOS Transact.


def dbos_steps_per_s(
    processes: int, workflows: int, say: Say, threads: tuple[int, ...] = (1,)
) -> tuple[float, int] | None:
    """DBOS's best throughput over `threads` (workflows at once per process) and the count
    that gave it, or None when the peer could not run."""
    name = scratch.scratch_name("dbos")
    best = None
    for count in threads:
        scratch.create_database(name)
        try:
            figure = _dbos_steps_per_s(database_url(name), processes, workflows, count, say)
        finally:
            scratch.drop_database(name)
        if figure is not None:
            say(f"  DBOS, {count} at once per process: {figure:,.0f} steps/s")
            if best is None or figure > best[0]:
                best = (figure, count)
    return best


def _dbos_steps_per_s(
    url: str, processes: int, workflows: int, threads: int, say: Say
) -> float | None:
    start_at = time.time() + 5
    per_process = max(1, workflows // processes)
    say(f"DBOS: {processes} processes × {per_process} workflows, {threads} at once")
    argv = ["dbos", "--url", url, "--workflows", str(per_process), "--threads", str(threads)]
    try:
        results = _peers([[*argv, "--start-at", str(start_at)]] * processes, timeout=600)
    except RuntimeError as exc:
        say(str(exc))
        return None
    steps = sum(r["steps"] for r in results)
    return steps / max(r["elapsed_s"] for r in results)


# --------------------------------------------------------------------------------------------
# 1. Engine throughput.


def bench_engine(
    runs: int = 500,
    workers: int = 2,
    say: Say = print,
    with_dbos: bool = True,
    pool: str | None = None,
    concurrency: int | None = None,
) -> dict:
    """`runs` runs of bench.five through `workers` Celery worker processes configured as in
    production (taskpilots.workerconf), timed on the database's clock from the first hint to
    the last run's finish; DBOS runs the same workflow in as many processes, at its best
    concurrency, in the same run."""
    from runs.tasks import advance_run
    from taskpilots.evidence import bench_flows  # noqa: F401  (registers bench.five in this process too)
    from taskpilots.workerconf import CONCURRENCY, worker_config

    say(f"baseline: single-row INSERT commits with {workers} psycopg processes")
    baseline = baseline_commits_per_s(workers)
    say(f"  {baseline:,.0f} commits/s")

    # Its tools answer at once: no step waits, so threads beyond the pooled connections would
    # only queue for one (make run's 200 are for runs that wait on calls).
    config = worker_config(pool, concurrency or min(CONCURRENCY, settings.DB_POOL_SIZE or 8))
    env = {"TASKPILOTS_WORKFLOW_MODULES": BENCH_MODULES, "TASKPILOTS_INLINE_BUDGET_SECONDS": "30"}
    with _worker_pool("none", {**env, **config.env}) as processes:
        say(
            f"starting {workers} Celery worker processes ({config.pool}, concurrency "
            f"{config.concurrency}; {broker_name()})"
        )
        groups = [processes.start(options=config.options()).process.pid for _ in range(workers)]
        tag = uuid.uuid4().hex[:8]
        say(f"creating {runs} runs of bench.five")
        ids = [
            engine.start_run("bench.five", {"n": n}, business_key=f"bench-{tag}-{n}")[0].pk
            for n in range(runs)
        ]
        before = _commits()
        cpu_before = _cpu_s(groups)
        started_at = timezone.now()
        for run_id in ids:
            advance_run.delay(str(run_id))
        polls = _wait_for_runs(ids, say, prefix=f"bench-{tag}-")
        commits = _commits() - before - polls - 1
        cpu = _cpu_per_step_ms(cpu_before, _cpu_s(groups), runs * 5)
    finished = Run.objects.filter(pk__in=ids).aggregate(last=Max("finished_at"))["last"]
    elapsed = (finished - started_at).total_seconds()
    steps = runs * 5
    # Each run's latency, start to finish: its five steps' own times would say little, since
    # three of them are done ahead of a claim, in the statement that records them (0 ms each).
    durations = [
        (done - begun).total_seconds() * 1000
        for begun, done in Run.objects.filter(pk__in=ids).values_list("created_at", "finished_at")
    ]
    steps_per_s = steps / elapsed
    say(f"TaskPilots: {steps_per_s:,.0f} steps/s ({steps} steps in {elapsed:.2f} s)")
    dbos = None
    if with_dbos:
        dbos = dbos_steps_per_s(workers, runs, say, threads=(1, 4, 16))
    return {
        "benchmark": "engine",
        "runs": runs,
        "steps": steps,
        "workers": workers,
        "worker_pool": config.pool,
        "worker_concurrency": config.concurrency,
        "broker": broker_name(),
        "steps_per_s": round(steps_per_s, 1),
        "baseline_commits_per_s": round(baseline, 1),
        "ratio": round(steps_per_s / baseline, 4),
        "dbos_steps_per_s": round(dbos[0], 1) if dbos else None,
        "dbos_concurrency": dbos[1] if dbos else None,
        "vs_dbos": round(steps_per_s / dbos[0], 3) if dbos else None,
        "commits_per_step": round(commits / steps, 2),
        "events_per_step": round(TimelineEvent.objects.filter(run_id__in=ids).count() / steps, 2),
        "run_p50_ms": round(percentile(durations, 50), 2),
        "run_p99_ms": round(percentile(durations, 99), 2),
        **cpu,
    }


def _wait_for_runs(ids: list, say: Say, timeout: float = 600, *, prefix: str = "") -> int:
    """Until every run succeeded, saying how many have; the number of polls. The clock is the
    database's (the runs' own times), so the poll only has to notice the end: a few times a
    second, one index range on the business keys (`prefix`) rather than a list of every id,
    so the benchmark takes as little as it can of the CPU it measures."""
    if prefix:
        runs = Run.objects.filter(business_key__startswith=prefix)
    else:
        runs = Run.objects.filter(pk__in=ids)
    polls, done, started = 0, 0, time.monotonic()
    while done < len(ids):
        time.sleep(0.25)
        polls += 1
        done = runs.filter(status="succeeded").count()
        if polls % 4 == 0:
            say(f"  {done}/{len(ids)} runs done")
        if time.monotonic() - started > timeout:
            raise RuntimeError(f"only {done}/{len(ids)} runs finished in {timeout:.0f} s")
    return polls


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


def _cpu_s(groups: list[int]) -> tuple[float | None, float | None]:
    """CPU seconds so far of the workers' processes and of PostgreSQL's server processes for
    this (scratch) database: where a step's time goes when the machine is the bound."""
    return process_groups_cpu_s(groups), backend_cpu_s(connection.settings_dict["NAME"])


def _cpu_per_step_ms(before, after, steps: int) -> dict:
    def per_step(first, last):
        return None if first is None or last is None else round((last - first) * 1000 / steps, 3)

    return {
        "worker_cpu_ms_per_step": per_step(before[0], after[0]),
        "db_cpu_ms_per_step": per_step(before[1], after[1]),
    }


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

"""`manage.py bench io`: how many waiting runs the workers hold, against DBOS in the same run.

Agent runs mostly wait (a model turn takes seconds, a tool call hundreds of ms), so what matters
is how many calls can be waiting at once, what that costs in memory and PostgreSQL connections,
and that nothing is lost or sent twice on the way. Steps, in order:

1. Start the waiting tool (taskpilots/evidence/waiting_tool.py): an HTTP server that answers
   each call after L ms and counts, where the calls land, the calls in flight and every
   idempotency key.
2. Start one Celery worker configured exactly as `make run` starts it (taskpilots.workerconf:
   pool, concurrency, environment), on a queue of its own. One warm-up run goes through it.
3. Create N runs of `bench.io` (two side effects on that tool) and publish their N hints while
   the workers consume another queue (a barrier); then the workers join the hints' queue at
   once and the clock runs to the last run's `finished_at`, so what it measures is the
   workers, not how fast one client can start runs (`start_s` and `hints_s` say that).
   Meanwhile a sampler records the worker processes' summed RSS and the connections to the
   database (pg_stat_activity); progress goes to stderr. Celery beat runs the sweeper, as in
   `make run`.
4. Check what landed against the ledger: every key received once, every received key
   committed, every committed key received.
5. The same N workflows on DBOS Transact in one process (bench_peers `dbos-io`): started one
   after another with `DBOS.start_workflow` (a thread each, over DBOS's bounded pool) and held
   at a barrier, then released at once; each step makes the same call, which the waiting tool
   counts apart. The clock runs from the release to the last result.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter

import httpx2
from django.db.models import Count, Max
from django.utils import timezone

from runs import engine
from runs.models import Run, SideEffect, Step
from runs.tasks import advance_run
from taskpilots.evidence import scratch
from taskpilots.evidence.bench import BENCH_MODULES, Say, _worker_pool, broker_name, percentile
from taskpilots.evidence.workers import ROOT, database_url, process_groups_cpu_s
from taskpilots.workerconf import WorkerConfig, worker_config

SUCCEEDED = "succeeded"
FAILED = ("failed", "cancelled", "compensated")
PARKED = ("needs_human", "taken_over")  # stopped until a person acts: never finishes by itself


def bench_io(
    runs: int = 40,
    latency_ms: int = 500,
    *,
    pool: str | None = None,
    concurrency: int | None = None,
    with_dbos: bool = True,
    say: Say = print,
) -> dict:
    from taskpilots.evidence import bench_flows  # noqa: F401  (registers bench.io here too)

    config = worker_config(pool, concurrency)
    # Generous, only there to end a benchmark that stalls: three times what the pool needs if
    # every call took exactly L ms, 200 ms of engine time per run, and two minutes.
    slots = config.concurrency * config.processes
    deadline_s = 120 + runs * (0.2 + 3 * 2 * latency_ms / 1000 / slots)
    tool_timeout = max(10.0, 4 * latency_ms / 1000 + 5)
    with WaitingTool.start(latency_ms) as tool, Sampler() as sampler:
        ours = _taskpilots(runs, config, tool, sampler, deadline_s, tool_timeout, say)
        dbos = _dbos(runs, tool, sampler, deadline_s, tool_timeout, say) if with_dbos else {}
        max_connections = sampler.max_connections
    result = {
        "benchmark": "io",
        "runs": runs,
        "latency_ms": latency_ms,
        "pool": config.pool,
        "concurrency": config.concurrency,
        "processes": config.processes,
        "broker": broker_name(),
        # Every run at once: two calls one after the other.
        "ideal_makespan_s": round(2 * latency_ms / 1000, 3),
        **ours,
        "max_connections": max_connections,
        **dbos,
    }
    if sampler.error:  # the memory and connection peaks stopped there
        result["sampler_error"] = sampler.error
    if dbos.get("dbos_makespan_s") and ours.get("makespan_s"):
        result["vs_dbos"] = round(dbos["dbos_makespan_s"] / ours["makespan_s"], 3)
    else:
        result["vs_dbos"] = None
    return result


# --------------------------------------------------------------------------------------------
# TaskPilots: real Celery workers configured as `make run` configures them.


def _taskpilots(
    runs: int,
    config: WorkerConfig,
    tool: WaitingTool,
    sampler: Sampler,
    deadline_s: float,
    tool_timeout: float,
    say: Say,
) -> dict:
    env = {
        "TASKPILOTS_WORKFLOW_MODULES": BENCH_MODULES,
        "TASKPILOTS_BENCH_IO_URL": tool.url,
        "TASKPILOTS_TOOL_TIMEOUT_SECONDS": str(tool_timeout),
        **config.env,
    }
    tag = uuid.uuid4().hex[:8]
    # Runs are created without hints (dispatch "none" here); the workers send their own.
    with _worker_pool("none", env) as workers:
        say(
            f"starting {config.processes} Celery worker process(es): "
            f"{' '.join(config.options())} ({broker_name()})"
        )
        # They consume a queue of their own first (the barrier): the N hints wait in theirs
        # until every run exists and every hint is published, then the workers join it at once
        # and the clock starts, as DBOS's workflows wait at a barrier of their own.
        barrier = f"{workers.queue}-barrier"
        started_workers = [
            workers.start(name=f"io{n}-{tag}", options=config.options(), listen=barrier)
            for n in range(config.processes)
        ]
        workers.start_beat()  # the sweeper, as make run runs it (rechecks, stale runs)
        groups = [w.process.pid for w in started_workers]
        worker = started_workers[0]
        sampler.watch(database=_current_database(), process_groups=groups)
        _warm_up(tag, barrier, worker)
        tool.reset("taskpilots")
        sampler.restart()
        ids, start_s, hints_s = _runs_and_hints(runs, tag, say)
        started_at, started = timezone.now(), time.monotonic()
        cpu_before = process_groups_cpu_s(groups)
        workers.release(started_workers)
        statuses = _wait_for_runs(ids, started + deadline_s, (say, tool, sampler))
        polled_s = time.monotonic() - started
        cpu_after = process_groups_cpu_s(groups)
        sampler.pause()
        worker_output = [line for w in started_workers for line in w.output[-30:]]
    tally = _tally(ids, statuses, started_at, tool.stats("taskpilots", keys=True))
    makespan, succeeded = tally["makespan_s"], statuses[SUCCEEDED]
    say(
        f"TaskPilots: {succeeded}/{runs} runs succeeded in "
        f"{makespan if makespan is not None else polled_s:.2f} s, peak {tally['peak_in_flight']} "
        f"calls in flight, {sampler.peak_rss_mb:.0f} MB, {sampler.peak_connections} connections"
    )
    if succeeded != runs:
        say("the worker's last lines:\n" + "".join(worker_output))
    return {
        **tally,
        "start_s": round(start_s, 3),
        "hints_s": round(hints_s, 3),
        "polled_s": round(polled_s, 3),
        # CPU the worker processes spent from the first hint to the end (Linux only).
        "worker_cpu_s": _rounded(cpu_after - cpu_before)
        if cpu_before is not None and cpu_after is not None
        else None,
        "worker_rss_mb": round(sampler.peak_rss_mb, 1),
        "worker_processes": sampler.peak_processes,
        "db_connections_peak": sampler.peak_connections,
        "server_connections_peak": sampler.peak_server_connections,
    }


def _warm_up(tag: str, barrier: str, worker) -> None:
    """One run through the workers on their barrier queue: every import and connection made
    before the clock starts."""
    warm_up, _ = engine.start_run("bench.io", {"n": -1}, business_key=f"io-{tag}-warm-up")
    advance_run.apply_async((str(warm_up.pk),), queue=barrier)
    if _wait_for_runs([warm_up.pk], time.monotonic() + 60)[SUCCEEDED] != 1:
        raise RuntimeError(
            f"the warm-up run did not succeed ({Run.objects.get(pk=warm_up.pk).status}); "
            "the worker said:\n" + "".join(worker.output[-30:])
        )


def _runs_and_hints(runs: int, tag: str, say: Say) -> tuple[list, float, float]:
    """The N runs, then their N hints in the broker (the workers still on their barrier);
    how long each took."""
    say(f"TaskPilots: creating {runs} runs of bench.io")
    begun = time.monotonic()
    ids = [
        engine.start_run("bench.io", {"n": n}, business_key=f"io-{tag}-{n}")[0].pk
        for n in range(runs)
    ]
    start_s = time.monotonic() - begun
    say(f"TaskPilots: {runs} runs created in {start_s:.2f} s; publishing their hints")
    hinting = time.monotonic()
    for run_id in ids:
        advance_run.delay(str(run_id))
    hints_s = time.monotonic() - hinting
    say(f"TaskPilots: {runs} hints waiting in the broker ({hints_s:.2f} s); workers go")
    return ids, start_s, hints_s


def _tally(ids: list, statuses: Counter, started_at, landed: dict) -> dict:
    """What the database and the tool say about the runs: outcomes, makespan, and the ledger's
    committed keys against the keys that landed."""
    runs = len(ids)
    last = Run.objects.filter(pk__in=ids).aggregate(last=Max("finished_at"))["last"]
    complete = statuses[SUCCEEDED] + sum(statuses[s] for s in FAILED) == runs
    makespan = (last - started_at).total_seconds() if complete and last else None
    committed = set(
        SideEffect.objects.filter(run_id__in=ids, status=SideEffect.Status.COMMITTED).values_list(
            "idempotency_key", flat=True
        )
    )
    received = set(landed.get("keys", []))
    # Claim to outcome recorded, the call included: beyond L ms it is the engine's time, or
    # time spent waiting for the interpreter, a connection or the database.
    steps_ms = [
        (recorded - claimed).total_seconds() * 1000
        for claimed, recorded in Step.objects.filter(
            run_id__in=ids, started_at__isnull=False, finished_at__isnull=False
        ).values_list("started_at", "finished_at")
    ]
    succeeded = statuses[SUCCEEDED]
    return {
        "makespan_s": _rounded(makespan, 3),
        "peak_in_flight": landed["peak_in_flight"],
        "calls": landed["calls"],
        "duplicates": landed["duplicate_keys"],
        "duplicate_examples": landed["duplicate_examples"],
        "runs_succeeded": succeeded,
        "runs_failed": sum(statuses[s] for s in FAILED),
        "runs_needs_human": sum(statuses[s] for s in PARKED),
        # Neither finished nor parked when the benchmark gave up on them.
        "runs_lost": runs - succeeded - sum(statuses[s] for s in (*FAILED, *PARKED)),
        "landed_without_receipt": len(received - committed),
        "receipt_without_landing": len(committed - received),
        "step_p50_ms": _rounded(percentile(steps_ms, 50)),
        "step_p95_ms": _rounded(percentile(steps_ms, 95)),
    }


def _wait_for_runs(
    ids: list, deadline: float, progress: tuple[Say, WaitingTool, Sampler] | None = None
) -> Counter:
    """Poll until every run finished or is parked for a person, or the (monotonic) deadline
    passed; with `progress`, say how far it got every second."""
    next_report = time.monotonic() + 1
    while True:
        rows = Run.objects.filter(pk__in=ids).values("status").annotate(count=Count("id"))
        statuses = Counter({row["status"]: row["count"] for row in rows})
        settled = statuses[SUCCEEDED] + sum(statuses[s] for s in (*FAILED, *PARKED))
        if settled == len(ids) or time.monotonic() >= deadline:
            return statuses
        if progress is not None and time.monotonic() >= next_report:
            next_report += 1
            say, tool, sampler = progress
            _report("TaskPilots", len(ids), tool.stats("taskpilots"), sampler, say, statuses)
        time.sleep(0.25)


def _report(
    label: str, runs: int, stats: dict, sampler: Sampler, say: Say, statuses: Counter
) -> None:
    say(
        f"  {label}: {statuses[SUCCEEDED]}/{runs} done, {stats.get('in_flight', 0)} in flight "
        f"(peak {stats.get('peak_in_flight', 0)}), {sampler.connections} connections, "
        f"{sampler.rss_mb:.0f} MB"
    )


def _current_database() -> str:
    from django.db import connection

    return connection.settings_dict["NAME"]


# --------------------------------------------------------------------------------------------
# DBOS Transact: the same workflow in one process.


def _dbos(
    runs: int,
    tool: WaitingTool,
    sampler: Sampler,
    deadline_s: float,
    tool_timeout: float,
    say: Say,
) -> dict:
    name = scratch.scratch_name("dbos")
    scratch.create_database(name)
    try:
        sampler.watch(database=name, process_groups=[])
        sampler.restart()
        say(f"DBOS: {runs} workflows in one process")
        peer = subprocess.Popen(
            [
                *[sys.executable, "-m", "taskpilots.evidence.bench_peers", "dbos-io"],
                *["--url", database_url(name), "--workflows", str(runs)],
                *["--call-url", tool.url, "--timeout", str(tool_timeout)],
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        output: dict[str, str] = {}
        reader = threading.Thread(
            target=lambda: output.update(zip(("out", "err"), peer.communicate(), strict=True)),
            daemon=True,
        )
        reader.start()
        deadline = time.monotonic() + deadline_s + 60  # DBOS launches and migrates first
        while reader.is_alive() and time.monotonic() < deadline:
            reader.join(1)
            stats = tool.stats("dbos")
            if stats:
                say(
                    f"  DBOS: {stats['answered'] // 2}/{runs} done, {stats['in_flight']} in "
                    f"flight (peak {stats['peak_in_flight']}), {sampler.connections} connections"
                )
        if reader.is_alive():
            peer.kill()
            reader.join(10)
        sampler.pause()
    finally:
        scratch.drop_database(name)
    lines = [line for line in output.get("out", "").splitlines() if line.startswith("{")]
    landed = tool.stats("dbos", keys=True)
    if peer.returncode != 0 or not lines:
        say(f"DBOS failed: {output.get('err', '').strip()[-800:]}")
        return {"dbos_makespan_s": None, "dbos_error": output.get("err", "")[-300:]}
    peer_result = json.loads(lines[-1])
    say(
        f"DBOS: {runs - peer_result['failed']}/{runs} workflows in {peer_result['elapsed_s']:.2f} "
        f"s, peak {landed['peak_in_flight']} calls in flight, {peer_result['rss_mb']:.0f} MB"
    )
    return {
        "dbos_makespan_s": round(peer_result["elapsed_s"], 3),
        "dbos_start_s": round(peer_result["start_s"], 3),
        "dbos_peak_in_flight": landed["peak_in_flight"],
        "dbos_calls": landed["calls"],
        "dbos_duplicates": landed["duplicate_keys"],
        "dbos_failed": peer_result["failed"],
        "dbos_failures": peer_result["failures"],
        # Workflows whose two calls did not both land (keys are `<workflow id>-a` and `-b`).
        "dbos_lost": runs - _both_calls_landed(landed.get("keys", [])),
        "dbos_rss_mb": round(peer_result["rss_mb"], 1),
        "dbos_cpu_s": round(peer_result["cpu_s"], 3),
        "dbos_threads_peak": peer_result["threads_peak"],
        "dbos_sys_db_pool_size": peer_result["sys_db_pool_size"],
        "dbos_db_connections_peak": sampler.peak_connections,
    }


def _rounded(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def _both_calls_landed(keys: list[str]) -> int:
    calls = Counter(key.rsplit("-", 1)[0] for key in keys)
    return sum(1 for count in calls.values() if count == 2)


# --------------------------------------------------------------------------------------------
# The waiting tool's process, and the sampler of memory and connections.


class WaitingTool:
    """taskpilots/evidence/waiting_tool.py as a process of this benchmark."""

    def __init__(self, process: subprocess.Popen, port: int):
        self.process, self.url = process, f"http://127.0.0.1:{port}"
        self.client = httpx2.Client(trust_env=False, timeout=10)

    @classmethod
    def start(cls, latency_ms: float) -> WaitingTool:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "taskpilots.evidence.waiting_tool",
                "--latency-ms",
                str(latency_ms),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        line = process.stdout.readline()
        if not line.startswith("listening on "):
            process.kill()
            raise RuntimeError(f"the waiting tool did not start: {line!r}")
        return cls(process, int(line.split()[-1]))

    def stats(self, side: str, keys: bool = False) -> dict:
        answer = self.client.get(f"{self.url}/_stats", params={"keys": "1"} if keys else None)
        return answer.json().get(side, {})

    def reset(self, side: str) -> None:
        self.client.post(f"{self.url}/_reset/{side}")

    def __enter__(self) -> WaitingTool:
        return self

    def __exit__(self, *exc) -> None:
        self.client.close()
        self.process.kill()
        self.process.wait(10)


class Sampler:
    """Every 0.25 s: connections to the watched database (and to the whole server) from
    pg_stat_activity, and the summed RSS of the watched process group (a worker and its pool
    children). Peaks since the last `restart()`; the benchmark's own connection counts too."""

    INTERVAL = 0.25

    def __init__(self):
        import psycopg

        self.conn = psycopg.connect(database_url("postgres"), autocommit=True)
        self.max_connections = int(self.conn.execute("SHOW max_connections").fetchone()[0])
        self.database: str | None = None
        self.process_groups: list[int] = []
        self.connections = self.peak_connections = self.peak_server_connections = 0
        self.rss_mb = self.peak_rss_mb = 0.0
        self.peak_processes = 0
        self.active = False
        self.error = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-io-sampler", daemon=True)

    def watch(self, *, database: str, process_groups: list[int]) -> None:
        self.database, self.process_groups = database, process_groups

    def restart(self) -> None:
        self.peak_connections = self.peak_server_connections = self.peak_processes = 0
        self.peak_rss_mb = 0.0
        self.active = True

    def pause(self) -> None:
        self.active = False

    def _loop(self) -> None:
        while not self._stop.wait(self.INTERVAL):
            if self.database is None:
                continue
            try:
                self._sample()
            except Exception as exc:  # a sampler that stops must not stop the benchmark
                self.error = f"{type(exc).__name__}: {exc}"

    def _sample(self) -> None:
        rows = self.conn.execute(
            "SELECT datname, count(*) FROM pg_stat_activity "
            "WHERE backend_type = 'client backend' GROUP BY datname"
        ).fetchall()
        counts = dict(rows)
        self.connections = counts.get(self.database, 0)
        self.rss_mb, processes = _group_rss_mb(self.process_groups)
        if self.active:
            self.peak_connections = max(self.peak_connections, self.connections)
            self.peak_server_connections = max(self.peak_server_connections, sum(counts.values()))
            self.peak_rss_mb = max(self.peak_rss_mb, self.rss_mb)
            self.peak_processes = max(self.peak_processes, processes)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)
        self.conn.close()


def _group_rss_mb(process_groups: list[int]) -> tuple[float, int]:
    """Summed RSS (MB) and count of the processes in these process groups (`ps`, Linux and
    macOS). Pages a prefork parent shares with its children are counted in each."""
    if not process_groups:
        return 0.0, 0
    listing = subprocess.run(
        ["ps", "-A", "-o", "pgid=,rss="], capture_output=True, text=True, check=False
    ).stdout
    sizes = [int(rss) for pgid, rss in _pairs(listing) if pgid in process_groups]
    return sum(sizes) / 1024, len(sizes)


def _pairs(listing: str):
    for line in listing.splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[0].isdigit() and fields[1].isdigit():
            yield int(fields[0]), int(fields[1])

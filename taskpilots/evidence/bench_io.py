"""`manage.py bench io`: how many waiting runs the workers hold, against DBOS on the same resources.

Agent runs mostly wait (a model turn takes seconds, a tool call hundreds of ms), so what matters
is how many calls can be waiting at once, what that costs in CPU, memory and PostgreSQL
connections, and that nothing is lost or sent twice on the way. Steps, in order:

1. Start the waiting tool (taskpilots/evidence/waiting_tool.py): an HTTP server that answers
   each call after L ms and counts, where the calls land, the calls in flight and every
   idempotency key, for each side apart.
2. Start the three contestants once, and keep them for every measurement:
   - TaskPilots: P Celery worker processes configured exactly as `make run` starts them
     (taskpilots.workerconf: pool, concurrency C, P processes, environment), each with its
     connection pool of TASKPILOTS_DB_POOL_SIZE (B) connections, and Celery beat (the sweeper).
   - DBOS Transact with the same resources: P processes (bench_peers `dbos-io`), each with C
     executor threads (`max_executor_threads`: the threads that run workflows and their
     steps) and a system database pool of B connections (`sys_db_pool_size`).
   - DBOS Transact as its defaults have it: one process, unbounded executor threads, a pool
     of 20 (the only configuration before; reported as `dbos_one_process`).
   DBOS's two system databases are created once, before any measurement, and dropped at the end.
3. Measure in pairs, the order alternating (TaskPilots, DBOS, DBOS one process; then the other
   way round; ...), so a machine shared with other work slows both sides alike on average.
   Each measurement: N runs (N workflows split evenly over the DBOS processes, each process
   starting its share) are recorded durably and held at a barrier — TaskPilots' hints wait in
   the broker while the workers consume another queue, DBOS's workflows wait on an event before
   their first step — then released at once. The clock: the bench process's wall clock just
   before the release, to the wall-clock time the last run was done (TaskPilots: the last run's
   `finished_at`, stamped by the worker; DBOS: when each process saw its last result), one
   system clock since every process runs on this host. Creating the runs is not on the clock
   on either side (`start_s`). CPU: the client processes' (workers; DBOS processes) and their
   PostgreSQL backends', from /proc, release to end.
4. Check what landed against each side's own record: TaskPilots' ledger (every key received
   once, every received key committed, every committed key received); DBOS, both calls of
   every workflow landed, each key once.
"""

from __future__ import annotations

import json
import os
import queue
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter

import httpx2
from django.conf import settings
from django.db.models import Count, Max
from django.utils import timezone

from runs import engine
from runs.models import Run, SideEffect, Step
from runs.tasks import advance_run
from taskpilots.evidence import scratch
from taskpilots.evidence.bench import BENCH_MODULES, Say, _worker_pool, broker_name, percentile
from taskpilots.evidence.bench_io_report import DBOS, DBOS_ONE, TASKPILOTS
from taskpilots.evidence.workers import ROOT, backend_cpu_s, database_url, process_groups_cpu_s
from taskpilots.workerconf import WorkerConfig, worker_config

SUCCEEDED = "succeeded"
FAILED = ("failed", "cancelled", "compensated")
PARKED = ("needs_human", "taken_over")  # stopped until a person acts: never finishes by itself

CLOCK = (
    "bench process's wall clock just before the release to the wall-clock time the last run was "
    "done (TaskPilots: last finished_at, stamped by a worker; DBOS: each process's last "
    "result); one host, one system clock"
)


def bench_io(
    runs: int = 40,
    latency_ms: int = 500,
    *,
    pool: str | None = None,
    concurrency: int | None = None,
    with_dbos: bool = True,
    pairs: int = 4,
    say: Say = print,
) -> dict:
    from taskpilots.evidence import bench_flows  # noqa: F401  (registers bench.io here too)

    if pairs < 1:
        raise ValueError("pairs must be at least 1")
    config = worker_config(pool, concurrency)
    # Connections per TaskPilots worker process: its pool, or one per thread without a pool.
    budget = settings.DB_POOL_SIZE or config.concurrency
    # Generous, only there to end a benchmark that stalls: three times what the pool needs if
    # every call took exactly L ms, 200 ms of engine time per run, and two minutes.
    slots = config.concurrency * config.processes
    deadline_s = 120 + runs * (0.2 + 3 * 2 * latency_ms / 1000 / slots)
    tool_timeout = max(10.0, 4 * latency_ms / 1000 + 5)
    sides = [TASKPILOTS, DBOS, DBOS_ONE] if with_dbos else [TASKPILOTS]
    samples: list[dict] = []
    with WaitingTool.start(latency_ms) as tool, Sampler() as sampler:
        common = (tool, sampler, deadline_s, tool_timeout, say)
        with (
            _TaskPilots(config, *common) as ours,
            _Dbos.started(
                DBOS, config.processes, config.concurrency, budget, common, with_dbos
            ) as equal,
            _Dbos.started(DBOS_ONE, 1, 0, 0, common, with_dbos) as one,
        ):
            contestants = {TASKPILOTS: ours, DBOS: equal, DBOS_ONE: one}
            for pair in range(pairs):
                order = sides if pair % 2 == 0 else sides[::-1]
                for position, side in enumerate(order):
                    say(f"pair {pair + 1}/{pairs}: {side}")
                    sample = contestants[side].measure(runs, f"{pair}")
                    sample.update(pair=pair, position=position, side=side, load_avg=_load())
                    samples.append(sample)
        max_connections = sampler.max_connections
        sampler_error = sampler.error
    result = {
        "benchmark": "io",
        "runs": runs,
        "latency_ms": latency_ms,
        "pairs": pairs,
        "order": " / ".join(["→".join(sides), "→".join(sides[::-1])]),
        "clock": CLOCK,
        "pool": config.pool,
        "concurrency": config.concurrency,
        "processes": config.processes,
        "db_pool_size": budget,
        "broker": broker_name(),
        # Every run at once: two calls one after the other.
        "ideal_makespan_s": round(2 * latency_ms / 1000, 3),
        "max_connections": max_connections,
        **_summary(samples, with_dbos, config, budget),
        "samples": samples,
    }
    if sampler_error:  # the memory and connection peaks stopped there
        result["sampler_error"] = sampler_error
    return result


def _summary(samples: list[dict], with_dbos: bool, config: WorkerConfig, budget: int) -> dict:
    """Medians and ranges over the pairs, counts summed over every measurement, peaks."""
    by_side = {
        side: [s for s in samples if s["side"] == side] for side in (TASKPILOTS, DBOS, DBOS_ONE)
    }
    ours = by_side[TASKPILOTS]
    summary = {
        **_figures("", ours),
        "runs_succeeded": sum(s["runs_succeeded"] for s in ours),
        "runs_failed": sum(s["runs_failed"] for s in ours),
        "runs_needs_human": sum(s["runs_needs_human"] for s in ours),
        "landed_without_receipt": sum(s["landed_without_receipt"] for s in ours),
        "receipt_without_landing": sum(s["receipt_without_landing"] for s in ours),
        "duplicate_examples": [e for s in ours for e in s["duplicate_examples"]][:5],
        "hints_s": _median(s["hints_s"] for s in ours),
        "step_p50_ms": _median(s["step_p50_ms"] for s in ours),
        "step_p95_ms": _median(s["step_p95_ms"] for s in ours),
        "worker_rss_mb": max(s["rss_mb"] for s in ours),
        "worker_processes": max(s["processes_seen"] for s in ours),
        "server_connections_peak": max(s["server_connections_peak"] for s in ours),
        "worker_cpu_s": _median(s["cpu_s"] for s in ours),
    }
    for side, prefix in ((DBOS, "dbos_"), (DBOS_ONE, "dbos_one_process_")):
        theirs = by_side[side]
        if not with_dbos:
            summary[f"vs_{side}"] = None
            continue
        summary.update(_figures(prefix, theirs))
        summary[f"{prefix}failed"] = sum(s["failed"] for s in theirs)
        summary[f"{prefix}failures"] = [f for s in theirs for f in s["failures"]][:5]
        summary[f"{prefix}rss_mb"] = max(s["rss_mb"] for s in theirs)
        summary[f"{prefix}threads_peak"] = max(s["threads_peak"] for s in theirs)
        summary[f"{prefix}sys_db_pool_size"] = theirs[0]["sys_db_pool_size"]
        summary[f"{prefix}processes"] = theirs[0]["processes"]
        summary[f"{prefix}threads"] = theirs[0]["threads"]
        # DBOS's makespan ÷ ours in the same pair: above 1, TaskPilots was faster.
        ratios = [
            t["makespan_s"] / o["makespan_s"]
            for o, t in zip(ours, theirs, strict=True)
            if t["makespan_s"] and o["makespan_s"]
        ]
        summary[f"vs_{side}"] = round(statistics.median(ratios), 3) if ratios else None
        summary[f"vs_{side}_range"] = (
            [round(min(ratios), 3), round(max(ratios), 3)] if ratios else None
        )
        summary[f"vs_{side}_pairs"] = [round(r, 3) for r in ratios]
    return summary


def _figures(prefix: str, samples: list[dict]) -> dict:
    """One side's figures over its measurements: makespan and CPU per run (median and range),
    counts summed, peaks."""
    makespans = [s["makespan_s"] for s in samples if s["makespan_s"] is not None]
    complete = len(makespans) == len(samples)
    return {
        f"{prefix}makespan_s": _median(makespans) if complete else None,
        f"{prefix}makespan_range_s": [min(makespans), max(makespans)] if makespans else None,
        f"{prefix}start_s": _median(s["start_s"] for s in samples),
        f"{prefix}calls": sum(s["calls"] for s in samples),
        f"{prefix}duplicates": sum(s["duplicates"] for s in samples),
        f"{prefix}lost": sum(s["lost"] for s in samples),
        f"{prefix}peak_in_flight": max(s["peak_in_flight"] for s in samples),
        f"{prefix}db_connections_peak": max(s["connections_peak"] for s in samples),
        # CPU per run, release to end: the client processes, and their PostgreSQL backends.
        f"{prefix}cpu_ms_per_run": _median(s["cpu_ms_per_run"] for s in samples),
        f"{prefix}db_cpu_ms_per_run": _median(s["db_cpu_ms_per_run"] for s in samples),
    } | ({"runs_lost": sum(s["lost"] for s in samples)} if not prefix else {})


def _median(values) -> float | None:
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 3) if values else None


def _per_run_ms(before: float | None, after: float | None, runs: int) -> float | None:
    if before is None or after is None:
        return None
    return round((after - before) * 1000 / runs, 3)


def _load() -> float | None:
    return round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None


# --------------------------------------------------------------------------------------------
# TaskPilots: real Celery workers configured as `make run` configures them.


class _TaskPilots:
    """P workers on a barrier queue, warmed up; each `measure` creates N runs, queues their
    hints and lets the workers join the hints' queue at once."""

    def __init__(self, config, tool, sampler, deadline_s, tool_timeout, say):
        self.config, self.tool, self.sampler, self.say = config, tool, sampler, say
        self.deadline_s = deadline_s
        self.env = {
            "TASKPILOTS_WORKFLOW_MODULES": BENCH_MODULES,
            "TASKPILOTS_BENCH_IO_URL": tool.url,
            "TASKPILOTS_TOOL_TIMEOUT_SECONDS": str(tool_timeout),
            **config.env,
        }
        self.tag = uuid.uuid4().hex[:8]
        self.joined = False

    def __enter__(self) -> _TaskPilots:
        # Runs are created without hints (dispatch "none" here); the workers send their own.
        self._pool = _worker_pool("none", self.env)
        self.workers = self._pool.__enter__()
        config = self.config
        self.say(
            f"starting {config.processes} Celery worker process(es): "
            f"{' '.join(config.options())} ({broker_name()})"
        )
        # They consume a queue of their own first (the barrier): the N hints wait in theirs
        # until every run exists and every hint is published, then the workers join it at once.
        self.barrier = f"{self.workers.queue}-barrier"
        self.started = [
            self.workers.start(
                name=f"io{n}-{self.tag}", options=config.options(), listen=self.barrier
            )
            for n in range(config.processes)
        ]
        self.workers.start_beat()  # the sweeper, as make run runs it (rechecks, stale runs)
        self.groups = [w.process.pid for w in self.started]
        _warm_up(self.tag, self.barrier, self.started, 2 * config.processes)
        return self

    def __exit__(self, *exc) -> None:
        self._pool.__exit__(*exc)

    def measure(self, runs: int, label: str) -> dict:
        tool, sampler, say = self.tool, self.sampler, self.say
        if self.joined:  # back to the barrier: the next hints wait in the broker again
            _leave_queue(self.workers.queue, self.started)
        database = _current_database()
        tool.reset(TASKPILOTS)
        sampler.watch(database=database, process_groups=self.groups)
        sampler.restart()
        ids, start_s, hints_s = _runs_and_hints(runs, f"{self.tag}-{label}", say)
        db_before, cpu_before = backend_cpu_s(database), process_groups_cpu_s(self.groups)
        started_at, started = timezone.now(), time.monotonic()
        self.workers.release(self.started)
        self.joined = True
        statuses = _wait_for_runs(ids, started + self.deadline_s, (say, tool, sampler))
        polled_s = time.monotonic() - started
        cpu_after, db_after = process_groups_cpu_s(self.groups), backend_cpu_s(database)
        sampler.pause()
        tally = _tally(ids, statuses, started_at, tool.stats(TASKPILOTS, keys=True))
        makespan, succeeded = tally["makespan_s"], statuses[SUCCEEDED]
        say(
            f"TaskPilots: {succeeded}/{runs} runs succeeded in "
            f"{makespan if makespan is not None else polled_s:.2f} s, peak "
            f"{tally['peak_in_flight']} calls in flight, {sampler.peak_rss_mb:.0f} MB, "
            f"{sampler.peak_connections} connections"
        )
        if succeeded != runs:
            say(
                "the workers' last lines:\n"
                + "".join(line for w in self.started for line in w.output[-30:])
            )
        return {
            **tally,
            "start_s": round(start_s, 3),
            "hints_s": round(hints_s, 3),
            "polled_s": round(polled_s, 3),
            "cpu_s": _rounded(None if cpu_before is None else cpu_after - cpu_before, 2),
            "cpu_ms_per_run": _per_run_ms(cpu_before, cpu_after, runs),
            "db_cpu_ms_per_run": _per_run_ms(db_before, db_after, runs),
            "rss_mb": round(sampler.peak_rss_mb, 1),
            "processes_seen": sampler.peak_processes,
            "connections_peak": sampler.peak_connections,
            "server_connections_peak": sampler.peak_server_connections,
        }


def _leave_queue(queue_name: str, workers: list) -> None:
    import socket

    from taskpilots.celery import app as celery_app

    host = socket.gethostname()
    names = [f"{w.name}@{host}" for w in workers]
    replies = celery_app.control.cancel_consumer(
        queue_name, destination=names, reply=True, timeout=10
    )
    if len(replies) < len(names):
        raise RuntimeError(f"only {len(replies)} of {len(names)} workers left {queue_name}")


def _warm_up(tag: str, barrier: str, workers: list, count: int) -> None:
    """A few runs through the workers on their barrier queue: imports and connections made
    before the first measurement."""
    ids = []
    for n in range(count):
        run, _ = engine.start_run("bench.io", {"n": -1}, business_key=f"io-{tag}-warm-up-{n}")
        advance_run.apply_async((str(run.pk),), queue=barrier)
        ids.append(run.pk)
    if _wait_for_runs(ids, time.monotonic() + 60)[SUCCEEDED] != count:
        raise RuntimeError(
            "the warm-up runs did not succeed; the workers said:\n"
            + "".join(line for w in workers for line in w.output[-30:])
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
        "lost": runs - succeeded - sum(statuses[s] for s in (*FAILED, *PARKED)),
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
# DBOS Transact: the same workflow in P processes (bench_peers `dbos-io`).


class _Dbos:
    """DBOS processes on a system database of their own (created once, dropped at the end),
    launched and warmed up; each `measure` has every process start its share of N workflows,
    then releases them all at once."""

    def __init__(self, side, processes, threads, pool_size, common):
        self.side, self.processes, self.threads, self.pool_size = (
            side,
            processes,
            threads,
            pool_size,
        )
        self.tool, self.sampler, self.deadline_s, self.tool_timeout, self.say = common
        self.database = scratch.scratch_name(side)
        self.peers: list[_Peer] = []

    @classmethod
    def started(cls, side, processes, threads, pool_size, common, enabled: bool):
        return cls(side, processes, threads, pool_size, common) if enabled else _Nothing()

    def __enter__(self) -> _Dbos:
        scratch.create_database(self.database)
        threads = self.threads or "unbounded"
        self.say(
            f"DBOS ({self.side}): {self.processes} process(es), {threads} executor threads, "
            f"system database pool {self.pool_size or 'default'}"
        )
        try:
            self.peers = [
                _Peer(
                    [
                        *[sys.executable, "-m", "taskpilots.evidence.bench_peers", "dbos-io"],
                        *["--url", database_url(self.database), "--call-url", self.tool.url],
                        *["--timeout", str(self.tool_timeout), "--threads", str(self.threads)],
                        *["--pool-size", str(self.pool_size)],
                        *["--executor-id", f"{self.side}-{n}"],
                    ]
                )
                for n in range(self.processes)
            ]
            launched = [peer.answer(120) for peer in self.peers]  # launch, migrate, warm up
            self.sys_db_pool_size = launched[0]["sys_db_pool_size"]
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        for peer in self.peers:
            peer.close()
        scratch.drop_database(self.database)

    def measure(self, runs: int, label: str) -> dict:
        tool, sampler, say, side = self.tool, self.sampler, self.say, self.side
        groups = [peer.process.pid for peer in self.peers]
        tool.reset(side)
        sampler.watch(database=self.database, process_groups=groups)
        sampler.restart()
        shares = [
            runs // len(self.peers) + (n < runs % len(self.peers)) for n in range(len(groups))
        ]
        for peer, share in zip(self.peers, shares, strict=True):
            peer.send({"start": {"side": side, "count": share}})
        ready = [peer.answer(self.deadline_s) for peer in self.peers]
        start_s = max(r["start_s"] for r in ready)
        db_before, cpu_before = backend_cpu_s(self.database), process_groups_cpu_s(groups)
        released_at = time.time()
        for peer in self.peers:
            peer.send("go")
        deadline = time.monotonic() + self.deadline_s
        done: list[dict] = []
        for peer in self.peers:
            while True:
                try:
                    done.append(peer.answer(1, deadline=deadline))
                    break
                except queue.Empty:
                    stats = tool.stats(side)
                    say(
                        f"  {side}: {stats.get('answered', 0) // 2}/{runs} done, "
                        f"{stats.get('in_flight', 0)} in flight (peak "
                        f"{stats.get('peak_in_flight', 0)}), {sampler.connections} connections"
                    )
        cpu_after, db_after = process_groups_cpu_s(groups), backend_cpu_s(self.database)
        sampler.pause()
        landed = tool.stats(side, keys=True)
        makespan = max(d["done_at"] for d in done) - released_at
        failed = sum(d["failed"] for d in done)
        say(
            f"DBOS ({side}): {runs - failed}/{runs} workflows in {makespan:.2f} s, peak "
            f"{landed['peak_in_flight']} calls in flight, {sampler.peak_rss_mb:.0f} MB, "
            f"{sampler.peak_connections} connections"
        )
        return {
            "makespan_s": round(makespan, 3),
            "start_s": round(start_s, 3),
            "peak_in_flight": landed["peak_in_flight"],
            "calls": landed["calls"],
            "duplicates": landed["duplicate_keys"],
            "failed": failed,
            "failures": [f for d in done for f in d["failures"]][:5],
            # Workflows whose two calls did not both land (keys are `<workflow id>-a` and `-b`).
            "lost": runs - _both_calls_landed(landed.get("keys", [])),
            "cpu_s": _rounded(None if cpu_before is None else cpu_after - cpu_before, 2),
            "cpu_ms_per_run": _per_run_ms(cpu_before, cpu_after, runs),
            "db_cpu_ms_per_run": _per_run_ms(db_before, db_after, runs),
            "rss_mb": round(sampler.peak_rss_mb, 1),
            "connections_peak": sampler.peak_connections,
            "threads_peak": max(d["threads_peak"] for d in done),
            "processes": len(self.peers),
            "threads": self.threads or None,
            "sys_db_pool_size": self.sys_db_pool_size,
        }


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


class _Peer:
    """One `bench_peers dbos-io` process in a process group of its own: JSON commands to its
    stdin, its JSON answers read from stdout by a thread."""

    def __init__(self, command: list[str]):
        self.process = subprocess.Popen(
            command,
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.answers: queue.Queue = queue.Queue()
        self.errors: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._drain, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            if line.startswith("{"):
                self.answers.put(json.loads(line))
        self.answers.put(None)  # the process ended

    def _drain(self) -> None:
        for line in self.process.stderr:
            self.errors = [*self.errors[-40:], line]

    def send(self, command) -> None:
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()

    def answer(self, timeout: float, deadline: float | None = None) -> dict:
        """The next answer; queue.Empty after `timeout` s (RuntimeError past the deadline or
        when the process ended)."""
        if deadline is not None and time.monotonic() > deadline:
            raise RuntimeError("DBOS did not finish in time:\n" + "".join(self.errors[-20:]))
        try:
            answer = self.answers.get(timeout=timeout)
        except queue.Empty:
            if deadline is None:
                raise RuntimeError(
                    "DBOS did not answer in time:\n" + "".join(self.errors[-20:])
                ) from None
            raise
        if answer is None:
            raise RuntimeError("DBOS ended:\n" + "".join(self.errors[-20:]))
        return answer

    def close(self) -> None:
        import contextlib
        import signal

        if self.process.poll() is None:
            with contextlib.suppress(OSError, ValueError):
                self.send("quit")
                self.process.stdin.close()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)


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

"""`manage.py bench engine`: TaskPilots's throughput per step against DBOS Transact doing the same
work, in interleaved pairs on the same machine and the same PostgreSQL, with what each costs.

What is compared (docs/benchmarks.md, "Engine throughput", says why each choice was made):

- **The same work.** `bench.five` (prepare, fetch, write_a, write_b, finish) with a 1–16 KB
  document in its input, returned by the read, carried by each write and by its receipt
  (bench_payloads.py). DBOS runs it as its documentation teaches (`docs`: the two pure
  computations as workflow code, the read and the writes as steps) and, reported beside it, with
  every line a step (`steps`, the earlier reference). A second workflow, `bench.verified`, makes
  TaskPilots take its slower path (writes to a tool that is reconciled by a verification read, so
  its baseline is read and kept before each call); DBOS's `verified` does the same reads as steps.
- **The same clock.** This machine's wall clock (CLOCK_REALTIME) on both sides, read by the
  client processes: from before the first run or workflow is created to the last run's
  `finished_at` (written by the worker just before its last commit) or the last workflow's
  return. Creating the runs is inside both clocks.
- **Interleaved pairs.** After a calibration (every DBOS concurrency tried, all reported), `pairs`
  rounds of TaskPilots / DBOS docs / DBOS steps, the order reversed every other round, each
  measurement sized to last about `seconds`, a CHECKPOINT before each, no database created or
  dropped between them. The paired ratios' median and range are in the result.
- **The cost of each.** CPU per step of every process involved (TaskPilots: the workers, the
  client that creates the runs, the broker, PostgreSQL's backends; DBOS: its processes and their
  backends), durable commits per run (transaction ids the cluster handed out during the
  measurement: writing transactions only), statements per run (counted on the client: Django's
  cursor in-process for TaskPilots, SQLAlchemy's for DBOS), WAL bytes per run
  (`pg_current_wal_lsn()` before and after) and, where pg_walinspect can be had, WAL records per
  run by kind: row inserts, updates and HOT updates, index entries, row locks, full-page images,
  and the TOAST chunks (values still over about 2 KB once compressed) with their index entries.
- **A baseline that means something.** Single-row INSERT commits per second at each system's
  connection count, and `pg_test_fsync`'s one-8 KB-write rate where it is installed.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from django.conf import settings
from django.db import connection
from django.db.models import Max
from django.test.utils import CaptureQueriesContext

from runs import engine
from runs.models import Run
from taskpilots.evidence import scratch
from taskpilots.evidence.bench import (
    BENCH_MODULES,
    _worker_pool,
    baseline_commits_per_s,
    broker_name,
    percentile,
)
from taskpilots.evidence.bench_payloads import document
from taskpilots.evidence.workers import ROOT, backend_cpu_s, database_url, process_groups_cpu_s

Say = Callable[[str], None]
STEPS_PER_RUN = 5
VARIANTS = ("docs", "steps")  # DBOS's two ways of writing bench.five
DBOS_THREADS = (1, 4, 16)


# --------------------------------------------------------------------------------------------
# What the server says: transaction ids, WAL position, checkpoints.


def _server_counters() -> tuple[int, int, str]:
    """(the next transaction id, the WAL insert position in bytes and as an LSN), cluster-wide
    and exact: a transaction id is handed out only to a transaction that writes, so their
    difference over a measurement counts its durable commits (and the few aborts)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint,"
            " pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint, pg_current_wal_lsn()::text"
        )
        return cursor.fetchone()


# What PostgreSQL wrote, by kind of WAL record (pg_walinspect's record types).
_WAL_KINDS = {
    "heap_inserts": ("Heap/INSERT", "Heap/INSERT+INIT"),
    "heap_updates": ("Heap/UPDATE", "Heap/UPDATE+INIT"),
    "hot_updates": ("Heap/HOT_UPDATE", "Heap/HOT_UPDATE+INIT"),
    "index_inserts": ("Btree/INSERT_LEAF", "Btree/INSERT_POST", "Btree/INSERT_UPPER"),
    "row_locks": ("Heap/LOCK",),
}


def _owner():
    """A connection to this database as its owner (the tests act as the application role, which
    may neither create the extension nor read the WAL)."""
    import psycopg

    return psycopg.connect(database_url(owner=True), autocommit=True)


def _walinspect() -> bool:
    """pg_walinspect in the scratch database (PostgreSQL 15's contrib; a superuser's right):
    False where it cannot be had, and the records by kind are then not reported."""
    import psycopg

    try:
        with _owner() as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        return True
    except psycopg.Error:
        return False


def _wal_records(start: str, end: str, runs: int) -> dict | None:
    """WAL records per run between two LSNs, by kind (heap inserts, updates and HOT updates,
    index insertions, row locks, full-page images; the tables' rows and index entries apart from
    TOAST's chunks and their index entries): what each run made PostgreSQL do, which the bytes
    alone do not say. Cluster-wide, as the bytes are; None without pg_walinspect."""
    import psycopg

    try:
        with _owner() as conn:
            rows = conn.execute(
                'SELECT "resource_manager/record_type", count, fpi_size'
                " FROM pg_get_wal_stats(%s::pg_lsn,"
                " LEAST(%s::pg_lsn, pg_current_wal_flush_lsn()), true)",
                [start, end],
            ).fetchall()
            toast_rows, toast_entries = _toast_inserts(conn, start, end)
    except psycopg.Error:
        return None
    counts = {kind: count for kind, count, _ in rows}
    figures = {
        name: round(sum(counts.get(kind, 0) for kind in kinds) / runs, 1)
        for name, kinds in _WAL_KINDS.items()
    }
    # The rows and index entries of the tables themselves; TOAST's apart (see _toast_inserts).
    figures["heap_inserts"] = round(figures["heap_inserts"] - toast_rows / runs, 1)
    figures["index_inserts"] = round(figures["index_inserts"] - toast_entries / runs, 1)
    figures["toast_chunks"] = round(toast_rows / runs, 1)
    figures["toast_index_entries"] = round(toast_entries / runs, 1)
    figures["full_page_image_bytes"] = round(sum(fpi for _, _, fpi in rows) / runs)
    return figures


def _toast_inserts(conn, start: str, end: str) -> tuple[int, int]:
    """Rows and index entries inserted between two LSNs into TOAST tables and their indexes:
    the out-of-line chunks of values still over about 2 KB once compressed, in whichever
    database wrote them (each record names its database and relation file, looked up in that
    database's catalog). `conn` is the owner's connection _wal_records holds."""
    import psycopg

    rows = conn.execute(
        "SELECT m[1]::oid, m[2]::oid, count(*) FROM ("
        " SELECT regexp_match(block_ref, 'rel \\d+/(\\d+)/(\\d+)') AS m"
        " FROM pg_get_wal_records_info(%s::pg_lsn,"
        " LEAST(%s::pg_lsn, pg_current_wal_flush_lsn()))"
        " WHERE resource_manager IN ('Heap', 'Btree') AND record_type LIKE 'INSERT%%') AS r"
        " WHERE m IS NOT NULL GROUP BY 1, 2",
        [start, end],
    ).fetchall()
    names = dict(conn.execute("SELECT oid, datname FROM pg_database").fetchall())
    by_database: dict[int, dict[int, int]] = {}
    for database, node, count in rows:
        by_database.setdefault(database, {})[node] = count
    toast_rows = toast_entries = 0
    for database, counts in by_database.items():
        if database not in names:
            continue  # dropped since
        with psycopg.connect(database_url(names[database], owner=True), autocommit=True) as db:
            toast = db.execute(
                "SELECT relfilenode, relkind FROM pg_class"
                " WHERE relnamespace = 'pg_toast'::regnamespace AND relfilenode <> 0"
            ).fetchall()
        for node, kind in toast:
            if kind == "t":
                toast_rows += counts.get(node, 0)
            else:
                toast_entries += counts.get(node, 0)
    return toast_rows, toast_entries


def _checkpoint() -> bool:
    """CHECKPOINT, so each measurement starts with no dirty buffers left by the one before
    (a superuser's or pg_checkpoint's right: False where the login has neither)."""
    import psycopg

    try:
        with psycopg.connect(database_url("postgres", owner=True), autocommit=True) as conn:
            conn.execute("CHECKPOINT")
        return True
    except psycopg.Error:
        return False


def _broker_cpu_s() -> float | None:
    """CPU seconds of the configured broker's server process on this machine (RabbitMQ's
    beam.smp or redis-server), None for the embedded filesystem broker or a remote one."""
    process = {"rabbitmq": "beam.smp", "redis": "redis-server"}.get(broker_name())
    host = urlsplit(settings.CELERY_BROKER_URL).hostname or ""
    if process is None or host not in ("localhost", "127.0.0.1", "::1"):
        return None
    try:
        ticks = os.sysconf("SC_CLK_TCK")
        total, found = 0, False
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                text = stat.read_text()
            except OSError:
                continue
            name = text[text.index("(") + 1 : text.rindex(")")]
            if name == process:
                fields = text[text.rindex(")") + 2 :].split()
                total += int(fields[11]) + int(fields[12])
                found = True
        return total / ticks if found else None
    except (OSError, ValueError):
        return None


def fsync_ops_per_s() -> float | None:
    """pg_test_fsync's rate for one 8 KB write with fdatasync (Linux's default wal_sync_method),
    in the temporary directory: what one connection's commits could reach on this disk. None
    where pg_test_fsync is not installed."""
    found = shutil.which("pg_test_fsync") or next(
        iter(sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_test_fsync"), reverse=True)), None
    )
    if not found:
        return None
    target = Path(os.environ.get("TMPDIR", "/tmp")) / f"tp-fsync-{uuid.uuid4().hex[:6]}"
    proc = subprocess.Popen(
        [str(found), "-s", "1", "-f", str(target)], stdout=subprocess.PIPE, text=True
    )
    try:
        for line in proc.stdout:
            match = re.match(r"\s+fdatasync\s+([\d.]+) ops/sec", line)
            if match:
                return float(match.group(1))
        return None
    finally:
        proc.kill()
        proc.wait()
        target.unlink(missing_ok=True)


# --------------------------------------------------------------------------------------------
# One measurement of each side.


class TaskPilotsSide:
    """bench.five (or bench.verified) on Celery workers started once for every measurement."""

    def __init__(self, pool, groups: list[int], payload_kb: tuple[int, int]):
        self.pool, self.groups, self.payload_kb = pool, groups, payload_kb
        self.database = connection.settings_dict["NAME"]
        self.next_n = 0

    def measure(self, workflow: str, runs: int) -> dict:
        low, high = self.payload_kb
        first, self.next_n = self.next_n, self.next_n + runs
        inputs = [{"n": n, "doc": document(n, low, high)} for n in range(first, first + runs)]
        tag = uuid.uuid4().hex[:8]
        checkpointed = _checkpoint()
        xid, wal, lsn = _server_counters()
        cpu = (process_groups_cpu_s(self.groups), backend_cpu_s(self.database), _broker_cpu_s())
        started = time.time()
        client = _create_runs(workflow, inputs, f"be-{tag}-", len(self.groups))
        _wait_done(f"be-{tag}-", runs)
        mine = Run.objects.filter(business_key__startswith=f"be-{tag}-")
        finished = mine.aggregate(last=Max("finished_at"))["last"]
        elapsed = finished.timestamp() - started
        xid_after, wal_after, lsn_after = _server_counters()
        after = (process_groups_cpu_s(self.groups), backend_cpu_s(self.database), _broker_cpu_s())
        durations = [
            (done - begun).total_seconds() * 1000
            for begun, done in mine.values_list("created_at", "finished_at")
        ]
        steps = runs * STEPS_PER_RUN
        return {
            "system": "taskpilots",
            "workflow": workflow,
            "runs": runs,
            "steps": steps,
            "elapsed_s": round(elapsed, 3),
            "steps_per_s": round(steps / elapsed, 1),
            "checkpoint": checkpointed,
            "commits_per_run": round((xid_after - xid) / runs, 2),
            "wal_bytes_per_run": round((wal_after - wal) / runs),
            "wal_records_per_run": _wal_records(lsn, lsn_after, runs),
            "cpu_ms_per_step": _cpu_split(
                {
                    "workers": _delta(cpu[0], after[0]),
                    "client": client,
                    "broker": _delta(cpu[2], after[2]),
                    "postgres": _delta(cpu[1], after[1]),
                },
                steps,
            ),
            "run_p50_ms": round(percentile(durations, 50), 1),
            "run_p99_ms": round(percentile(durations, 99), 1),
        }


def _create_runs(workflow: str, inputs: list[dict], prefix: str, clients: int) -> float:
    """Create the runs from `clients` threads at once, as an application's threads would, each
    run hinted as its transaction commits (DBOS's processes start their own workflows inside its
    clock in the same way); the CPU seconds the threads spent. Threads, not forked processes:
    a fork of this process (its worker pumps, the broker's and the database's connections)
    inherits state a child must not touch."""
    from concurrent.futures import ThreadPoolExecutor

    from django.db import connections

    def create(share: list[dict]) -> float:
        began = time.thread_time()
        try:
            for data in share:
                engine.start_run(workflow, data, business_key=f"{prefix}{data['n']}")
            return time.thread_time() - began
        finally:
            connections.close_all()  # this thread's own

    with ThreadPoolExecutor(clients) as pool:
        return sum(pool.map(create, [inputs[i::clients] for i in range(clients)]))


def _wait_done(prefix: str, expected: int, timeout: float = 900) -> None:
    """Until every run of this measurement succeeded: a poll four times a second on the business
    keys' index (the clock is the runs' own finished_at, so the poll only notices the end)."""
    runs = Run.objects.filter(business_key__startswith=prefix)
    deadline = time.monotonic() + timeout
    while runs.filter(status="succeeded").count() < expected:
        if time.monotonic() > deadline:
            stuck = runs.exclude(status="succeeded").values_list("status", flat=True)[:5]
            raise RuntimeError(f"benchmark runs did not finish in {timeout:.0f} s: {list(stuck)}")
        time.sleep(0.25)


class DbosSide:
    """DBOS processes (engine_peer.py), started for each measurement on a database of each
    variant's own, created once before the first measurement."""

    def __init__(self, processes: int, payload_kb: tuple[int, int]):
        self.processes, self.payload_kb = processes, payload_kb
        self.databases = {}
        self.next_n = 0

    def database(self, variant: str) -> str:
        if variant not in self.databases:
            name = scratch.scratch_name(f"dbos_{variant}")
            scratch.create_database(name)
            self.databases[variant] = name
        return self.databases[variant]

    def close(self) -> None:
        for name in self.databases.values():
            scratch.drop_database(name)

    def measure(self, variant: str, workflows: int, threads: int) -> dict:
        name = self.database(variant)
        share = max(1, math.ceil(workflows / self.processes))
        first, self.next_n = self.next_n, self.next_n + share * self.processes
        low, high = self.payload_kb
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "taskpilots.evidence.engine_peer",
                    "--url",
                    database_url(name),
                    "--variant",
                    variant,
                    "--workflows",
                    str(share),
                    "--first",
                    str(first + i * share),
                    "--threads",
                    str(threads),
                    "--payload-kb",
                    f"{low},{high}",
                ],
                cwd=ROOT,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for i in range(self.processes)
        ]
        try:
            for proc in procs:
                _expect_line(proc, "ready")
            checkpointed = _checkpoint()
            xid, wal, lsn = _server_counters()
            backends = backend_cpu_s(name)
            for proc in procs:  # released together
                proc.stdin.write("go\n")
                proc.stdin.flush()
            results = [_expect_line(proc, "workflows") for proc in procs]
            xid_after, wal_after, lsn_after = _server_counters()
            backends = _delta(backends, backend_cpu_s(name))
            for proc in procs:
                proc.stdin.write("quit\n")
                proc.stdin.flush()
            for proc in procs:
                proc.wait(timeout=60)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
        count = sum(r["workflows"] for r in results)
        steps = count * STEPS_PER_RUN
        elapsed = max(r["finished_at"] for r in results) - min(r["started_at"] for r in results)
        return {
            "system": "dbos",
            "variant": variant,
            "threads": threads,
            "processes": self.processes,
            "runs": count,
            "steps": steps,
            "elapsed_s": round(elapsed, 3),
            "steps_per_s": round(steps / elapsed, 1),
            "checkpoint": checkpointed,
            "commits_per_run": round((xid_after - xid) / count, 2),
            "statements_per_run": round(sum(r["statements"] for r in results) / count, 2),
            "wal_bytes_per_run": round((wal_after - wal) / count),
            "wal_records_per_run": _wal_records(lsn, lsn_after, count),
            "cpu_ms_per_step": _cpu_split(
                {"processes": sum(r["cpu_s"] for r in results), "postgres": backends}, steps
            ),
        }


def _expect_line(proc, key: str) -> dict:
    """The peer's next JSON line with `key`, or its error."""
    import json

    for line in proc.stdout:
        if line.startswith("{"):
            data = json.loads(line)
            if key in data:
                return data
    proc.wait(timeout=30)
    raise RuntimeError(f"DBOS peer failed: {proc.stderr.read().strip()[-800:]}")


def _delta(before, after):
    return None if before is None or after is None else after - before


def _cpu_split(parts: dict, steps: int) -> dict:
    split = {k: (None if v is None else round(v * 1000 / steps, 3)) for k, v in parts.items()}
    split["total"] = round(sum(v for v in split.values() if v is not None), 3)
    return split


# --------------------------------------------------------------------------------------------
# The benchmark.


def statements_per_run(workflow: str) -> int:
    """The statements one run of `workflow` sends, counted on Django's cursor as a worker runs
    it (engine.advance in this process, caches warm)."""
    previous = settings.TASKPILOTS["DISPATCH"]
    settings.TASKPILOTS["DISPATCH"] = "none"
    try:
        key = uuid.uuid4().hex[:8]
        engine.run_until_quiet(
            engine.start_run(workflow, {"n": -2, "doc": document(2)}, business_key=f"sw-{key}")[
                0
            ].pk
        )
        run, _ = engine.start_run(workflow, {"n": -3, "doc": document(3)}, business_key=f"s-{key}")
        with CaptureQueriesContext(connection) as queries:
            engine.advance(run.pk, budget=60)
        counted = [
            q for q in queries.captured_queries if not q["sql"].startswith("SELECT nextval(")
        ]
        return len(counted)
    finally:
        settings.TASKPILOTS["DISPATCH"] = previous


def _sized(rate_steps_per_s: float, seconds: float, minimum: int) -> int:
    return max(minimum, math.ceil(rate_steps_per_s * seconds / STEPS_PER_RUN))


def _paired(ours: list[dict], theirs: list[dict]) -> dict | None:
    ratios = [a["steps_per_s"] / b["steps_per_s"] for a, b in zip(ours, theirs, strict=False)]
    if not ratios:
        return None
    return {
        "median": round(statistics.median(ratios), 3),
        "min": round(min(ratios), 3),
        "max": round(max(ratios), 3),
        "pairs": [round(r, 3) for r in ratios],
    }


def _summary(samples: list[dict]) -> dict | None:
    if not samples:
        return None
    rates = [s["steps_per_s"] for s in samples]
    keys = ("commits_per_run", "wal_bytes_per_run", "statements_per_run")
    records = [s.get("wal_records_per_run") for s in samples]
    by_kind = (
        {"wal_records_per_run": {k: statistics.median(r[k] for r in records) for k in records[0]}}
        if all(records)
        else {}
    )
    return {
        **by_kind,
        "steps_per_s_median": round(statistics.median(rates), 1),
        "steps_per_s_min": round(min(rates), 1),
        "steps_per_s_max": round(max(rates), 1),
        **{k: statistics.median(s[k] for s in samples) for k in keys if k in samples[0]},
        "cpu_ms_per_step": {
            part: round(statistics.median(s["cpu_ms_per_step"][part] or 0 for s in samples), 3)
            for part in samples[0]["cpu_ms_per_step"]
        },
    }


class _Session:
    """The measurements of one `bench engine`, each kept as a raw sample and said as it ends."""

    def __init__(self, ours: TaskPilotsSide, dbos: DbosSide, statements: dict, say: Say):
        self.ours, self.dbos, self.statements, self.say = ours, dbos, statements, say
        self.samples: list[dict] = []

    def taskpilots(self, workflow: str, count: int, phase: str) -> dict:
        sample = {
            "phase": phase,
            **self.ours.measure(workflow, count),
            "statements_per_run": self.statements[workflow],
        }
        self.samples.append(sample)
        self.say(
            f"  TaskPilots {workflow}: {sample['steps_per_s']:,.0f} steps/s "
            f"({count} runs, {sample['elapsed_s']:.1f} s)"
        )
        return sample

    def peer(self, variant: str, count: int, threads: int, phase: str) -> dict:
        sample = {"phase": phase, **self.dbos.measure(variant, count, threads)}
        self.samples.append(sample)
        self.say(
            f"  DBOS {variant}, {threads} at once per process: "
            f"{sample['steps_per_s']:,.0f} steps/s ({sample['runs']} workflows, "
            f"{sample['elapsed_s']:.1f} s)"
        )
        return sample

    def calibrate(self, runs: int, with_dbos: bool, dbos_threads) -> tuple[float, dict]:
        """TaskPilots's rate, and DBOS's best (rate, concurrency) of each variant."""
        self.say(f"calibration: {runs} runs each, every DBOS concurrency in {dbos_threads}")
        our_rate = self.taskpilots("bench.five", runs, "calibration")["steps_per_s"]
        best: dict[str, tuple[float, int]] = {}
        for variant in VARIANTS if with_dbos else ():
            for threads in dbos_threads:
                rate = self.peer(variant, runs, threads, "calibration")["steps_per_s"]
                if variant not in best or rate > best[variant][0]:
                    best[variant] = (rate, threads)
        return our_rate, best

    def pairs(self, pairs: int, seconds: float, runs: int, our_rate: float, best: dict) -> dict:
        """The interleaved rounds, the order reversed every other round."""
        paired = {"taskpilots": [], **{v: [] for v in VARIANTS}}
        for i in range(pairs):
            order = ["taskpilots", *(VARIANTS if best else ())]
            if i % 2:
                order.reverse()
            self.say(f"pair {i + 1}/{pairs}: {' → '.join(order)}, about {seconds:.0f} s each")
            for side in order:
                if side == "taskpilots":
                    count = _sized(our_rate, seconds, runs)
                    paired[side].append(self.taskpilots("bench.five", count, f"pair {i + 1}"))
                else:
                    rate, threads = best[side]
                    count = _sized(rate, seconds, runs)
                    paired[side].append(self.peer(side, count, threads, f"pair {i + 1}"))
        return paired

    def slow_path(self, seconds: float, runs: int, our_rate: float, best: dict) -> list[dict]:
        self.say("the slow path: bench.verified on each, once")
        slow = [self.taskpilots("bench.verified", _sized(our_rate / 2, seconds, runs), "slow")]
        if "docs" in best:
            rate, threads = best["docs"]
            slow.append(self.peer("verified", _sized(rate / 2, seconds, runs), threads, "slow"))
        return slow


def bench_engine(
    runs: int = 300,
    workers: int = 2,
    say: Say = print,
    with_dbos: bool = True,
    pool: str | None = None,
    concurrency: int | None = None,
    pairs: int = 5,
    seconds: float = 30.0,
    payload_kb: tuple[int, int] = (1, 16),
    dbos_threads: tuple[int, ...] = DBOS_THREADS,
) -> dict:
    """See the module's docstring. `runs` is the calibration's size and every measurement's
    least; `seconds` how long each paired measurement is sized to last."""
    from taskpilots.evidence import bench_flows  # noqa: F401  (the workflows, here too)
    from taskpilots.workerconf import CONCURRENCY, worker_config

    config = worker_config(pool, concurrency or min(CONCURRENCY, settings.DB_POOL_SIZE or 8))
    env = {"TASKPILOTS_WORKFLOW_MODULES": BENCH_MODULES, "TASKPILOTS_INLINE_BUDGET_SECONDS": "30"}
    statements = {wf: statements_per_run(wf) for wf in ("bench.five", "bench.verified")}
    if not _walinspect():
        say("pg_walinspect is not available: WAL records by kind are not reported")
    dbos = DbosSide(workers, payload_kb)
    try:
        with _worker_pool("celery", {**env, **config.env}) as processes:
            say(
                f"starting {workers} Celery worker processes ({config.pool}, concurrency "
                f"{config.concurrency}; {broker_name()})"
            )
            groups = [processes.start(options=config.options()).process.pid for _ in range(workers)]
            ours = TaskPilotsSide(processes, groups, payload_kb)
            ours.measure("bench.five", min(runs, 50))  # warm up: connections, plans, caches
            session = _Session(ours, dbos, statements, say)
            our_rate, best = session.calibrate(runs, with_dbos, dbos_threads)
            paired = session.pairs(pairs, seconds, runs, our_rate, best)
            slow = session.slow_path(seconds, runs, our_rate, best)
    finally:
        dbos.close()
    tp_connections = workers * min(config.concurrency, settings.DB_POOL_SIZE or config.concurrency)
    connections = {tp_connections} | {workers * threads for _, threads in best.values()}
    say(f"baseline: single-row INSERT commits at {sorted(connections)} connections")
    baseline = {str(c): round(baseline_commits_per_s(c), 1) for c in sorted(connections)}
    fsync = fsync_ops_per_s()
    return _result(
        session.samples,
        paired,
        slow,
        best,
        baseline,
        fsync,
        statements,
        config,
        workers,
        payload_kb,
    )


def _result(samples, paired, slow, best, baseline, fsync, statements, config, workers, payload):
    ours = paired["taskpilots"]
    ours_summary = _summary(ours)
    commits_per_s = [s["commits_per_run"] * s["runs"] / s["elapsed_s"] for s in ours]
    tp_baseline = baseline[str(workers * min(config.concurrency, settings.DB_POOL_SIZE or 999))]
    result = {
        "benchmark": "engine",
        "clock": "this machine's wall clock on both sides, from before the first run is created "
        "to the last run's finish",
        "workers": workers,
        "worker_pool": config.pool,
        "worker_concurrency": config.concurrency,
        "broker": broker_name(),
        "payload_kb": list(payload),
        "pairs": len(ours),
        "seconds_each": round(statistics.median(s["elapsed_s"] for s in ours), 1) if ours else 0,
        "taskpilots": ours_summary,
        "steps_per_s": ours_summary["steps_per_s_median"] if ours_summary else None,
        "steps_per_s_min": ours_summary["steps_per_s_min"] if ours_summary else None,
        "statements_per_run": statements,
        "baseline_commits_per_s": baseline,
        "pg_test_fsync_ops_per_s": fsync,
        # TaskPilots's durable commits per second as a share of what single-row commits reach
        # at its connection count.
        "commit_share_of_baseline": round(statistics.median(commits_per_s) / tp_baseline, 3)
        if commits_per_s and tp_baseline
        else None,
        "samples": samples,
    }
    for variant in VARIANTS:
        if paired.get(variant):
            result[f"dbos_{variant}"] = {
                **_summary(paired[variant]),
                "threads": best[variant][1],
                "processes": workers,
            }
            result[f"vs_dbos_{variant}"] = _paired(ours, paired[variant])
    result["vs_dbos"] = (
        result.get("vs_dbos_docs", {}).get("median") if "vs_dbos_docs" in result else None
    )
    result["slow_path"] = {s["system"]: _summary([s]) for s in slow}
    if len(slow) == 2:
        result["slow_path"]["vs_dbos"] = round(slow[0]["steps_per_s"] / slow[1]["steps_per_s"], 3)
    result["concurrency_tried"] = {
        variant: {
            str(s["threads"]): s["steps_per_s"]
            for s in samples
            if s["phase"] == "calibration" and s.get("variant") == variant
        }
        for variant in VARIANTS
        if best
    }
    return result

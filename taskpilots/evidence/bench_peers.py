"""The references of the benchmarks, each run as its own process, without Django:

    python -m taskpilots.evidence.bench_peers inserts --dsn URL --table T --seconds S --start-at T
        single-row INSERT commits from plain psycopg (the physical baseline)
    python -m taskpilots.evidence.bench_peers dbos-io --url postgresql://... --call-url URL
            [--threads T --pool-size P --executor-id ID --timeout S]
        bench io's workflow on DBOS Transact, one long-lived process driven by one JSON command
        a line on stdin (`start` its share of the workflows, `go`, `quit`; bench_io.py)

`bench engine`'s DBOS side is engine_peer.py, `bench crash`'s crash_peer.py.
"""

from __future__ import annotations

import argparse
import json
import time


def inserts(args) -> None:
    import psycopg

    with psycopg.connect(args.dsn, autocommit=True) as conn:
        while time.time() < args.start_at:
            time.sleep(0.001)
        started = time.perf_counter()
        deadline = started + args.seconds
        count = 0
        while time.perf_counter() < deadline:
            conn.execute(f"INSERT INTO {args.table} (payload) VALUES (%s)", ("x" * 64,))
            count += 1
        print(json.dumps({"commits": count, "elapsed_s": time.perf_counter() - started}))


def dbos_io(args) -> None:
    """bench io's workflow on DBOS Transact, one process of several, driven over stdin/stdout.

    `--threads` bounds DBOS's executor (the threads that run workflows and their steps, 0 for
    DBOS's default: unbounded) and `--pool-size` its system database pool (0 for DBOS's default,
    20), so the benchmark can give it exactly a TaskPilots worker's budget. `--executor-id`
    keeps each process's startup recovery to its own workflows.

    After launching and one warm-up workflow it prints {"launched": ...} and reads one JSON
    command a line: {"start": {"side": S, "count": N}} starts N workflows (each recorded
    durably, then held at a barrier before its first step; beyond --threads they wait in the
    executor's queue) and answers {"ready": ...}; "go" releases them and answers, once every
    one finished, with the wall-clock time (time.time()) this process saw its last result;
    "quit" or the end of stdin ends the process."""
    import sys
    import threading

    from dbos import DBOS

    from taskpilots.httpclient import SharedClient

    client = SharedClient(trust_env=False)
    dbos = DBOS(config=_io_config(args))

    @DBOS.step()
    def call(side: str, n: int, which: str, key: str) -> dict:
        response = client().post(
            f"{args.call_url}/call/{side}",
            json={"n": n, "call": which},
            headers={"Idempotency-Key": key},
            timeout=args.timeout,
        )
        response.raise_for_status()
        return response.json()

    # The counterpart of TaskPilots' runs created before their hints are sent: started workflows
    # wait here (holding no connection) until every one of them is recorded.
    release = threading.Event()

    @DBOS.workflow()
    def io(side: str, n: int) -> None:
        release.wait()
        call(side, n, "a", f"{DBOS.workflow_id}-a")
        call(side, n, "b", f"{DBOS.workflow_id}-b")

    DBOS.launch()
    release.set()
    io("dbos-warmup", -1)  # connections, schema
    release.clear()
    _answer({"launched": True, "sys_db_pool_size": _dbos_pool_size(dbos)})
    _serve_io(sys.stdin, lambda side, n: DBOS.start_workflow(io, side, n), release)
    DBOS.destroy()


def _io_config(args) -> dict:
    """DBOS's configuration for one bench io process: its executor and pool budgets."""
    config = {
        "name": "taskpilots-bench-io",
        "system_database_url": args.url,
        "log_level": "WARNING",
        "executor_id": args.executor_id,
    }
    if args.threads:
        config["max_executor_threads"] = args.threads
    if args.pool_size:
        config["sys_db_pool_size"] = args.pool_size
    return config


def _answer(figures: dict) -> None:
    print(json.dumps(figures), flush=True)


def _serve_io(lines, start, release) -> None:
    """The commands of dbos_io's docstring, one a line, until "quit" or the end of `lines`."""
    handles: list = []
    for line in lines:
        command = json.loads(line)
        if command == "go":
            with _ThreadPeak() as threads:
                cpu_before = _cpu_s()
                release.set()
                failed = _results(handles)
                done_at = time.time()
                cpu_s = _cpu_s() - cpu_before
            release.clear()
            _answer(
                {
                    "workflows": len(handles),
                    "done_at": done_at,
                    "failed": len(failed),
                    "failures": failed[:5],
                    "cpu_s": cpu_s,
                    "rss_mb": _peak_rss_mb(),
                    "threads_peak": threads.peak,
                }
            )
            handles = []
        elif isinstance(command, dict) and "start" in command:
            side, count = command["start"]["side"], command["start"]["count"]
            begun = time.perf_counter()
            handles = [start(side, n) for n in range(count)]
            _answer({"ready": True, "start_s": time.perf_counter() - begun})
        else:
            break


class _ThreadPeak:
    """The most threads this process ran at once while the block ran (sampled every 0.1 s)."""

    def __enter__(self):
        import threading

        self.peak, self._on = threading.active_count(), True
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()
        return self

    def _sample(self) -> None:
        import threading

        while self._on:
            self.peak = max(self.peak, threading.active_count())
            time.sleep(0.1)

    def __exit__(self, *exc) -> None:
        self._on = False
        self._sampler.join()


def _results(handles) -> list[str]:
    """Wait for every workflow; the failures, named."""
    failed = []
    for handle in handles:
        try:
            handle.get_result()
        except Exception as exc:  # counted, and the first few named
            failed.append(f"{type(exc).__name__}: {exc}"[:200])
    return failed


def _peak_rss_mb() -> float:
    import resource
    import sys

    # ru_maxrss: the peak resident set of this process, in KiB on Linux and bytes on macOS.
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def _cpu_s() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _dbos_pool_size(dbos) -> int | None:
    try:
        return dbos._sys_db.engine.pool.size()
    except Exception:  # a private attribute: the figure is informative only
        return None


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="peer", required=True)
    ins = sub.add_parser("inserts")
    ins.add_argument("--dsn", required=True)
    ins.add_argument("--table", required=True)
    ins.add_argument("--seconds", type=float, default=3.0)
    ins.add_argument("--start-at", type=float, default=0.0)
    dbos_io_parser = sub.add_parser("dbos-io")
    dbos_io_parser.add_argument("--url", required=True)
    dbos_io_parser.add_argument("--call-url", required=True)
    dbos_io_parser.add_argument("--timeout", type=float, default=10.0)
    dbos_io_parser.add_argument("--threads", type=int, default=0)
    dbos_io_parser.add_argument("--pool-size", type=int, default=0)
    dbos_io_parser.add_argument("--executor-id", default="local")
    args = parser.parse_args()
    if args.peer == "inserts":
        inserts(args)
        return
    dbos_io(args)


if __name__ == "__main__":
    main()

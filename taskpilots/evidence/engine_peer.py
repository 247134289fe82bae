"""The DBOS Transact side of `bench engine`, one process of it, without Django:

    python -m taskpilots.evidence.engine_peer --url postgresql://... --variant docs|steps|verified
        --workflows N --threads T --payload-kb LO,HI

The workflows are the ones `bench.five` and `bench.verified` run on TaskPilots
(taskpilots/evidence/bench_flows.py), with the same inputs and the same result sizes:

- `docs`: written as DBOS's documentation teaches — the pure computations (`prepare`, `finish`)
  are workflow code, the read and the two writes are `@DBOS.step`s;
- `steps`: every line a `@DBOS.step`, the two computations included (this benchmark's earlier
  reference, kept so the two can be compared);
- `verified`: the slow-path workflow — before each write a read of what is there (the baseline a
  tool without a lookup by key needs), then the write; as DBOS would write it, each a step.

The process speaks a small protocol on stdin/stdout so that the parent measures only the work:
it launches DBOS, warms up (connections, schema), prints `{"ready": ...}` and waits for a line on
stdin; it then runs its workflows, prints its figures as one JSON line (the wall clock when it
started and when its last workflow returned, this process's CPU, its statements and commits
counted on the client) and waits for a second line before it exits, so the parent can read its
PostgreSQL backends' CPU while they are still there.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time

from taskpilots.evidence.bench_payloads import document


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--variant", choices=["docs", "steps", "verified"], required=True)
    parser.add_argument("--workflows", type=int, required=True)
    parser.add_argument("--first", type=int, default=0, help="the first workflow's number")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--payload-kb", default="1,16")
    args = parser.parse_args()
    low, high = (int(v) for v in args.payload_kb.split(","))

    import sqlalchemy
    from dbos import DBOS, DBOSConfig

    config: DBOSConfig = {
        "name": "taskpilots-bench",
        "system_database_url": args.url,
        "log_level": "WARNING",
    }
    dbos = DBOS(config=config)
    workflow = _workflows(DBOS)[args.variant]
    DBOS.launch()

    statements = [0]
    engine = dbos._sys_db.engine  # the system database's SQLAlchemy engine

    @sqlalchemy.event.listens_for(engine, "before_cursor_execute")
    def _count(*_args) -> None:
        statements[0] += 1

    workflow(-1, document(-1, low, high))  # warm up: connections, schema, plans
    numbers = range(args.first, args.first + args.workflows)
    inputs = [(n, document(n, low, high)) for n in numbers]
    print(json.dumps({"ready": True}), flush=True)
    sys.stdin.readline()

    statements[0] = 0
    cpu_before = _cpu_s()
    started, finished = _run(workflow, inputs, args.threads)
    print(
        json.dumps(
            {
                "workflows": args.workflows,
                "started_at": started,
                "finished_at": finished,
                "cpu_s": _cpu_s() - cpu_before,
                "statements": statements[0],
                "input_bytes": sum(len(doc) for _, doc in inputs),
            }
        ),
        flush=True,
    )
    sys.stdin.readline()
    DBOS.destroy()


def _run(workflow, inputs: list, threads: int) -> tuple[float, float]:
    """Every workflow, one after another or `threads` at once (a thread each over a bounded
    pool, as a DBOS app would): the wall clock when it began and when the last returned."""
    started = time.time()
    if threads <= 1:
        for n, doc in inputs:
            workflow(n, doc)
    else:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda item: workflow(*item), inputs))
    return started, time.time()


def _workflows(DBOS) -> dict:
    """The three variants of the module's docstring, registered with DBOS (before its launch)."""
    stored: dict[str, dict] = {}  # the in-process system the writes change (as bench.write's)

    @DBOS.step()
    def fetch(n: int, doc: str) -> dict:
        return {"value": n, "doc": doc}

    @DBOS.step()
    def write(n: int, key: str, doc: str) -> dict:
        stored[key] = {"n": n}
        return {"id": key, "record": doc}

    @DBOS.step()
    def look(key: str) -> dict:
        return {"found": key in stored}

    @DBOS.step()
    def prepare_step(n: int) -> dict:
        return {"n": n}

    @DBOS.step()
    def finish_step() -> dict:
        return {"ok": True}

    @DBOS.workflow()
    def docs(n: int, doc: str) -> dict:
        prepared = {"n": n}  # pure computation: workflow code
        fetched = fetch(prepared["n"], doc)
        wid = DBOS.workflow_id
        write(n, f"{wid}-a", fetched["doc"])
        write(n + 1, f"{wid}-b", fetched["doc"])
        return {"ok": True}

    @DBOS.workflow()
    def steps(n: int, doc: str) -> dict:
        prepare_step(n)
        fetched = fetch(n, doc)
        wid = DBOS.workflow_id
        write(n, f"{wid}-a", fetched["doc"])
        write(n + 1, f"{wid}-b", fetched["doc"])
        return finish_step()

    @DBOS.workflow()
    def verified(n: int, doc: str) -> dict:
        prepared = {"n": n}
        fetched = fetch(prepared["n"], doc)
        wid = DBOS.workflow_id
        for suffix, m in (("a", n), ("b", n + 1)):
            look(f"{wid}-{suffix}")
            write(m, f"{wid}-{suffix}", fetched["doc"])
        return {"ok": True}

    return {"docs": docs, "steps": steps, "verified": verified}


if __name__ == "__main__":
    main()

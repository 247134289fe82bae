"""The references of the engine benchmark, each run as its own process, without Django:

    python -m taskpilots.evidence.bench_peers dbos --url postgresql://... --workflows N --start-at T
        the same 5-step workflow on DBOS Transact (the peer)
    python -m taskpilots.evidence.bench_peers inserts --dsn URL --table T --seconds S --start-at T
        single-row INSERT commits from plain psycopg (the physical baseline)

Each prints one JSON line with what it did and how long it took.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid


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


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="peer", required=True)
    dbos = sub.add_parser("dbos")
    dbos.add_argument("--url", required=True)
    dbos.add_argument("--workflows", type=int, required=True)
    dbos.add_argument("--start-at", type=float, default=0.0)
    ins = sub.add_parser("inserts")
    ins.add_argument("--dsn", required=True)
    ins.add_argument("--table", required=True)
    ins.add_argument("--seconds", type=float, default=3.0)
    ins.add_argument("--start-at", type=float, default=0.0)
    args = parser.parse_args()
    if args.peer == "inserts":
        inserts(args)
        return

    from dbos import DBOS, DBOSConfig

    config: DBOSConfig = {
        "name": "taskpilots-bench",
        "system_database_url": args.url,
        "log_level": "WARNING",
    }
    DBOS(config=config)

    @DBOS.step()
    def prepare(n: int) -> dict:
        return {"n": n}

    @DBOS.step()
    def fetch(n: int) -> dict:
        return {"value": n}

    @DBOS.step()
    def write(n: int, key: str) -> dict:
        return {"id": key}

    @DBOS.step()
    def finish() -> dict:
        return {"ok": True}

    @DBOS.workflow()
    def five(n: int) -> dict:
        prepare(n)
        fetch(n)
        wid = DBOS.workflow_id
        write(n, f"{wid}-a")
        write(n + 1, f"{wid}-b")
        return finish()

    DBOS.launch()
    five(-1)  # warm up: connections, schema
    while time.time() < args.start_at:
        time.sleep(0.005)
    started = time.perf_counter()
    for n in range(args.workflows):
        five(n)
    elapsed = time.perf_counter() - started
    print(json.dumps({"steps": args.workflows * 5, "elapsed_s": elapsed, "id": str(uuid.uuid4())}))
    DBOS.destroy()


if __name__ == "__main__":
    main()

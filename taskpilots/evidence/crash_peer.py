"""The DBOS side of `bench crash`: one process of a DBOS Transact app, written as DBOS's docs
teach, that the benchmark SIGKILLs mid-call and replaces with a fresh one.

    python -m taskpilots.evidence.crash_peer --url postgresql://... --target http://127.0.0.1:PORT

A `@DBOS.workflow` whose side effect is a `@DBOS.step` calling the crash target
(taskpilots/evidence/crash_target.py) with an idempotency key derived from the workflow id
(DBOS's documented pattern: the workflow id is the key). On start the process launches DBOS with
its default settings — which recovers the workflows left PENDING by an earlier process of
executor "local" (`DBOS.launch()`, dbos/_dbos.py) — then prints one JSON line
`{"event": "launched", ...}` and reads commands from stdin, one a line:

    start <kind> <n> <workflow id>     DBOS.start_workflow under that id; kind: dedupe or plain

answering each with `{"event": "started", "workflow_id": ...}`. On end of input it exits. What a
workflow did is read by the benchmark from DBOS's system database and from the target's counts.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main() -> None:
    began = time.time()
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True, help="DBOS's system database")
    parser.add_argument("--target", required=True, help="the crash target's base URL")
    parser.add_argument("--timeout", type=float, default=10.0, help="the call's timeout (s)")
    args = parser.parse_args()

    from dbos import DBOS, DBOSConfig, SetWorkflowID

    from taskpilots.httpclient import SharedClient

    client = SharedClient(trust_env=False)
    config: DBOSConfig = {
        "name": "taskpilots-bench-crash",
        "system_database_url": args.url,
        "log_level": "WARNING",
    }
    DBOS(config=config)

    @DBOS.step()
    def call(kind: str, n: int, key: str) -> dict:
        response = client().post(
            f"{args.target}/{kind}/dbos",
            json={"n": n},
            headers={"Idempotency-Key": key},
            timeout=args.timeout,
        )
        response.raise_for_status()
        return response.json()

    @DBOS.workflow()
    def crash(kind: str, n: int) -> dict:
        # The workflow id as the idempotency key: the same on every re-execution of the step.
        return call(kind, n, f"{DBOS.workflow_id}-call")

    DBOS.launch()
    _say({"event": "launched", "at": time.time(), "began": began})
    for line in sys.stdin:
        command = line.split()
        if len(command) == 4 and command[0] == "start":
            _, kind, n, workflow_id = command
            with SetWorkflowID(workflow_id):
                DBOS.start_workflow(crash, kind, int(n))
            _say({"event": "started", "workflow_id": workflow_id, "at": time.time()})
    DBOS.destroy()


def _say(line: dict) -> None:
    print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()

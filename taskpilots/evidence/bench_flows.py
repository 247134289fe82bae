"""The benchmark workflows: `bench.five`, 5 steps (2 compute, 1 read, 2 side effects) against
in-process no-op tools, so what is measured is TaskPilots' own cost per step; `bench.io`, two side
effects on a tool that only waits, so what is measured is how many waiting runs a worker holds."""

from __future__ import annotations

import os

from runs import tools, workflows
from runs.models import Risk
from runs.tools import Verification, http_tool, python_tool
from runs.workflows import Workflow, compute, read, side_effect


def _noop_read(params, ctx):
    return {"value": params["n"], "doc": params.get("doc", "")}


def _noop_write(params, ctx):
    return {"id": ctx.idempotency_key, "record": params.get("doc", "")}


tools.register(python_tool("bench.read", _noop_read), replace=True)
tools.register(
    python_tool(
        "bench.write",
        _noop_write,
        side_effect=True,
        risk=Risk.LOW,
        dedupes_by_key=True,
        target=lambda p: f"bench:{p['n']}",
    ),
    replace=True,
)


# bench engine's payloads (taskpilots/evidence/bench_payloads.py): the input's `doc`, 1–16 KB,
# comes back in the read's result and is carried by each write and its receipt. Without a `doc`
# (the tests' runs) the steps are the same with empty text.
def _five(name: str, write_tool: str) -> Workflow:
    """prepare, fetch, write_a, write_b, finish: the writes to `write_tool`."""
    return Workflow(
        name,
        1,
        [
            compute("prepare", lambda ctx: {"n": ctx.input["n"]}),
            read(
                "fetch",
                "bench.read",
                params=lambda ctx: {"n": ctx.input["n"], "doc": ctx.input.get("doc", "")},
            ),
            side_effect(
                "write_a",
                write_tool,
                params=lambda ctx: {"n": ctx.input["n"], "doc": ctx.results["fetch"]["doc"]},
            ),
            side_effect(
                "write_b",
                write_tool,
                params=lambda ctx: {"n": ctx.input["n"] + 1, "doc": ctx.results["fetch"]["doc"]},
            ),
            compute("finish", lambda ctx: {"ok": True}),
        ],
    )


FIVE = workflows.register(_five("bench.five", "bench.write"), replace=True)


# bench engine's slow path: the same five steps, but the writes go to a tool that can neither be
# asked by key nor dedupe, reconciled by a verification read (runs.tools.Verification): its
# baseline is read and kept in the snapshot before the call, which the one-statement hot path
# does not do, so every side effect takes the ordinary path of the model verbs.
_VERIFIED: dict[str, dict] = {}


def _verified_write(params, ctx):
    _VERIFIED[f"{params['n']}:{ctx.idempotency_key}"] = {"n": params["n"]}
    return {"id": ctx.idempotency_key, "record": params.get("doc", "")}


def _verified_read(params, ctx):
    return {"found": f"{params['n']}:{ctx.idempotency_key}" in _VERIFIED}


tools.register(
    python_tool(
        "bench.verified_write",
        _verified_write,
        side_effect=True,
        risk=Risk.LOW,
        target=lambda p: f"bench-verified:{p['n']}",
        verification=Verification(
            read=_verified_read,
            recognise=lambda params, observed, baseline: bool(observed and observed["found"]),
            baseline=_verified_read,
            description="the write is in the in-process store under its key",
        ),
    ),
    replace=True,
)

VERIFIED = workflows.register(_five("bench.verified", "bench.verified_write"), replace=True)


# --------------------------------------------------------------------------------------------
# bench io: two side effects on a tool that waits (taskpilots/evidence/waiting_tool.py), whose
# address the benchmark passes to its workers in TASKPILOTS_BENCH_IO_URL.


def _waiting_tool(path: str) -> str:
    return os.environ.get("TASKPILOTS_BENCH_IO_URL", "http://127.0.0.1:9") + path


tools.register(
    http_tool(
        "bench.wait",
        "POST",
        lambda: _waiting_tool("/call/taskpilots"),
        # It can say by key whether a call landed; it does not dedupe, so a second call with
        # the same key is counted as a duplicate effect where the calls land.
        lookup_url=lambda: _waiting_tool("/lookup/taskpilots"),
        side_effect=True,
        risk=Risk.LOW,
        target=lambda p: f"bench-io:{p['n']}:{p['call']}",
    ),
    replace=True,
)

IO = workflows.register(
    Workflow(
        "bench.io",
        1,
        [
            side_effect(
                "call_a", "bench.wait", params=lambda ctx: {"n": ctx.input["n"], "call": "a"}
            ),
            side_effect(
                "call_b", "bench.wait", params=lambda ctx: {"n": ctx.input["n"], "call": "b"}
            ),
        ],
    ),
    replace=True,
)


# bench snapshot: side effects one after another, so each is timed as the engine runs it (its
# snapshot and intent with the claim, the call, its receipt with the next claim).
CHAIN = 10

WRITES = workflows.register(
    Workflow(
        "bench.writes",
        1,
        [
            side_effect(
                f"write_{n}", "bench.write", params=lambda ctx, n=n: {"n": ctx.input["n"] + n}
            )
            for n in range(CHAIN)
        ],
    ),
    replace=True,
)

MAILS = workflows.register(
    Workflow(
        "bench.mails",
        1,
        [
            side_effect(
                f"mail_{n}",
                "mail.send",
                params=lambda ctx, n=n: {
                    "to": f"{ctx.input['to']}+{n}@example.com",
                    "subject": "s",
                    "body": "b",
                },
            )
            for n in range(CHAIN)
        ],
    ),
    replace=True,
)

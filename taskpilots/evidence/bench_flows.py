"""The benchmark workflow: 5 steps (2 compute, 1 read, 2 side effects) against in-process no-op
tools, so what is measured is TaskPilots' own cost per step."""

from __future__ import annotations

from runs import tools, workflows
from runs.models import Risk
from runs.tools import python_tool
from runs.workflows import Workflow, compute, read, side_effect


def _noop_read(params, ctx):
    return {"value": params["n"]}


def _noop_write(params, ctx):
    return {"id": ctx.idempotency_key}


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

FIVE = workflows.register(
    Workflow(
        "bench.five",
        1,
        [
            compute("prepare", lambda ctx: {"n": ctx.input["n"]}),
            read("fetch", "bench.read", params=lambda ctx: {"n": ctx.input["n"]}),
            side_effect("write_a", "bench.write", params=lambda ctx: {"n": ctx.input["n"]}),
            side_effect("write_b", "bench.write", params=lambda ctx: {"n": ctx.input["n"] + 1}),
            compute("finish", lambda ctx: {"ok": True}),
        ],
    ),
    replace=True,
)

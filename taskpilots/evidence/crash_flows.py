"""The workflows of `bench crash` (taskpilots/evidence/bench_crash.py): one side effect each, a
call to the crash target (taskpilots/evidence/crash_target.py), whose address the benchmark
passes to its workers in TASKPILOTS_CRASH_URL.

- `crash.dedupe` calls a system that honours the idempotency key and can be asked by key whether
  a call landed: the tool declares both (`dedupes_by_key`, a lookup), so an interrupted call is
  reconciled by lookup.
- `crash.plain` calls a system that does neither: every call is an effect and nobody can ask
  whether one landed. The tool declares nothing, so an interrupted call is an unknown outcome
  and goes to a person, never sent again blindly.
"""

from __future__ import annotations

import os

from runs import tools, workflows
from runs.models import Risk
from runs.tools import http_tool
from runs.workflows import Workflow, side_effect


def _target(path: str) -> str:
    return os.environ.get("TASKPILOTS_CRASH_URL", "http://127.0.0.1:9") + path


def _settle_seconds() -> float:
    # The target applies a call within L/2 of its arrival or drops it (its caller gone), so a
    # lookup that finds nothing after L (and a second) is proof that nothing landed.
    return float(os.environ.get("TASKPILOTS_CRASH_LATENCY_MS", "500")) / 1000 + 1


tools.register(
    http_tool(
        "crash.dedupe",
        "POST",
        lambda: _target("/dedupe/taskpilots"),
        lookup_url=lambda: _target("/dedupe/taskpilots/lookup"),
        side_effect=True,
        dedupes_by_key=True,
        settle_seconds=_settle_seconds(),
        risk=Risk.LOW,
        target=lambda p: f"crash-dedupe:{p['n']}",
        description="bench crash: a system that dedupes by key and answers lookups by key",
    ),
    replace=True,
)

tools.register(
    http_tool(
        "crash.plain",
        "POST",
        lambda: _target("/plain/taskpilots"),
        side_effect=True,
        risk=Risk.LOW,
        target=lambda p: f"crash-plain:{p['n']}",
        description="bench crash: every call is an effect; it cannot be asked whether one landed",
    ),
    replace=True,
)

for _kind in ("dedupe", "plain"):
    workflows.register(
        Workflow(
            f"crash.{_kind}",
            1,
            [side_effect("call", f"crash.{_kind}", params=lambda ctx: {"n": ctx.input["n"]})],
        ),
        replace=True,
    )

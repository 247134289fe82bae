"""Fault injection for drills and crash tests, kept off the engine's path.

`TASKPILOTS_CHAOS_CRASH_AFTER_CALL=mail.send,…` (set only on the worker processes a drill or a
test starts): after a successful call of one of those tools, the process dies before it can
record the receipt — "the side effect is done, the local record failed". Installed by the
evidence app when the variable is set; otherwise nothing here runs.
"""

from __future__ import annotations

import dataclasses
import logging
import os

from runs import tools as tool_registry

logger = logging.getLogger("taskpilots.evidence")
VARIABLE = "TASKPILOTS_CHAOS_CRASH_AFTER_CALL"


def crash_after_call(names: frozenset[str]) -> None:
    """Wrap `runs.tools.get` so the named tools exit the process right after their call."""
    original = tool_registry.get

    def get(name: str):
        tool = original(name)
        if tool.name not in names:
            return tool
        invoke = tool.invoke

        def invoke_then_die(params, ctx):
            result = invoke(params, ctx)
            logger.error("chaos: exiting after %s committed, before recording it", tool.name)
            os._exit(137)
            return result  # pragma: no cover

        return dataclasses.replace(tool, invoke=invoke_then_die)

    tool_registry.get = get


def install_from_environment() -> None:
    names = frozenset(n.strip() for n in os.environ.get(VARIABLE, "").split(",") if n.strip())
    if names:
        crash_after_call(names)

"""Agents under TaskPilots: the OpenAI Agents SDK runner (`runs.agents.sdk`) and MCP tools
(`runs.agents.mcp`). See docs/agents.md. Both need the `agents` extra (openai-agents and mcp):
`pip install 'taskpilots[agents]'`; without it they stop at import with `MissingExtra`. The
Pydantic AI runner (`runs.agents.pydantic_ai`) needs the `pydantic-ai` extra instead, LangGraph
graphs (`runs.agents.langgraph`) the `langgraph` extra.

What the two share lives here: for a TaskPilots tool an agent can call, the JSON schema the
model sees and whether a call needs a person's approval first. Both are kept beside the tool
registry (runs.tools), keyed by the TaskPilots tool name, so a resumed run finds them again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

AGENTS_EXTRA = "pip install 'taskpilots[agents]'"


class MissingExtra(ImportError):
    """A package of an optional extra (`agents`, `pydantic-ai`, `langgraph`) is not installed;
    the message says what to do."""

    def __init__(self, package: str, extra: str = "agents") -> None:
        super().__init__(
            f"{package} is not installed: TaskPilots' agent integration needs the {extra} extra "
            f"(pip install 'taskpilots[{extra}]')",
            name=package,
        )


# JSON-schema type → the flat type the engine's Tool.validate / the console's edit form check.
_FLAT_TYPES: dict[str, type] = {"string": str, "integer": int, "number": float, "boolean": bool}


@dataclass(frozen=True)
class AgentToolInfo:
    """What an agent needs to know about a TaskPilots tool besides its Tool metadata."""

    input_schema: dict = field(default_factory=dict)
    description: str = ""
    # True, False, or a function of the call's arguments (pure: it is evaluated again on resume).
    needs_approval: bool | Callable[[dict], bool] = False
    approval_reason: str = ""
    queue: str = "support"

    def approval_needed(self, arguments: dict) -> bool:
        if callable(self.needs_approval):
            return bool(self.needs_approval(arguments))
        return bool(self.needs_approval)


_INFO: dict[str, AgentToolInfo] = {}


def set_tool_info(tool_name: str, info: AgentToolInfo) -> AgentToolInfo:
    _INFO[tool_name] = info
    return info


def tool_info(tool_name: str) -> AgentToolInfo:
    return _INFO.get(tool_name) or AgentToolInfo()


def flat_schema(input_schema: Mapping[str, Any]) -> dict[str, type]:
    """The required scalar properties of a JSON schema as Tool.params_schema."""
    properties = input_schema.get("properties") or {}
    out = {}
    for name in input_schema.get("required") or ():
        kind = (properties.get(name) or {}).get("type")
        if isinstance(kind, str) and kind in _FLAT_TYPES:
            out[name] = _FLAT_TYPES[kind]
    return out


def run_sync(make_coroutine: Callable[[], Any]) -> Any:
    """Run async SDK code from the engine's sync code (Celery workers, tests).

    A fresh event loop per call: nothing async outlives a step. When this thread already runs a
    loop (someone drives the engine from async code), the coroutine gets its own thread.
    """
    import asyncio

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make_coroutine())
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1, thread_name_prefix="taskpilots-agent") as pool:
        return pool.submit(lambda: asyncio.run(make_coroutine())).result()


def json_schema_from_flat(params_schema: Mapping[str, type]) -> dict:
    names = {v: k for k, v in _FLAT_TYPES.items()}
    return {
        "type": "object",
        "properties": {
            name: {"type": names.get(kind, "string")} for name, kind in params_schema.items()
        },
        "required": list(params_schema),
        "additionalProperties": False,
    }

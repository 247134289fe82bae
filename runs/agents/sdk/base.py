"""What the other modules of the runner build on: AgentSetupError, the run's input as
conversation items and its final output as JSON (a structured `output_type`), and the SDK's
callbacks, sync or async, awaited."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

from agents import Agent, FunctionTool, Handoff, RunContextWrapper
from agents.agent_output import AgentOutputSchema, AgentOutputSchemaBase

from runs.models import to_json_value

MAX_MESSAGE_CHARS = 20_000


class AgentSetupError(ValueError):
    """The agent cannot run under TaskPilots as configured (the message says what to change)."""


def _validate_input(data: dict) -> dict:
    message = data.get("message")
    if not isinstance(message, str) or not message.strip():
        raise ValueError("'message' must be a non-empty string")
    if len(message) > MAX_MESSAGE_CHARS:
        raise ValueError(f"'message' is longer than {MAX_MESSAGE_CHARS} characters")
    return data


def _default_input(data: dict) -> list[dict]:
    return [{"role": "user", "content": data["message"]}]


def _output_schema(agent: Agent) -> AgentOutputSchemaBase | None:
    # As the SDK's get_output_schema (agents.run_internal.turn_preparation).
    if agent.output_type is None or agent.output_type is str:
        return None
    if isinstance(agent.output_type, AgentOutputSchemaBase):
        return agent.output_type
    return AgentOutputSchema(agent.output_type)


def _output_json(agent: Agent, value: Any) -> Any:
    """A final output as JSON: a pydantic model's model_dump, a dataclass's fields, ..."""
    schema = _output_schema(agent)
    kind = getattr(schema, "output_type", None)
    if schema is not None and kind is not None and not isinstance(value, str | dict | list):
        from pydantic import TypeAdapter

        try:
            return TypeAdapter(kind).dump_python(value, mode="json")
        except Exception:  # noqa: S110 - fall back to the generic conversion
            pass
    return _jsonable(value)


def _jsonable(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if isinstance(value, str | int | float | bool | type(None)):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _jsonable(dataclasses.asdict(value))
    try:
        return to_json_value(value)
    except (TypeError, ValueError):
        return str(value)


async def _resolved(function: Callable[..., Any], *args: Any) -> Any:
    """`function(*args)`, awaited if it answers an awaitable (SDK callbacks may be either)."""
    value = function(*args)
    return await value if inspect.isawaitable(value) else value


async def _enabled(item: FunctionTool | Handoff, wrapper: RunContextWrapper, agent: Agent) -> bool:
    flag = item.is_enabled
    if isinstance(flag, bool):
        return flag
    return bool(await _resolved(flag, wrapper, agent))

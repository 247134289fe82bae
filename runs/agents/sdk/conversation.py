"""The conversation, read back from recorded step results only, so that a run resumed in any
process sees what the model saw: the step labels of a turn's calls and handoffs, the function
calls a turn made, the items and their outputs in the SDK's order, the final text, and the SDK
RunItems a handoff's input_filter is given."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agents import Agent
from agents.items import (
    HandoffCallItem,
    HandoffOutputItem,
    InputItem,
    MessageOutputItem,
    ReasoningItem,
    ToolCallItem,
    ToolCallOutputItem,
)

from runs.models import StepKind, to_json_value
from runs.workflows import Context

START = "start"
# What the SDK tells the model about the handoffs of a turn after the first (execute_handoffs).
MULTIPLE_HANDOFFS = "Multiple handoffs detected, ignoring this one."


def _turn_count(ctx: Context) -> int:
    return sum(1 for h in ctx.history if h["name"].startswith("turn:"))


def function_calls(turn: Any) -> list[dict]:
    if not isinstance(turn, dict):
        return []
    items = turn.get("items") or ()
    return [i for i in items if isinstance(i, dict) and i.get("type") == "function_call"]


def _slug(text: str) -> str:
    return "".join(c for c in str(text) if c.isalnum() or c in "_-")[:64]


def call_label(turn: int, index: int, call: dict) -> str:
    return f"{turn}.{index}:{_slug(call.get('name', ''))}"


def handoff_label(turn: int, index: int, agent_name: str) -> str:
    return f"{turn}.{index}:{_slug(agent_name.replace(' ', '_'))}"


def _parse_arguments(raw: Any) -> tuple[dict, str]:
    try:
        value = json.loads(raw or "{}") if isinstance(raw, str) else raw
    except ValueError as exc:
        return {}, f"the arguments are not JSON: {exc}"
    if not isinstance(value, dict):
        return {}, "the arguments must be a JSON object"
    return value, ""


def _has_used_tools(ctx: Context, agent_name: str) -> bool:
    number = 1
    while f"turn:{number}" in ctx.results:
        recorded = ctx.results[f"turn:{number}"] or {}
        if recorded.get("agent", agent_name) == agent_name and function_calls(recorded):
            return True
        number += 1
    return False


def _tool_final_output(agent: Agent, ctx: Context, turn: int, calls, receivers) -> str:
    """The call step whose result ends the run (the agent's tool_use_behavior), or ""."""
    behavior = agent.tool_use_behavior
    if behavior == "run_llm_again":
        return ""
    done = {h["name"]: h for h in ctx.history}
    made = []
    for index, call in enumerate(calls):
        step = done.get(f"call:{call_label(turn, index, call)}") or {}
        # A refused call (unknown tool, bad arguments) is a compute step: no tool's result.
        made_call = call.get("name") not in receivers and step.get("status") == "succeeded"
        if made_call and step.get("kind") != StepKind.COMPUTE:
            made.append((step["name"], call.get("name")))
    if behavior == "stop_on_first_tool":
        return made[0][0] if made else ""
    stop_at = (behavior or {}).get("stop_at_tool_names") or ()
    return next((name for name, tool in made if tool in stop_at), "")


@dataclass(frozen=True)
class _Entry:
    """One item the model has seen, with what the SDK would know about it (for input_filter)."""

    item: dict
    agent: str
    kind: str  # message, reasoning, tool_call, handoff_call, tool_output, handoff_output, item
    target: str = ""  # handoff_output: the receiving agent


def _conversation(ctx: Context, upto: int | None = None) -> tuple[list[dict], list[_Entry]]:
    """The conversation's input and the items since, as the model of turn `upto` (default: the
    next turn) sees them, rebuilt from recorded step results only."""
    statuses = {h["name"]: h["status"] for h in ctx.history}
    history = list((ctx.results.get(START) or {}).get("input") or [])
    entries: list[_Entry] = []
    number = 1
    while f"turn:{number}" in ctx.results and (upto is None or number < upto):
        new, handed = _turn_entries(ctx, statuses, number, ctx.results[f"turn:{number}"])
        filtered = (handed or {}).get("history")
        if isinstance(filtered, dict):  # the handoff's input_filter chose what goes on
            history = list(filtered.get("input") or [])
            entries = [_entry_from_record(e) for e in filtered.get("items") or ()]
        else:
            entries.extend(new)
        number += 1
    return history, entries


def transcript(ctx: Context) -> list[dict]:
    """The conversation so far, rebuilt from recorded step results only."""
    history, entries = _conversation(ctx)
    return [*history, *(e.item for e in entries)]


def _item_kind(item: dict, receivers: Mapping[str, str]) -> str:
    kind = item.get("type")
    if kind == "function_call":
        return "handoff_call" if item.get("name") in receivers else "tool_call"
    return {"message": "message", "reasoning": "reasoning"}.get(kind, "item")


def _output_item(call: dict, output: str) -> dict:
    return {"type": "function_call_output", "call_id": call.get("call_id", ""), "output": output}


def _turn_entries(ctx, statuses, number: int, recorded: dict, pending: dict | None = None):
    """(the turn's items and the outputs it got, in the SDK's order: its tool calls', then the
    ignored handoffs', then the handoff's; the handoff's recorded result or None). `pending` is
    the result of the handoff being made now."""
    agent = recorded.get("agent") or ""
    receivers = recorded.get("handoffs") or {}
    entries = [_Entry(i, agent, _item_kind(i, receivers)) for i in recorded.get("items") or ()]
    calls = function_calls(recorded)
    for index, call in enumerate(calls):
        if call.get("name") in receivers:
            continue
        label = call_label(number, index, call)
        if f"call:{label}" not in statuses:
            return entries, None
        output = _output_item(call, _tool_output(ctx, statuses, label))
        entries.append(_Entry(output, agent, "tool_output"))
    handoffs = [(i, c) for i, c in enumerate(calls) if c.get("name") in receivers]
    if not handoffs:
        return entries, None
    for _, call in handoffs[1:]:
        entries.append(_Entry(_output_item(call, MULTIPLE_HANDOFFS), agent, "tool_output"))
    index, call = handoffs[0]
    handed = pending or ctx.results.get(
        f"handoff:{handoff_label(number, index, receivers[call['name']])}"
    )
    if not isinstance(handed, dict):
        return entries, None
    item = _output_item(call, str(handed.get("output", "")))
    entries.append(_Entry(item, agent, "handoff_output", handed.get("to", "")))
    return entries, handed


def _tool_output(ctx: Context, statuses: dict, label: str) -> str:
    name = f"call:{label}"
    if statuses[name] == "skipped":
        value: Any = {"error": "a person skipped this call; it was not made"}
    else:
        value = ctx.results.get(name)
    approval = ctx.results.get(f"approve:{label}")
    if isinstance(approval, dict) and approval.get("decision") not in (None, "not_required"):
        note = {"decision": approval["decision"], "by": approval.get("by", "")}
        if approval["decision"] == "approved_with_edits":
            note["arguments"] = approval.get("params")
        if approval.get("comment"):
            note["comment"] = approval["comment"]
        value = {"approval": note, "result": value}
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def final_text(turn: Any) -> str:
    text = []
    for item in (turn or {}).get("items") or ():
        if isinstance(item, dict) and item.get("type") == "message":
            for part in item.get("content") or ():
                if isinstance(part, dict) and part.get("type") == "output_text":
                    text.append(part.get("text") or "")
    return "".join(text)


def _run_item(entry: _Entry, agents: Mapping[str, Agent]):
    """The SDK RunItem of a recorded item, for a handoff's input_filter."""
    from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage
    from openai.types.responses.response_reasoning_item import ResponseReasoningItem
    from pydantic import ValidationError

    agent = agents.get(entry.agent) or next(iter(agents.values()))
    raw = dict(entry.item)
    try:
        if entry.kind == "message":
            return MessageOutputItem(
                agent=agent, raw_item=ResponseOutputMessage.model_validate(raw)
            )
        if entry.kind == "reasoning":
            return ReasoningItem(agent=agent, raw_item=ResponseReasoningItem.model_validate(raw))
        if entry.kind in ("tool_call", "handoff_call"):
            kind = HandoffCallItem if entry.kind == "handoff_call" else ToolCallItem
            return kind(agent=agent, raw_item=ResponseFunctionToolCall.model_validate(raw))
    except ValidationError:
        return InputItem(agent=agent, raw_item=raw)
    if entry.kind == "tool_output":
        return ToolCallOutputItem(agent=agent, raw_item=raw, output=raw.get("output"))
    if entry.kind == "handoff_output" and entry.target in agents:
        return HandoffOutputItem(
            agent=agent, raw_item=raw, source_agent=agent, target_agent=agents[entry.target]
        )
    return InputItem(agent=agent, raw_item=raw)


def _entry_from_record(recorded: Mapping[str, Any]) -> _Entry:
    return _Entry(
        dict(recorded.get("item") or {}),
        str(recorded.get("agent") or ""),
        str(recorded.get("kind") or "item"),
        str(recorded.get("target") or ""),
    )


def _entry_of(item: Any, default_agent: str) -> dict:
    """A RunItem an input_filter kept (or made), as a recorded entry."""
    kinds = [
        (HandoffCallItem, "handoff_call"),
        (HandoffOutputItem, "handoff_output"),
        (MessageOutputItem, "message"),
        (ReasoningItem, "reasoning"),
        (ToolCallItem, "tool_call"),
        (ToolCallOutputItem, "tool_output"),
    ]
    kind = next((k for cls, k in kinds if isinstance(item, cls)), "item")
    agent = getattr(getattr(item, "agent", None), "name", "") or default_agent
    target = ""
    if kind == "handoff_output":
        target = getattr(getattr(item, "target_agent", None), "name", "")
    raw = item.to_input_item() if hasattr(item, "to_input_item") else item
    return {"item": to_json_value(raw), "agent": agent, "kind": kind, "target": target}

"""The steps an agent framework's tool call becomes, shared by the Pydantic AI runner (runs.
agents.pydantic_ai) and LangGraph graphs (runs.agents.langgraph); it needs neither framework.

`approve:<...>` first when the tool's approval rule says so (the decision's parameters are what
the call then uses), then `call:<...>`: a `side_effect` or `read` step of the TaskPilots tool.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from runs import tools as tool_registry
from runs.agents import set_tool_info, tool_info
from runs.agents.policy import ToolPolicy
from runs.models import StepKind
from runs.workflows import Context, DynamicStep


def tool_call_step(
    ctx: Context,
    name: str,
    tool: str,
    target: str,
    arguments: dict,
    *,
    stage: str,
    who: str,
    refuse: Callable[[str, str], DynamicStep],
) -> DynamicStep:
    """The next step for the call `name` (`call:<...>`) of the framework's tool `tool`, which is
    the TaskPilots tool `target` ("" when there is none: refused). `who` asks ("The agent
    'x'"); `refuse(name, error)` is the framework's refusal step, the error told to the model."""
    if not target:
        return refuse(name, f"there is no tool named {tool!r}")
    info = tool_info(target)
    if info.approval_needed(arguments):
        approve = "approve:" + name.removeprefix("call:")
        if approve not in {h["name"] for h in ctx.history}:
            return DynamicStep(
                approve,
                StepKind.APPROVAL,
                tool=target,
                params=arguments,
                stage=stage,
                queue=info.queue,
                reason=info.approval_reason or f"{who} wants to call {tool}.",
            )
        decision = ctx.results.get(approve)
        if not isinstance(decision, dict) or "params" not in decision:
            return refuse(name, "a person skipped this call instead of approving it")
        arguments = decision["params"]
    return DynamicStep(
        name,
        StepKind.SIDE_EFFECT if tool_registry.get(target).side_effect else StepKind.READ,
        tool=target,
        params=arguments,
        stage=stage,
    )


def use_registered_tool(tool_name: str, policy: ToolPolicy, error: type[Exception]) -> str:
    """A framework tool mapped to the registered TaskPilots tool `policy.tool` (calls of it call
    that tool instead); the policy's approval rule, when it sets one, becomes that tool's."""
    try:
        tool_registry.get(policy.tool)
    except tool_registry.UnknownTool:
        raise error(
            f"tool {tool_name!r} maps to {policy.tool!r}, which is not registered"
        ) from None
    if policy.needs_approval is not None:
        info = dataclasses.replace(
            tool_info(policy.tool),
            needs_approval=policy.needs_approval,
            approval_reason=policy.approval_reason,
            queue=policy.queue,
        )
        set_tool_info(policy.tool, info)
    return policy.tool

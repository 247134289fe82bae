"""What one registration holds for each agent its handoffs reach (_AgentNode): the agent's
function tools bound to TaskPilots tools, its handoff edges, its SDK MCP servers; and what one
model turn is offered (_Offer)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agents import Agent, FunctionTool, Handoff, RunContextWrapper

from runs.agents import AgentToolInfo
from runs.agents.sdk.base import _resolved


@dataclass(frozen=True)
class _Binding:
    tool: str  # the TaskPilots tool name
    approval: AgentToolInfo
    # The SDK function's own callable `needs_approval(ctx, arguments, call_id)` when no policy
    # overrides it: asked with the run's context.
    sdk_approval: Callable[..., Any] | None = None


@dataclass(frozen=True)
class _HandoffEdge:
    handoff: Handoff
    target: str  # the receiving agent's name
    callback: bool  # a Handoff object: on_handoff / input_filter are the user's code


@dataclass
class _McpSource:
    """One `Agent(mcp_servers=[...])` server, as TaskPilots MCP tools (listed lazily)."""

    sdk: Any
    server: Any  # runs.agents.mcp.McpServer
    toolset: Mapping[str, Any]  # runs.agents.mcp.McpToolset

    def requires_approval(self, mcp_name: str) -> bool:
        policy = getattr(self.sdk, "_needs_approval_policy", False)
        if isinstance(policy, Mapping):
            return bool(policy.get(mcp_name, False))
        return bool(policy) and not callable(policy)

    async def allows(self, tool: Any, wrapper: RunContextWrapper, agent: Agent) -> bool:
        # The SDK server's tool_filter: static allow/block lists, or a function of the run.
        chosen = getattr(self.sdk, "tool_filter", None)
        if chosen is None:
            return True
        if isinstance(chosen, Mapping):
            allowed = chosen.get("allowed_tool_names")
            blocked = chosen.get("blocked_tool_names") or ()
            return (allowed is None or tool.mcp_name in allowed) and tool.mcp_name not in blocked
        from agents.mcp.util import ToolFilterContext
        from mcp import types

        listed = types.Tool.model_validate(
            {
                "name": tool.mcp_name,
                "description": tool.description,
                "inputSchema": tool.input_schema or {"type": "object"},
                "annotations": tool.annotations or None,
            }
        )
        try:
            context = ToolFilterContext(run_context=wrapper, agent=agent, server_name=self.sdk.name)
            return bool(await _resolved(chosen, context, listed))
        except Exception:  # the SDK leaves a tool out when its filter fails
            return False


@dataclass
class _AgentNode:
    agent: Agent
    bindings: dict[str, _Binding]
    handoffs: list[_HandoffEdge] = field(default_factory=list)
    mcp: list[_McpSource] = field(default_factory=list)

    def edge(self, tool_name: str) -> _HandoffEdge | None:
        return next((e for e in self.handoffs if e.handoff.tool_name == tool_name), None)


@dataclass(frozen=True)
class _Offer:
    """What one model turn is given: tools and handoffs, and what their names stand for."""

    tools: list[FunctionTool]
    targets: dict[str, str]  # tool name → TaskPilots tool
    handoffs: list[Handoff]
    receivers: dict[str, str]  # handoff tool name → receiving agent

"""register_agent: the agent and every agent its handoffs reach, checked for what TaskPilots
cannot run as the SDK would, their function tools bound to TaskPilots tools and their MCP
servers' tools registered, all as one workflow (kept by name and version for the step
handlers)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from agents import Agent, FunctionTool, Handoff, handoff
from agents.agent_output import AgentOutputSchema, AgentOutputSchemaBase

from runs import tools as tool_registry
from runs import workflows
from runs.agents import tool_info
from runs.agents.sdk.base import AgentSetupError
from runs.agents.sdk.conversation import _slug
from runs.agents.sdk.graph import _AgentNode, _Binding, _HandoffEdge, _McpSource
from runs.agents.sdk.mcp_servers import (
    _NO_ERROR_FORMATTER,
    _check_server_names,
    _mcp_config_for,
    _mcp_source,
)
from runs.agents.sdk.runner import AgentWorkflow
from runs.agents.sdk.tools import ToolPolicy, register_function_tool

_AGENTS: dict[tuple[str, int], AgentWorkflow] = {}


def register_agent(
    name: str,
    agent: Agent,
    *,
    version: int = 1,
    tools: Mapping[str, ToolPolicy | str] | None = None,
    mcp_tools: Mapping[str, Mapping[str, Any]] | None = None,
    context: Callable[[dict], Any] | None = None,
    max_turns: int = 12,
    stage: str = "agent",
    build_input: Callable[[dict], list[dict]] | None = None,
    validate_input: Callable[[dict], dict] | None = None,
) -> AgentWorkflow:
    """Register `agent`, and every agent it can hand off to, as the workflow `name` (see
    runs.agents.sdk).

    `tools` maps function-tool names (of any of the agents) to a ToolPolicy, or to the name of
    a registered TaskPilots tool to call instead. `mcp_tools` maps the name of an SDK MCP server
    (`Agent(mcp_servers=[...])`) to {its tool name: McpToolConfig} (risk, target, lookup,
    verification, approval). `context(run_input)` builds the SDK run context object that tools
    (`ctx.context`), dynamic instructions, `is_enabled`, handoffs and guardrails get; it is
    called again wherever one is needed, so it must be pure. `build_input(run_input)` makes the
    conversation's input items (default: the input's `message` as a user message);
    `validate_input` checks the untrusted run input at start (raise ValueError).
    """
    graph = _agent_graph(agent)
    policies = {
        k: ToolPolicy(tool=v) if isinstance(v, str) else v for k, v in (tools or {}).items()
    }
    mcp_config = dict(mcp_tools or {})
    nodes: dict[str, _AgentNode] = {}
    registered: dict[int, str] = {}  # id(function tool) → its TaskPilots tool
    sources: dict[int, _McpSource] = {}  # id(SDK MCP server) → its tools
    for member in graph:
        _check_agent(member)
        bindings = _bind_tools(name, member, policies, registered, context)
        edges = [_edge(item) for item in member.handoffs]
        mcp = []
        for sdk_server in member.mcp_servers:
            if id(sdk_server) not in sources:
                config = _mcp_config_for(sdk_server, mcp_config)
                sources[id(sdk_server)] = _mcp_source(sdk_server, member, config)
            mcp.append(sources[id(sdk_server)])
        nodes[member.name] = _AgentNode(member, bindings, edges, mcp)
    named = {function.name for node in nodes.values() for function in node.agent.tools}
    unknown = sorted(set(policies) - named)
    if unknown:
        raise AgentSetupError(f"no tools named {unknown} on agent {agent.name!r} or its handoffs")
    if mcp_config:
        raise AgentSetupError(
            f"mcp_tools names {sorted(mcp_config)}, which are not MCP servers of these agents "
            f"({sorted(s.sdk.name for s in sources.values())})"
        )
    _check_server_names(sources.values())
    runner = AgentWorkflow(
        name,
        version,
        agent,
        nodes[agent.name].bindings,
        max_turns=max_turns,
        stage=stage,
        build_input=build_input,
        validate_input=validate_input,
        agents=nodes,
        context=context,
    )
    workflows.register(runner.workflow, replace=True)
    _AGENTS[(name, version)] = runner
    return runner


def _agent_graph(first: Agent) -> list[Agent]:
    """The agent and every agent its handoffs reach, breadth first (cycles allowed)."""
    order: list[Agent] = []
    seen: dict[str, Agent] = {}
    queue = [first]
    while queue:
        agent = queue.pop(0)
        if not isinstance(agent, Agent):
            raise AgentSetupError(
                f"{agent!r} is not an openai-agents Agent; only Agents run under TaskPilots"
            )
        if agent.name in seen:
            if seen[agent.name] is not agent:
                raise AgentSetupError(
                    f"two different agents are named {agent.name!r}: a run records which agent "
                    "is current by name, so the names must be unique among the handoffs"
                )
            continue
        seen[agent.name] = agent
        order.append(agent)
        queue.extend(_receiver(item, agent) for item in agent.handoffs)
    return order


def _receiver(item: Any, owner: Agent) -> Agent:
    if isinstance(item, Agent):
        return item
    target = item._agent_ref() if isinstance(item, Handoff) and item._agent_ref else None
    if target is None:
        raise AgentSetupError(
            f"handoff {getattr(item, 'tool_name', item)!r} of agent {owner.name!r} does not say "
            "which agent it hands off to: build it with handoff(agent, ...) (or list the Agent "
            "itself), so that TaskPilots can register the receiving agent's tools up front"
        )
    return target


def _edge(item: Agent | Handoff) -> _HandoffEdge:
    if isinstance(item, Agent):
        return _HandoffEdge(handoff(item), item.name, callback=False)
    return _HandoffEdge(item, item._agent_ref().name, callback=True)


def _check_agent(agent: Agent) -> None:
    """Refuse what TaskPilots cannot run as the SDK would, with the reason and what to do."""
    where = f"agent {agent.name!r}"
    if agent.hooks is not None:
        raise AgentSetupError(
            f"{where}: AgentHooks are not run under TaskPilots; every turn, tool call and "
            "handoff is a step in the run's timeline (read it there, or through the API)"
        )
    if callable(agent.tool_use_behavior):
        raise AgentSetupError(
            f"{where}: a tool_use_behavior function is not supported under TaskPilots; use "
            "'run_llm_again', 'stop_on_first_tool' or StopAtTools(stop_at_tool_names=[...])"
        )
    if agent.output_type not in (None, str) and not isinstance(
        agent.output_type, AgentOutputSchemaBase
    ):
        try:
            AgentOutputSchema(agent.output_type)
        except Exception as exc:
            raise AgentSetupError(f"{where}: output_type {agent.output_type!r}: {exc}") from None
    failure = agent.mcp_config.get("failure_error_function")
    if callable(failure):
        raise AgentSetupError(f"{where}: mcp_config failure_error_function {_NO_ERROR_FORMATTER}")
    for function in agent.tools:
        if not isinstance(function, FunctionTool):
            raise AgentSetupError(
                f"tool {getattr(function, 'name', function)!r} of {where} is not a function "
                "tool; only function tools can run under TaskPilots (hosted tools such as web "
                "search run at the model provider, out of the engine's sight: give the agent "
                "a function tool or an MCP server that does the same)"
            )
        if function.tool_input_guardrails or function.tool_output_guardrails:
            raise AgentSetupError(
                f"tool {function.name!r} of {where}: tool guardrails are not run under "
                "TaskPilots yet; check the arguments in the tool, or ask a person "
                "(ToolPolicy(needs_approval=...))"
            )
        inner = getattr(function, "_agent_instance", None)
        acting = inner is not None and (inner.tools or inner.mcp_servers or inner.handoffs)
        if getattr(function, "_is_agent_tool", False) and acting:
            raise AgentSetupError(
                f"tool {function.name!r} of {where} is agent {inner.name!r} as a tool: it "
                "would run that agent's own tool calls inside one call, unprotected; make "
                "it a handoff, or register it as its own workflow"
            )


def _bind_tools(workflow, agent: Agent, policies, registered, context) -> dict[str, _Binding]:
    bindings: dict[str, _Binding] = {}
    for function in agent.tools:
        policy = policies.get(function.name)
        target = (policy.tool if policy else "") or getattr(
            function.on_invoke_tool, "taskpilots_tool", ""
        )
        sdk_approval = None
        if target:
            try:
                tool_registry.get(target)
            except tool_registry.UnknownTool:
                raise AgentSetupError(
                    f"tool {function.name!r} maps to {target!r}, which is not registered"
                ) from None
            info = tool_info(target)
            if policy is not None and policy.needs_approval is not None:
                info = dataclasses.replace(
                    info,
                    needs_approval=policy.needs_approval,
                    approval_reason=policy.approval_reason or info.approval_reason,
                    queue=policy.queue,
                )
        else:
            target = registered.get(id(function)) or register_function_tool(
                function,
                _python_tool_name(workflow, agent, function, registered),
                policy or ToolPolicy(),
                agent=agent,
                context=context,
            )
            registered[id(function)] = target
            info = tool_info(target)
            if policy is not None and policy.needs_approval is not None:
                info = dataclasses.replace(info, needs_approval=policy.needs_approval)
            elif callable(function.needs_approval):
                sdk_approval = function.needs_approval
        bindings[function.name] = _Binding(target, info, sdk_approval)
    return bindings


def _python_tool_name(workflow: str, agent: Agent, function: FunctionTool, registered) -> str:
    # <workflow>.<tool>; another agent's different tool of the same name gets its agent's name.
    name = f"{workflow}.{function.name}"
    if name in registered.values():
        name = f"{workflow}.{_slug(agent.name.replace(' ', '_'))}.{function.name}"
    return name

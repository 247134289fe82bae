"""register_pydantic_agent: a Pydantic AI `Agent`, unchanged, as a TaskPilots workflow; its
function tools registered as TaskPilots python tools, its MCP servers' tools as TaskPilots MCP
tools (runs.agents.pydantic_ai.mcp_servers); the steps' handlers, by name."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from pydantic_ai import FunctionToolset
from pydantic_ai.agent import AbstractAgent

from runs import tools as tool_registry
from runs import workflows
from runs.agents import AgentToolInfo, flat_schema, set_tool_info
from runs.agents.policy import ToolPolicy
from runs.agents.pydantic_ai.journal import CURRENT_CALL
from runs.agents.pydantic_ai.mcp_servers import McpSource, swap_mcp_servers
from runs.agents.pydantic_ai.workflow import (
    FAILED_HANDLER,
    FINISH_HANDLER,
    MODEL_HANDLER,
    REFUSAL_HANDLER,
    AgentSetupError,
    PydanticAgentWorkflow,
    RunInputCallContext,
)
from runs.agents.steps import use_registered_tool
from runs.models import FailureClass
from runs.tools import CallContext, ToolError
from runs.workflows import Context

_AGENTS: dict[tuple[str, int], PydanticAgentWorkflow] = {}
_NO_DEPS = (object, type(None))


def register_pydantic_agent(
    name: str,
    agent: AbstractAgent,
    *,
    version: int = 1,
    tools: Mapping[str, ToolPolicy | str] | None = None,
    mcp_tools: Mapping[str, Mapping[str, Any]] | None = None,
    deps: Callable[[dict], Any] | None = None,
    prompt: Callable[[dict], str] | None = None,
    validate_input: Callable[[dict], dict] | None = None,
    stage: str = "agent",
) -> PydanticAgentWorkflow:
    """Register the Pydantic AI `agent` as the workflow `name` (see runs.agents.pydantic_ai).

    `tools` maps the agent's tool names to a ToolPolicy (TaskPilots metadata: side effect or
    read, risk, lookup by key, approval rule, ...), or to a registered TaskPilots tool to call
    instead; a tool not named is a medium-risk side effect (the cautious guess). `mcp_tools`
    maps the `id` of an MCP server of the agent (`toolsets=[MCPToolset(..., id=...)]`) to {its
    tool name, as the server names it: McpToolConfig} (side effect or read, risk, target, lookup
    by key, verification, approval rule); without one, the tool's MCP annotations decide.
    `deps(run_input)` builds the agent's dependencies (`deps_type`); it is called again on
    every step, so it must be pure. `prompt(run_input)` is the user prompt (default: the
    input's `message`); `validate_input` checks the untrusted run input at start.
    """
    if not isinstance(agent, AbstractAgent):
        raise AgentSetupError(f"{agent!r} is not a Pydantic AI agent")
    deps_type = getattr(agent, "deps_type", object)
    if deps is None and deps_type not in _NO_DEPS:
        raise AgentSetupError(
            f"the agent takes dependencies ({getattr(deps_type, '__name__', deps_type)}): "
            "pass deps=<a function of the run input that builds them>"
        )
    functions, toolsets = _toolsets(agent, mcp_tools)
    policies = {
        k: ToolPolicy(tool=v) if isinstance(v, str) else v for k, v in (tools or {}).items()
    }
    unknown = sorted(set(policies) - set(functions))
    if unknown:
        raise AgentSetupError(f"the agent has no tools named {unknown}")
    runner = PydanticAgentWorkflow(
        name,
        version,
        agent,
        {},
        deps=deps,
        prompt=prompt,
        validate_input=validate_input,
        stage=stage,
        toolsets=toolsets,
    )
    runner.functions.update(functions)
    for tool_name, function in functions.items():
        runner.tools[tool_name] = _bind(runner, tool_name, function, policies.get(tool_name))
    workflows.register(runner.workflow, replace=True)
    _AGENTS[(name, version)] = runner
    return runner


def _toolsets(
    agent: AbstractAgent, mcp_tools: Mapping[str, Mapping[str, Any]] | None
) -> tuple[dict[str, Any], list | None]:
    """The agent's function tools by name (@agent.tool, @agent.tool_plain, tools=[...], and
    FunctionToolsets), and its other toolsets with each MCP server swapped for its TaskPilots
    tools (None when it has none); any other toolset is refused, saying why."""
    found: dict[str, Any] = {}
    others: list = []
    config = {k: dict(v) for k, v in (mcp_tools or {}).items()}
    sources: dict[str, McpSource] = {}
    for position, toolset in enumerate(agent.toolsets):
        if isinstance(toolset, FunctionToolset):
            found.update(toolset.tools)
            if position:  # the first is the agent's own, which Pydantic AI always adds
                others.append(toolset)
            continue
        others.append(swap_mcp_servers(toolset, config, sources))
    if config:
        raise AgentSetupError(
            f"mcp_tools names {sorted(config)}, which are not MCP servers of the agent "
            f"(their ids: {sorted(sources)})"
        )
    return found, (others if sources else None)


def _bind(runner: PydanticAgentWorkflow, tool_name: str, function: Any, policy) -> str:
    if policy is not None and policy.tool:
        return use_registered_tool(tool_name, policy, AgentSetupError)
    policy = policy or ToolPolicy()
    target = f"{runner.name}.{tool_name}"
    schema = function.function_schema.json_schema
    tool = policy.python_tool(
        target,
        runner.invoker(tool_name),
        timeout=function.timeout,
        params_schema=flat_schema(schema),
        description=function.description or "",
    )
    tool_registry.register(_with_run_input(tool), replace=True)
    approval = policy.needs_approval
    if approval is None:  # Pydantic AI's own `requires_approval=True` is a rule too
        approval = bool(function.requires_approval)
    set_tool_info(
        target,
        AgentToolInfo(
            input_schema=schema,
            description=function.description or "",
            needs_approval=approval,
            approval_reason=policy.approval_reason,
            queue=policy.queue,
        ),
    )
    return target


def _with_run_input(tool: tool_registry.Tool) -> tool_registry.Tool:
    """The tool, its calls given the run's input, read here in the engine's thread (the
    function itself may run in a helper thread)."""
    invoke = tool.invoke

    def with_input(params: dict, ctx: CallContext):
        from runs.models import Run

        run_input = Run.objects.filter(pk=ctx.run_id).values_list("input", flat=True).first()
        if run_input is None:
            raise ToolError(FailureClass.INVALID_INPUT, f"no run {ctx.run_id!r} for this call")
        fields = {f.name: getattr(ctx, f.name) for f in dataclasses.fields(CallContext)}
        return invoke(params, RunInputCallContext(**fields, run_input=run_input))

    return dataclasses.replace(tool, invoke=with_input)


def call_context() -> CallContext:
    """The TaskPilots CallContext (idempotency key, run, step, attempt) of the tool call being
    made: call it inside an agent's tool function, e.g. to send the idempotency key along."""
    call = CURRENT_CALL.get()
    if call is None:
        raise LookupError("this tool call does not run under TaskPilots (no CallContext)")
    return call


def _runner(ctx: Context) -> PydanticAgentWorkflow:
    try:
        return _AGENTS[(ctx.workflow, ctx.version)]
    except KeyError:
        raise AgentSetupError(f"{ctx.workflow} v{ctx.version} is not a registered agent") from None


def _model_request(ctx: Context) -> dict:
    return _runner(ctx).request_model(ctx, ctx.spec["step"])


def _finish(ctx: Context) -> dict:
    return _runner(ctx).finish(ctx)


def _refuse_call(ctx: Context) -> dict:
    return {"error": ctx.spec.get("error", "the call was refused")}


def _failed(ctx: Context) -> dict:
    raise ToolError(FailureClass.INVALID_INPUT, ctx.spec.get("error", "the agent failed"))


workflows.register_handler(MODEL_HANDLER, _model_request, waits=True)
workflows.register_handler(FINISH_HANDLER, _finish)
workflows.register_handler(REFUSAL_HANDLER, _refuse_call)
workflows.register_handler(FAILED_HANDLER, _failed)

"""The agents' function tools as TaskPilots tools: ToolPolicy (a tool's TaskPilots metadata,
runs.agents.policy), register_function_tool (an SDK FunctionTool as a python tool that calls it
with a ToolContext, given the run's context object), and the call's context (AgentCallContext,
call_context_of)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agents import Agent, FunctionTool, RunContextWrapper
from agents.exceptions import ModelBehaviorError
from agents.tool_context import ToolContext

from runs import tools as tool_registry
from runs.agents import AgentToolInfo, flat_schema, run_sync
from runs.agents import set_tool_info as _set_tool_info
from runs.agents.policy import ToolPolicy
from runs.agents.sdk.base import _jsonable, _resolved
from runs.models import FailureClass
from runs.tools import CallContext, ToolError


@dataclass(frozen=True)
class AgentCallContext(CallContext):
    """The CallContext of a function tool's call, with the run's context object (the one
    `register_agent(context=...)` builds from the run input)."""

    run_context: Any = None


def call_context_of(ctx: RunContextWrapper) -> CallContext:
    """The TaskPilots CallContext (idempotency key, run, step, attempt) of a function tool's
    call, from the `RunContextWrapper` (a ToolContext) the tool got."""
    call = getattr(ctx, "taskpilots", None)
    if isinstance(call, CallContext):
        return call
    if isinstance(ctx.context, CallContext):
        return ctx.context
    raise LookupError("this tool call does not run under TaskPilots (no CallContext)")


def _sdk_invoker(function: FunctionTool, agent: Agent | None = None):
    # Without the SDK's failure formatter the function's own exception reaches python_tool,
    # which classifies it (a failing side effect is an unknown outcome, never a silent string).
    try:
        raising = dataclasses.replace(
            function, _failure_error_function=None, _use_default_failure_error_function=False
        )
    except (TypeError, ValueError):  # pragma: no cover - an SDK without these fields
        raising = function

    def call(params: dict, ctx: CallContext) -> Any:
        arguments = json.dumps(params, ensure_ascii=False)
        tool_context = ToolContext(
            context=ctx.run_context if isinstance(ctx, AgentCallContext) else ctx,
            tool_name=function.name,
            tool_call_id=ctx.idempotency_key or f"{ctx.run_id}:{ctx.step}",
            tool_arguments=arguments,
            agent=agent,
        )
        tool_context.taskpilots = ctx  # type: ignore[attr-defined]  (call_context_of)
        try:
            value = run_sync(lambda: raising.on_invoke_tool(tool_context, arguments))
        except ModelBehaviorError as exc:
            raise ToolError(FailureClass.INVALID_INPUT, str(exc)) from None
        return _jsonable(value)

    return call


def _with_run_context(tool: tool_registry.Tool, context: Callable[[dict], Any]):
    """The tool, its calls given the run's context object (built from the run's input)."""
    invoke = tool.invoke

    def with_context(params: dict, ctx: CallContext):
        from runs.models import Run

        # Read here, in the caller's thread (the function itself may run in a helper thread).
        run_input = Run.objects.filter(pk=ctx.run_id).values_list("input", flat=True).first()
        if run_input is None:
            raise ToolError(FailureClass.INVALID_INPUT, f"no run {ctx.run_id!r} for this call")
        try:
            run_context = context(run_input)
        except Exception as exc:  # nothing was sent: the input does not make a context
            raise ToolError(
                FailureClass.INVALID_INPUT,
                f"building the run context failed: {type(exc).__name__}: {exc}",
            ) from exc
        fields = {f.name: getattr(ctx, f.name) for f in dataclasses.fields(CallContext)}
        return invoke(params, AgentCallContext(**fields, run_context=run_context))

    return dataclasses.replace(tool, invoke=with_context)


def _sdk_approval(function: FunctionTool) -> bool | Callable[[dict], bool]:
    policy = function.needs_approval
    if not callable(policy):
        return bool(policy)

    def needs(arguments: dict) -> bool:
        return bool(run_sync(lambda: _resolved(policy, RunContextWrapper(None), arguments, "")))

    return needs


def register_function_tool(
    function: FunctionTool,
    tool_name: str,
    policy: ToolPolicy | None = None,
    *,
    agent: Agent | None = None,
    context: Callable[[dict], Any] | None = None,
) -> str:
    """Register an SDK function tool as the TaskPilots python tool `tool_name`."""
    policy = policy or ToolPolicy()
    tool = policy.python_tool(
        tool_name,
        _sdk_invoker(function, agent),
        timeout=function.timeout_seconds,
        params_schema=flat_schema(function.params_json_schema),
        description=function.description or "",
    )
    tool_registry.register(
        _with_run_context(tool, context) if context is not None else tool, replace=True
    )
    _set_tool_info(
        tool_name,
        AgentToolInfo(
            input_schema=function.params_json_schema,
            description=function.description or "",
            needs_approval=_sdk_approval(function),
            approval_reason=policy.approval_reason,
            queue=policy.queue,
        ),
    )
    return tool_name

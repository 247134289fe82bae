"""Run an OpenAI Agents SDK `Agent` as a TaskPilots run.

    agent = Agent(name="support", instructions="...", model=my_model,
                  tools=[check_policy, *mcp_function_tools])
    register_agent("support.agent", agent, tools={"check_policy": ToolPolicy(side_effect=False)})
    engine.start_run("support.agent", {"message": "Please refund order 42"})

The SDK's own `Runner.run` keeps its loop in memory, so a crash would call the model again and
repeat tool calls. Here the loop is the workflow's `next` function, and every decision is a
recorded step (runs.workflows.DynamicStep):

1. `start` records the conversation's input.
2. `turn:<k>` is a dynamic compute step: its handler rebuilds the conversation from recorded
   step results, calls the SDK model once (`Model.get_response`) and records the output items.
   A resumed run reads them back and never asks the model again for a recorded turn.
3. For each tool call of that turn, in order: an `approve:<k>.<i>:<tool>` approval step when the
   tool needs one (a normal ApprovalRequest in the console; the decision, with any edited
   arguments, is what the call then uses and what the model is told), then `call:<k>.<i>:<tool>`,
   a `side_effect` or `read` step according to the TaskPilots tool's metadata — snapshot,
   idempotency key, reconciliation and failure routing as for any other step.
4. The next turn sees the tool outputs; a turn without tool calls ends the run with `finish`.

SDK function tools map onto TaskPilots tools: a plain `@function_tool` is registered as a
python tool named `<workflow>.<tool>` with the metadata of its `ToolPolicy` (by default a
medium-risk side effect: the cautious guess); a tool made by `function_tool_for` (e.g. an MCP
tool, runs.agents.mcp) calls the TaskPilots tool it names. A function tool can read the call's
`CallContext` (idempotency key, run, step) as `ctx.context` of its `RunContextWrapper`.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from runs import tools as tool_registry
from runs import workflows
from runs.agents import (
    AgentToolInfo,
    MissingExtra,
    flat_schema,
    json_schema_from_flat,
    run_sync,
    tool_info,
)
from runs.agents import set_tool_info as _set_tool_info
from runs.models import FailureClass, Risk, StepKind, to_json_value
from runs.tools import CallContext, LookupResult, ToolError, python_tool
from runs.workflows import END, Context, DynamicStep, Workflow, compute

try:
    from agents import Agent, FunctionTool, RunContextWrapper
    from agents.exceptions import ModelBehaviorError
    from agents.models.interface import Model, ModelTracing
    from agents.tool_context import ToolContext
except ModuleNotFoundError as exc:  # the optional `agents` extra
    raise MissingExtra("openai-agents") from exc

START = "start"
FINISH = "finish"
TURN_HANDLER = "agents.sdk.model_turn"
FINISH_HANDLER = "agents.sdk.finish"
REFUSAL_HANDLER = "agents.sdk.refuse_call"
MAX_MESSAGE_CHARS = 20_000


class AgentSetupError(ValueError):
    """The agent cannot run under TaskPilots as configured (the message says what to change)."""


@dataclass(frozen=True)
class ToolPolicy:
    """TaskPilots metadata for one of the agent's function tools.

    `tool` names a registered TaskPilots tool to call instead of the SDK function (its own
    metadata then applies; `needs_approval` may still be set per agent). Otherwise the SDK
    function becomes a python tool with these fields.
    """

    tool: str = ""
    side_effect: bool = True
    risk: str = Risk.MEDIUM
    # None: the TaskPilots tool's setting, or the SDK tool's own `needs_approval`.
    needs_approval: bool | Callable[[dict], bool] | None = None
    approval_reason: str = ""
    queue: str = "support"
    dedupes_by_key: bool = False
    lookup: Callable[[str, CallContext], LookupResult] | None = None
    target: Callable[[dict], str] | None = None
    scope: str = ""
    timeout: float | None = None
    compensating_tool: str = ""
    compensation_params: Callable[[dict, dict], dict] | None = None


@dataclass(frozen=True)
class _Binding:
    tool: str  # the TaskPilots tool name
    approval: AgentToolInfo


@dataclass
class AgentWorkflow:
    """An SDK agent registered as a TaskPilots workflow (see the module docstring)."""

    name: str
    version: int
    agent: Agent
    bindings: dict[str, _Binding]
    max_turns: int = 12
    stage: str = "agent"
    build_input: Callable[[dict], list[dict]] | None = None
    validate_input: Callable[[dict], dict] | None = None
    workflow: Workflow = field(init=False)

    def __post_init__(self) -> None:
        self.workflow = Workflow(
            self.name,
            self.version,
            [compute(START, self._start, stage=self.stage)],
            next=self._next,
            description=f"OpenAI Agents SDK agent {self.agent.name!r}",
            validate_input=self.validate_input
            or (_validate_input if self.build_input is None else None),
        )

    # -- the durable loop ----------------------------------------------------------------

    def _start(self, ctx: Context) -> dict:
        items = (self.build_input or _default_input)(ctx.input)
        return {"input": items}

    def _next(self, ctx: Context, last: str) -> DynamicStep | None:
        if last == FINISH:
            return END
        statuses = {h["name"]: h["status"] for h in ctx.history}
        turns = _turn_count(ctx)
        if turns == 0:
            return self._turn(1)
        calls = function_calls(ctx.results.get(f"turn:{turns}"))
        if not calls:
            return DynamicStep(
                FINISH, StepKind.COMPUTE, stage=self.stage, extra={"handler": FINISH_HANDLER}
            )
        for index, call in enumerate(calls):
            step = self._call_step(ctx, statuses, turns, index, call)
            if step is not None:
                return step
        if turns >= self.max_turns:
            raise AgentSetupError(
                f"the agent used its {self.max_turns} model turns without a final answer"
            )
        return self._turn(turns + 1)

    def _turn(self, number: int) -> DynamicStep:
        return DynamicStep(
            f"turn:{number}", StepKind.COMPUTE, stage=self.stage, extra={"handler": TURN_HANDLER}
        )

    def _call_step(self, ctx, statuses, turn, index, call) -> DynamicStep | None:
        label = call_label(turn, index, call)
        name = f"call:{label}"
        if name in statuses:
            return None
        binding = self.bindings.get(call["name"])
        arguments, problem = _parse_arguments(call.get("arguments"))
        if binding is None:
            problem = f"there is no tool named {call['name']!r}"
        if problem:
            return self._refusal(name, problem)
        if binding.approval.approval_needed(arguments):
            approve = f"approve:{label}"
            if approve not in statuses:
                return DynamicStep(
                    approve,
                    StepKind.APPROVAL,
                    tool=binding.tool,
                    params=arguments,
                    stage=self.stage,
                    queue=binding.approval.queue,
                    reason=binding.approval.approval_reason
                    or f"The agent {self.agent.name!r} wants to call {call['name']}.",
                    extra={"call_id": call.get("call_id", "")},
                )
            decision = ctx.results.get(approve)
            if not isinstance(decision, dict) or "params" not in decision:
                return self._refusal(name, "a person skipped this call instead of approving it")
            arguments = decision["params"]
        tool = tool_registry.get(binding.tool)
        return DynamicStep(
            name,
            StepKind.SIDE_EFFECT if tool.side_effect else StepKind.READ,
            tool=binding.tool,
            params=arguments,
            stage=self.stage,
            extra={"call_id": call.get("call_id", "")},
        )

    def _refusal(self, name: str, problem: str) -> DynamicStep:
        # Told to the model as the call's output, as the SDK does for a failing tool.
        return DynamicStep(
            name,
            StepKind.COMPUTE,
            stage=self.stage,
            extra={"handler": REFUSAL_HANDLER, "error": problem},
        )

    # -- the model ------------------------------------------------------------------------

    def model(self) -> Model:
        if isinstance(self.agent.model, Model):
            return self.agent.model
        from agents.models.multi_provider import MultiProvider

        return MultiProvider().get_model(self.agent.model)

    def function_tools(self) -> list[FunctionTool]:
        return [t for t in self.agent.tools if isinstance(t, FunctionTool)]

    def ask_model(self, items: list[dict]):
        async def ask():
            system = await self.agent.get_system_prompt(RunContextWrapper(context=None))
            return await self.model().get_response(
                system,
                items,
                self.agent.model_settings,
                self.function_tools(),
                None,
                [],
                ModelTracing.DISABLED,
                previous_response_id=None,
                conversation_id=None,
                prompt=None,
            )

        return run_sync(ask)


# --------------------------------------------------------------------------------------------
# Reading the recorded conversation


def _turn_count(ctx: Context) -> int:
    return sum(1 for h in ctx.history if h["name"].startswith("turn:"))


def function_calls(turn: Any) -> list[dict]:
    if not isinstance(turn, dict):
        return []
    items = turn.get("items") or ()
    return [i for i in items if isinstance(i, dict) and i.get("type") == "function_call"]


def call_label(turn: int, index: int, call: dict) -> str:
    tool = "".join(c for c in str(call.get("name", "")) if c.isalnum() or c in "_-")[:64]
    return f"{turn}.{index}:{tool}"


def _parse_arguments(raw: Any) -> tuple[dict, str]:
    try:
        value = json.loads(raw or "{}") if isinstance(raw, str) else raw
    except ValueError as exc:
        return {}, f"the arguments are not JSON: {exc}"
    if not isinstance(value, dict):
        return {}, "the arguments must be a JSON object"
    return value, ""


def transcript(ctx: Context) -> list[dict]:
    """The conversation so far, rebuilt from recorded step results only."""
    statuses = {h["name"]: h["status"] for h in ctx.history}
    items = list((ctx.results.get(START) or {}).get("input") or [])
    turn = 1
    while f"turn:{turn}" in ctx.results:
        recorded = ctx.results[f"turn:{turn}"]
        items.extend(recorded.get("items") or [])
        for index, call in enumerate(function_calls(recorded)):
            label = call_label(turn, index, call)
            if f"call:{label}" not in statuses:
                break
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": call.get("call_id", ""),
                    "output": _tool_output(ctx, statuses, label),
                }
            )
        turn += 1
    return items


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


# --------------------------------------------------------------------------------------------
# Handlers of the dynamic compute steps


def _agent_for(ctx: Context) -> AgentWorkflow:
    try:
        return _AGENTS[(ctx.workflow, ctx.version)]
    except KeyError:
        raise AgentSetupError(f"{ctx.workflow} v{ctx.version} is not a registered agent") from None


def _model_turn(ctx: Context) -> dict:
    agent = _agent_for(ctx)
    try:
        response = agent.ask_model(transcript(ctx))
    except ToolError:
        raise
    except Exception as exc:
        raise ToolError(
            _model_failure_class(exc), f"model call failed: {type(exc).__name__}: {exc}"
        ) from exc
    usage = response.usage
    return {
        "items": to_json_value(response.to_input_items()),
        "response_id": response.response_id,
        "usage": {
            "requests": usage.requests,
            "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
        },
    }


def _model_failure_class(exc: Exception) -> str:
    # Model calls are compute: nothing outside changed, so most failures may simply be retried.
    try:
        import openai
    except ImportError:  # pragma: no cover - openai is a dependency of openai-agents
        return FailureClass.INVALID_INPUT
    if isinstance(exc, openai.AuthenticationError | openai.PermissionDeniedError):
        return FailureClass.PERMISSION
    if isinstance(exc, openai.BadRequestError | ModelBehaviorError):
        return FailureClass.INVALID_INPUT
    if isinstance(exc, openai.APIConnectionError):
        return FailureClass.OUTAGE
    if isinstance(exc, openai.APIError):
        return FailureClass.TRANSIENT
    return FailureClass.INVALID_INPUT


def _finish(ctx: Context) -> dict:
    turns = _turn_count(ctx)
    usage = {"requests": 0, "input_tokens": 0, "output_tokens": 0}
    for number in range(1, turns + 1):
        for key, value in ((ctx.results.get(f"turn:{number}") or {}).get("usage") or {}).items():
            if key in usage and isinstance(value, int):
                usage[key] += value
    return {
        "final_output": final_text(ctx.results.get(f"turn:{turns}")),
        "turns": turns,
        "usage": usage,
    }


def _refuse_call(ctx: Context) -> dict:
    return {"error": ctx.spec.get("error", "the call was refused")}


workflows.register_handler(TURN_HANDLER, _model_turn, waits=True)
workflows.register_handler(FINISH_HANDLER, _finish)
workflows.register_handler(REFUSAL_HANDLER, _refuse_call)


# --------------------------------------------------------------------------------------------
# Input


def _validate_input(data: dict) -> dict:
    message = data.get("message")
    if not isinstance(message, str) or not message.strip():
        raise ValueError("'message' must be a non-empty string")
    if len(message) > MAX_MESSAGE_CHARS:
        raise ValueError(f"'message' is longer than {MAX_MESSAGE_CHARS} characters")
    return data


def _default_input(data: dict) -> list[dict]:
    return [{"role": "user", "content": data["message"]}]


# --------------------------------------------------------------------------------------------
# Tools


def _jsonable(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if isinstance(value, str | int | float | bool | type(None)):
        return value
    try:
        return to_json_value(value)
    except (TypeError, ValueError):
        return str(value)


def _sdk_invoker(function: FunctionTool) -> Callable[[dict, CallContext], Any]:
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
            context=ctx,
            tool_name=function.name,
            tool_call_id=ctx.idempotency_key or f"{ctx.run_id}:{ctx.step}",
            tool_arguments=arguments,
        )
        try:
            value = run_sync(lambda: raising.on_invoke_tool(tool_context, arguments))
        except ModelBehaviorError as exc:
            raise ToolError(FailureClass.INVALID_INPUT, str(exc)) from None
        return _jsonable(value)

    return call


def _sdk_approval(function: FunctionTool) -> bool | Callable[[dict], bool]:
    policy = function.needs_approval
    if not callable(policy):
        return bool(policy)

    def needs(arguments: dict) -> bool:
        async def ask():
            return await policy(RunContextWrapper(context=None), arguments, "")

        return bool(run_sync(ask))

    return needs


def register_function_tool(
    function: FunctionTool, tool_name: str, policy: ToolPolicy = ToolPolicy()
) -> str:
    """Register an SDK function tool as the TaskPilots python tool `tool_name`."""
    tool_registry.register(
        python_tool(
            tool_name,
            _sdk_invoker(function),
            side_effect=policy.side_effect,
            risk=policy.risk,
            dedupes_by_key=policy.dedupes_by_key,
            lookup_fn=policy.lookup,
            target=policy.target or (lambda params, _n=tool_name: f"agent-tool:{_n}"),
            scope=policy.scope,
            timeout=policy.timeout,
            compensating_tool=policy.compensating_tool,
            compensation_params=policy.compensation_params,
            params_schema=flat_schema(function.params_json_schema),
            description=function.description or "",
        ),
        replace=True,
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


def function_tool_for(tool_name: str, *, name: str = "", description: str = "") -> FunctionTool:
    """An SDK function tool the model can call, backed by the registered TaskPilots tool.

    Under TaskPilots (register_agent) a call goes through the engine's protocol. Used with the
    SDK's own `Runner.run`, the tool is simply called, without TaskPilots' protection.
    """
    tool = tool_registry.get(tool_name)
    info = tool_info(tool_name)
    schema = info.input_schema or json_schema_from_flat(tool.params_schema)

    async def invoke(tool_context: ToolContext, arguments: str) -> str:
        import asyncio

        params = json.loads(arguments or "{}")
        ctx = CallContext(
            idempotency_key=f"sdk-{uuid.uuid4()}",
            run_id="",
            step=tool_context.tool_name,
            attempt=1,
            timeout=tool.timeout,
        )
        result = await asyncio.to_thread(tool.invoke, params, ctx)
        return json.dumps(result.response, ensure_ascii=False)

    invoke.taskpilots_tool = tool_name  # type: ignore[attr-defined]
    return FunctionTool(
        name=name or tool_name.replace(".", "_")[-64:],
        description=description or info.description or tool.description,
        params_json_schema=schema,
        on_invoke_tool=invoke,
        strict_json_schema=False,
    )


# --------------------------------------------------------------------------------------------
# Registration

_AGENTS: dict[tuple[str, int], AgentWorkflow] = {}


def register_agent(
    name: str,
    agent: Agent,
    *,
    version: int = 1,
    tools: Mapping[str, ToolPolicy | str] | None = None,
    max_turns: int = 12,
    stage: str = "agent",
    build_input: Callable[[dict], list[dict]] | None = None,
    validate_input: Callable[[dict], dict] | None = None,
) -> AgentWorkflow:
    """Register `agent` as the workflow `name` (see the module docstring).

    `tools` maps the agent's function-tool names to a ToolPolicy, or to the name of a registered
    TaskPilots tool to call instead. `build_input(run_input)` makes the conversation's input
    items (default: the input's `message` as a user message); `validate_input` checks the
    untrusted run input at start (raise ValueError).
    """
    if agent.handoffs:
        raise AgentSetupError("handoffs are not supported under TaskPilots yet")
    if getattr(agent, "mcp_servers", None):
        raise AgentSetupError(
            "give MCP tools to the agent through runs.agents.mcp (register_mcp_tools and "
            "function_tool_for), not Agent(mcp_servers=...): the SDK's MCP calls bypass the "
            "snapshot and idempotency protocol"
        )
    if agent.output_type not in (None, str):
        raise AgentSetupError("structured output_type is not supported under TaskPilots yet")
    policies = dict(tools or {})
    bindings: dict[str, _Binding] = {}
    for function in agent.tools:
        if not isinstance(function, FunctionTool):
            raise AgentSetupError(
                f"tool {getattr(function, 'name', function)!r} is not a function tool; only "
                "function tools can run under TaskPilots"
            )
        policy = policies.pop(function.name, None)
        if isinstance(policy, str):
            policy = ToolPolicy(tool=policy)
        target = (policy.tool if policy else "") or getattr(
            function.on_invoke_tool, "taskpilots_tool", ""
        )
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
            target = register_function_tool(
                function, f"{name}.{function.name}", policy or ToolPolicy()
            )
            info = tool_info(target)
            if policy is not None and policy.needs_approval is not None:
                info = dataclasses.replace(info, needs_approval=policy.needs_approval)
        bindings[function.name] = _Binding(target, info)
    if policies:
        raise AgentSetupError(f"no tools named {sorted(policies)} on agent {agent.name!r}")
    runner = AgentWorkflow(
        name,
        version,
        agent,
        bindings,
        max_turns=max_turns,
        stage=stage,
        build_input=build_input,
        validate_input=validate_input,
    )
    workflows.register(runner.workflow, replace=True)
    _AGENTS[(name, version)] = runner
    return runner

"""AgentWorkflow: an SDK agent (and the agents it hands off to) as one TaskPilots workflow.

Its `next` function is the durable loop: which step comes next, decided from recorded step
results only (guardrails, model turns, approvals, tool calls, handoffs, finish). Its other
methods do one step's work (a model turn, a handoff, a guardrail, the final output); the step
handlers (runs.agents.sdk.handlers) call them. The handler names below are stored with the
steps in the database: they never change.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agents import Agent, FunctionTool, RunContextWrapper
from agents.exceptions import ModelBehaviorError
from agents.handoffs import HandoffInputData, nest_handoff_history
from agents.models.interface import Model, ModelTracing

from runs import hooks
from runs import tools as tool_registry
from runs.agents import run_sync, tool_info
from runs.agents.sdk.base import (
    AgentSetupError,
    _default_input,
    _enabled,
    _jsonable,
    _output_schema,
    _resolved,
    _validate_input,
)
from runs.agents.sdk.conversation import (
    START,
    _conversation,
    _entry_of,
    _has_used_tools,
    _parse_arguments,
    _run_item,
    _slug,
    _tool_final_output,
    _turn_count,
    _turn_entries,
    call_label,
    final_text,
    function_calls,
    handoff_label,
    transcript,
)
from runs.agents.sdk.graph import _AgentNode, _Binding, _McpSource, _Offer
from runs.agents.sdk.mcp_servers import _listed_mcp_tools, _mcp_function_tools
from runs.models import FailureClass, StepKind, to_json_value
from runs.tools import ToolError
from runs.workflows import END, Context, DynamicStep, Workflow, compute

FINISH = "finish"
TURN_HANDLER = "agents.sdk.model_turn"
# A handoff to an Agent listed in `handoffs` is pure; a Handoff object may run the user's
# on_handoff and input_filter, which may wait on the outside world.
HANDOFF_HANDLER = "agents.sdk.handoff"
HANDOFF_CALLBACK_HANDLER = "agents.sdk.handoff_callback"
GUARDRAIL_HANDLER = "agents.sdk.guardrail"
TRIPWIRE_HANDLER = "agents.sdk.tripwire"
FINISH_HANDLER = "agents.sdk.finish"
REFUSAL_HANDLER = "agents.sdk.refuse_call"


@dataclass
class AgentWorkflow:
    """An SDK agent registered as a TaskPilots workflow (see runs.agents.sdk)."""

    name: str
    version: int
    agent: Agent
    bindings: dict[str, _Binding]
    max_turns: int = 12
    stage: str = "agent"
    build_input: Callable[[dict], list[dict]] | None = None
    validate_input: Callable[[dict], dict] | None = None
    # Every agent the first one can reach by handoffs, by name (the first one included).
    agents: dict[str, _AgentNode] = field(default_factory=dict)
    # run input → the SDK run context object (RunContextWrapper.context); pure.
    context: Callable[[dict], Any] | None = None
    workflow: Workflow = field(init=False)

    def __post_init__(self) -> None:
        self.agents = self.agents or {self.agent.name: _AgentNode(self.agent, self.bindings)}
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
            guard = self._guardrail_steps(ctx, statuses, self.agents[self.agent.name], "input")
            return guard or self._turn(ctx, 1)
        recorded = ctx.results.get(f"turn:{turns}") or {}
        node = self.node(recorded.get("agent") or self.agent.name)
        receivers = recorded.get("handoffs") or {}
        calls = function_calls(recorded)
        for index, call in enumerate(calls):
            if call.get("name") not in receivers:
                step = self._call_step(ctx, statuses, turns, index, call, node, recorded)
                if step is not None:
                    return step
        handoffs = [(i, c) for i, c in enumerate(calls) if c.get("name") in receivers]
        if handoffs:
            index, call = handoffs[0]
            name = f"handoff:{handoff_label(turns, index, receivers[call['name']])}"
            if name not in statuses:
                return self._handoff_step(name, node, turns, index, call, receivers)
            return self._next_turn(ctx, turns)
        if not calls:
            if _output_schema(node.agent) is not None and not final_text(recorded):
                return self._next_turn(ctx, turns)  # the SDK asks again for the structured answer
            return self._finishing(ctx, statuses, node, turns, "")
        final_from = _tool_final_output(node.agent, ctx, turns, calls, receivers)
        if final_from:
            return self._finishing(ctx, statuses, node, turns, final_from)
        return self._next_turn(ctx, turns)

    def _next_turn(self, ctx: Context, turns: int) -> DynamicStep:
        if turns >= self.max_turns:
            raise AgentSetupError(
                f"the agent used its {self.max_turns} model turns without a final answer"
            )
        return self._turn(ctx, turns + 1)

    def _turn(self, ctx: Context, number: int) -> DynamicStep:
        return DynamicStep(
            f"turn:{number}",
            StepKind.COMPUTE,
            stage=self.stage,
            extra={"handler": TURN_HANDLER, "agent": self.current_agent(ctx)},
        )

    def _finishing(self, ctx, statuses, node: _AgentNode, turn: int, final_from: str):
        """The last agent's output guardrails, then `finish`."""
        about = {"agent": node.agent.name, "turn": turn, "final_from": final_from}
        guard = self._guardrail_steps(ctx, statuses, node, "output", about)
        if guard is not None:
            return guard
        return DynamicStep(
            FINISH, StepKind.COMPUTE, stage=self.stage, extra={"handler": FINISH_HANDLER, **about}
        )

    def _guardrail_steps(self, ctx, statuses, node, where: str, about=None):
        """The next guardrail step (or the tripwire of a tripped one), or None when all ran."""
        guardrails = (
            node.agent.input_guardrails if where == "input" else node.agent.output_guardrails
        )
        prefix = where if where == "input" else f"output.{about['turn']}"
        for index, guardrail in enumerate(guardrails):
            label = f"{prefix}.{index}:{_slug(guardrail.get_name())}"
            name = f"guardrail:{label}"
            extra = {"guardrail": where, "index": index, "agent": node.agent.name, **(about or {})}
            if name not in statuses:
                return DynamicStep(
                    name,
                    StepKind.COMPUTE,
                    stage=self.stage,
                    extra={"handler": GUARDRAIL_HANDLER, **extra},
                )
            if (ctx.results.get(name) or {}).get("tripwire_triggered"):
                trip = f"tripwire:{label}"
                if trip not in statuses:
                    return DynamicStep(
                        trip,
                        StepKind.COMPUTE,
                        stage=self.stage,
                        extra={"handler": TRIPWIRE_HANDLER, "guardrail_step": name},
                    )
        return None

    def _call_step(self, ctx, statuses, turn, index, call, node, recorded) -> DynamicStep | None:
        label = call_label(turn, index, call)
        name = f"call:{label}"
        if name in statuses:
            return None
        arguments, problem = _parse_arguments(call.get("arguments"))
        binding = self._binding(node, recorded, call.get("name", ""))
        if binding is None:
            problem = f"there is no tool named {call.get('name')!r}"
        if problem:
            return self._refusal(name, problem)
        if self._approval_needed(ctx, binding, arguments, call):
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
                    or f"The agent {node.agent.name!r} wants to call {call['name']}.",
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

    def _binding(self, node: _AgentNode, recorded: dict, call_name: str) -> _Binding | None:
        offered = recorded.get("tools")
        if offered is None:  # a turn recorded before turns recorded their tools
            return node.bindings.get(call_name)
        target = offered.get(call_name)
        if not target:
            return None
        binding = node.bindings.get(call_name)
        if binding is not None and binding.tool == target:
            return binding
        try:  # an MCP tool: listed in this process on first use
            tool = tool_registry.get(target)
        except tool_registry.UnknownTool:
            return None
        info = tool_info(target)
        source = self._mcp_source_of(getattr(tool, "server", ""))
        if source is not None and source.requires_approval(getattr(tool, "mcp_name", "")):
            reason = info.approval_reason or f"MCP server {source.sdk.name!r} requires approval."
            info = dataclasses.replace(info, needs_approval=True, approval_reason=reason)
        return _Binding(target, info)

    def _approval_needed(self, ctx: Context, binding: _Binding, arguments: dict, call) -> bool:
        if binding.sdk_approval is None:
            return binding.approval.approval_needed(arguments)
        wrapper = self.run_context(ctx.input)
        policy = binding.sdk_approval
        return bool(run_sync(lambda: _resolved(policy, wrapper, arguments, call.get("call_id"))))

    def _handoff_step(self, name, node, turn, index, call, receivers) -> DynamicStep:
        edge = node.edge(call["name"])
        pure = edge is not None and not edge.callback
        return DynamicStep(
            name,
            StepKind.COMPUTE,
            stage=self.stage,
            extra={
                "handler": HANDOFF_HANDLER if pure else HANDOFF_CALLBACK_HANDLER,
                "call_id": call.get("call_id", ""),
                "turn": turn,
                "index": index,
                "handoff_tool": call["name"],
                "from": node.agent.name,
                "to": receivers[call["name"]],
            },
        )

    def _refusal(self, name: str, problem: str) -> DynamicStep:
        # Told to the model as the call's output, as the SDK does for a failing tool.
        return DynamicStep(
            name,
            StepKind.COMPUTE,
            stage=self.stage,
            extra={"handler": REFUSAL_HANDLER, "error": problem},
        )

    # -- agents and the run's context -----------------------------------------------------

    def node(self, name: str) -> _AgentNode:
        try:
            return self.agents[name]
        except KeyError:
            raise AgentSetupError(
                f"{self.name} v{self.version} has no agent named {name!r} (the run recorded it; "
                "deploy the agent again under that name, or finish the run by hand)"
            ) from None

    def current_agent(self, ctx: Context) -> str:
        """The agent whose turn is next: the receiver of the last recorded handoff."""
        name = self.agent.name
        for step in ctx.history:
            if step["name"].startswith("handoff:"):
                receiver = (ctx.results.get(step["name"]) or {}).get("to")
                name = receiver or name
        return self.node(name).agent.name

    def run_context(self, run_input: dict) -> RunContextWrapper:
        """The SDK run context for this run, built again from its input each time."""
        return RunContextWrapper(context=self.context(run_input) if self.context else None)

    def _mcp_source_of(self, server_name: str) -> _McpSource | None:
        for node in self.agents.values():
            for source in node.mcp:
                if source.server.name == server_name:
                    return source
        return None

    # -- the model ------------------------------------------------------------------------

    def model(self, agent: Agent | None = None) -> Model:
        agent = agent or self.agent
        if isinstance(agent.model, Model):
            return agent.model
        from agents.models.multi_provider import MultiProvider

        return MultiProvider().get_model(agent.model)

    def function_tools(self, agent: Agent | None = None) -> list[FunctionTool]:
        return [t for t in (agent or self.agent).tools if isinstance(t, FunctionTool)]

    def offer(self, node: _AgentNode, wrapper: RunContextWrapper) -> _Offer:
        """The tools and handoffs the agent's model is given this turn, as the SDK gives them:
        MCP tools first, then the enabled function tools; a handoff wins a name they share."""
        mcp_tools = _listed_mcp_tools(node)  # sync: may list a server, in this process

        async def enabled():
            chosen = [(s, t) for s, t in mcp_tools if await s.allows(t, wrapper, node.agent)]
            functions = [
                t for t in self.function_tools(node.agent) if await _enabled(t, wrapper, node.agent)
            ]
            edges = [e for e in node.handoffs if await _enabled(e.handoff, wrapper, node.agent)]
            return chosen, functions, edges

        chosen, functions, edges = run_sync(enabled)
        receivers = {e.handoff.tool_name: e.target for e in edges}
        named: dict[str, tuple[FunctionTool, str]] = {}
        for function, target in _mcp_function_tools(node.agent, chosen):
            named[function.name] = (function, target)
        for function in functions:
            named.pop(function.name, None)  # the SDK: the last of a name wins
            named[function.name] = (function, node.bindings[function.name].tool)
        offered = {n: v for n, v in named.items() if n not in receivers}
        return _Offer(
            tools=[function for function, _ in offered.values()],
            targets={n: target for n, (_, target) in offered.items()},
            handoffs=[e.handoff for e in edges],
            receivers=receivers,
        )

    def ask_model(self, node: _AgentNode, items: list[dict], offer: _Offer, wrapper, used: bool):
        agent = node.agent

        async def ask():
            system = await agent.get_system_prompt(wrapper)
            prompt = await agent.get_prompt(wrapper)
            settings = agent.model_settings
            if agent.reset_tool_choice and used and settings.tool_choice is not None:
                settings = dataclasses.replace(settings, tool_choice=None)  # as the SDK does
            return await self.model(agent).get_response(
                system,
                items,
                settings,
                offer.tools,
                _output_schema(agent),
                offer.handoffs,
                ModelTracing.DISABLED,
                previous_response_id=None,
                conversation_id=None,
                prompt=prompt,
            )

        if hooks.tracers:
            request = {"agent": agent.name, "model": _model_name(agent)}
            return hooks.traced("model_request", request, lambda: run_sync(ask))
        return run_sync(ask)

    def take_turn(self, ctx: Context) -> dict:
        node = self.node(self.current_agent(ctx))
        wrapper = self.run_context(ctx.input)
        offer = self.offer(node, wrapper)
        try:
            response = self.ask_model(
                node, transcript(ctx), offer, wrapper, _has_used_tools(ctx, node.agent.name)
            )
        except ToolError:
            raise
        except Exception as exc:
            raise ToolError(
                _model_failure_class(exc), f"model call failed: {type(exc).__name__}: {exc}"
            ) from exc
        usage = response.usage
        return {
            "agent": node.agent.name,
            "items": to_json_value(response.to_input_items()),
            "response_id": response.response_id,
            "usage": {
                "requests": usage.requests,
                "input_tokens": usage.input_tokens,
                "output_tokens": usage.output_tokens,
            },
            "tools": offer.targets,
            "handoffs": offer.receivers,
        }

    # -- handoffs, guardrails and the final output ---------------------------------------

    def hand_off(self, ctx: Context) -> dict:
        spec = ctx.spec
        source = self.node(spec["from"])
        edge = source.edge(spec["handoff_tool"])
        if edge is None:
            raise ToolError(
                FailureClass.INVALID_INPUT,
                f"agent {source.agent.name!r} has no handoff {spec['handoff_tool']!r} any more",
            )
        call = function_calls(ctx.results.get(f"turn:{spec['turn']}"))[spec["index"]]
        wrapper = self.run_context(ctx.input)
        arguments = call.get("arguments") or ""
        try:  # validates the handoff's input_type and runs its on_handoff
            receiver = run_sync(lambda: edge.handoff.on_invoke_handoff(wrapper, arguments))
        except ModelBehaviorError as exc:
            raise ToolError(FailureClass.INVALID_INPUT, f"handoff {call['name']}: {exc}") from None
        name = getattr(receiver, "name", None)
        if name not in self.agents:
            raise ToolError(
                FailureClass.INVALID_INPUT,
                f"handoff {call['name']} returned agent {name!r}, which is not one of "
                f"{sorted(self.agents)} (registered with {self.name})",
            )
        result = {
            "from": source.agent.name,
            "to": name,
            "tool": call["name"],
            "call_id": call.get("call_id", ""),
            "output": edge.handoff.get_transfer_message(receiver),
        }
        chosen = edge.handoff.input_filter or (
            nest_handoff_history if edge.handoff.nest_handoff_history else None
        )
        if chosen is not None:
            result["history"] = self._filtered_history(ctx, spec["turn"], chosen, wrapper, result)
        return result

    def _filtered_history(self, ctx, turn: int, chosen, wrapper, result: dict) -> dict:
        """The conversation the receiving agent goes on with, through the handoff's
        input_filter (or the SDK's nest_handoff_history), recorded with the handoff."""
        statuses = {h["name"]: h["status"] for h in ctx.history}
        history, before = _conversation(ctx, upto=turn)
        recorded = ctx.results[f"turn:{turn}"]
        new = _turn_entries(ctx, statuses, turn, recorded, pending=result)[0]
        agents = {n: node.agent for n, node in self.agents.items()}
        data = HandoffInputData(
            input_history=tuple(history),
            pre_handoff_items=tuple(_run_item(e, agents) for e in before),
            new_items=tuple(_run_item(e, agents) for e in new),
            run_context=wrapper,
        )
        filtered = run_sync(lambda: _resolved(chosen, data))
        if not isinstance(filtered, HandoffInputData):
            raise ToolError(
                FailureClass.INVALID_INPUT,
                f"the input_filter of handoff {result['tool']} returned {type(filtered).__name__}"
                ", not HandoffInputData",
            )
        given = filtered.input_history
        given = [{"role": "user", "content": given}] if isinstance(given, str) else list(given)
        # As the SDK: input_items, when the filter set them, are what the next agent sees.
        kept = filtered.new_items if filtered.input_items is None else filtered.input_items
        items = (*filtered.pre_handoff_items, *kept)
        return {
            "input": to_json_value(given),
            "items": [_entry_of(i, result["from"]) for i in items],
        }

    def final_output(self, ctx: Context) -> tuple[Agent, Any]:
        """The run's final output as the SDK gives it (a pydantic model for such an
        output_type), checked against the last agent's output schema."""
        agent = self.node(ctx.spec.get("agent") or self.current_agent(ctx)).agent
        if ctx.spec.get("final_from"):
            return agent, ctx.results.get(ctx.spec["final_from"])
        turn = ctx.spec.get("turn") or _turn_count(ctx)
        text = final_text(ctx.results.get(f"turn:{turn}"))
        schema = _output_schema(agent)
        if schema is None:
            return agent, text
        try:
            return agent, schema.validate_json(text)
        except ModelBehaviorError as exc:
            raise ToolError(
                FailureClass.INVALID_INPUT,
                f"the final answer of agent {agent.name!r} does not match its output_type "
                f"{schema.name()}: {exc}",
            ) from None

    def run_guardrail(self, ctx: Context) -> dict:
        spec = ctx.spec
        node = self.node(spec["agent"])
        wrapper = self.run_context(ctx.input)
        if spec["guardrail"] == "input":
            guardrail = node.agent.input_guardrails[spec["index"]]
            items = list((ctx.results.get(START) or {}).get("input") or [])
            ran = run_sync(lambda: guardrail.run(node.agent, items, wrapper))
        else:
            guardrail = node.agent.output_guardrails[spec["index"]]
            _, output = self.final_output(ctx)
            ran = run_sync(lambda: guardrail.run(wrapper, node.agent, output))
        return {
            "guardrail": guardrail.get_name(),
            "tripwire_triggered": bool(ran.output.tripwire_triggered),
            "output_info": _jsonable(ran.output.output_info),
        }


def _model_name(agent: Agent) -> str:
    """The model an agent asks, as a trace names it: the name it was given, or the name a
    Model object was made for (the SDK's OpenAI models keep it in `model`), or its class."""
    model = agent.model
    if isinstance(model, str):
        return model
    if model is None:
        return ""  # the SDK's default model, chosen by its provider
    name = getattr(model, "model", None)
    return name if isinstance(name, str) and name else type(model).__name__


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
    if isinstance(exc, openai.NotFoundError):
        # The model or the endpoint is gone (renamed, retired): every call fails the same way.
        return FailureClass.API_DRIFT
    if isinstance(exc, openai.APIConnectionError):
        return FailureClass.OUTAGE
    if isinstance(exc, openai.APIError):
        return FailureClass.TRANSIENT
    return FailureClass.INVALID_INPUT

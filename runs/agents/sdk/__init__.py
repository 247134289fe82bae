"""Run an OpenAI Agents SDK `Agent` (and the agents it hands off to) as a TaskPilots run.

    writer = Agent(name="writer", instructions="...", output_type=Draft,
                   mcp_servers=[MCPServerStdio(name="drafts", params={...})])
    triage = Agent(name="triage", instructions="...", tools=[check_policy], handoffs=[writer])
    register_agent("support.agent", triage, tools={"check_policy": ToolPolicy(side_effect=False)})
    engine.start_run("support.agent", {"message": "Please refund order 42"})

The SDK's own `Runner.run` keeps its loop in memory, so a crash would call the model again and
repeat tool calls. Here the loop is the workflow's `next` function, and every decision is a
recorded step (runs.workflows.DynamicStep):

1. `start` records the conversation's input.
2. `guardrail:input.<i>:<name>`: the first agent's input guardrails, one recorded compute step
   each; a tripped one is followed by `tripwire:...`, a failing step a person looks at.
3. `turn:<k>` is a dynamic compute step: its handler rebuilds the conversation from recorded
   step results, calls the current agent's model once (`Model.get_response`, with its tools,
   handoffs and output schema) and records the output items, the agent, and which tools and
   handoffs the model was offered. A resumed run reads them back and never asks again.
4. For each tool call of that turn, in order: an `approve:<k>.<i>:<tool>` approval step when the
   tool needs one (a normal ApprovalRequest in the console; the decision, with any edited
   arguments, is what the call then uses and what the model is told), then `call:<k>.<i>:<tool>`,
   a `side_effect` or `read` step according to the TaskPilots tool's metadata — snapshot,
   idempotency key, reconciliation and failure routing as for any other step.
5. A handoff call of that turn (after its tool calls, as the SDK orders them) is
   `handoff:<k>.<i>:<agent>`, a compute step recording from → to and what the handoff tool
   returns to the model; the next turn is the receiving agent's. Which agent is current is read
   from these recorded results only, so a run resumed in another process goes on with the
   right one.
6. A turn without tool calls (or a tool that ends the run, `tool_use_behavior`) leads to the
   last agent's output guardrails and `finish`, which validates a structured `output_type`.

SDK function tools map onto TaskPilots tools: a plain `@function_tool` is registered as a
python tool named `<workflow>.<tool>` with the metadata of its `ToolPolicy` (by default a
medium-risk side effect: the cautious guess); a tool made by `function_tool_for` (e.g. an MCP
tool, runs.agents.mcp) calls the TaskPilots tool it names; the tools of `Agent(mcp_servers=...)`
become TaskPilots MCP tools (`mcp.<server>.<tool>`), listed on the first model turn in a process.
A function tool gets the run's context object as `ctx.context` (`register_agent(context=...)`;
without one, the call's CallContext), and the CallContext always through `call_context_of(ctx)`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from runs import tools as tool_registry
from runs import workflows
from runs.agents import (
    AgentToolInfo,
    MissingExtra,
    flat_schema,
    run_sync,
    tool_info,
)
from runs.agents import set_tool_info as _set_tool_info
from runs.agents.function_tools import function_tool_for
from runs.models import FailureClass, Risk, StepKind, to_json_value
from runs.tools import CallContext, LookupResult, ToolError, Verification, python_tool
from runs.workflows import END, Context, DynamicStep, Workflow, compute

try:
    from agents import Agent, FunctionTool, Handoff, RunContextWrapper, handoff
    from agents.agent_output import AgentOutputSchema, AgentOutputSchemaBase
    from agents.exceptions import ModelBehaviorError
    from agents.handoffs import HandoffInputData, nest_handoff_history
    from agents.items import (
        HandoffCallItem,
        HandoffOutputItem,
        InputItem,
        MessageOutputItem,
        ReasoningItem,
        ToolCallItem,
        ToolCallOutputItem,
    )
    from agents.models.interface import Model, ModelTracing
    from agents.tool_context import ToolContext
except ModuleNotFoundError as exc:  # the optional `agents` extra
    raise MissingExtra("openai-agents") from exc

START = "start"
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
MAX_MESSAGE_CHARS = 20_000
# What the SDK tells the model about the handoffs of a turn after the first (execute_handoffs).
MULTIPLE_HANDOFFS = "Multiple handoffs detected, ignoring this one."


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
    # Reconciliation by reads for a tool without a lookup by key (runs.tools.Verification).
    verification: Verification | None = None
    settle_seconds: float | None = None
    target: Callable[[dict], str] | None = None
    scope: str = ""
    # None: the SDK tool's `timeout_seconds`, else the engine's default.
    timeout: float | None = None
    compensating_tool: str = ""
    compensation_params: Callable[[dict, dict], dict] | None = None


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


# --------------------------------------------------------------------------------------------
# Reading the recorded conversation


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


# --------------------------------------------------------------------------------------------
# Handlers of the dynamic compute steps


def _agent_for(ctx: Context) -> AgentWorkflow:
    try:
        return _AGENTS[(ctx.workflow, ctx.version)]
    except KeyError:
        raise AgentSetupError(f"{ctx.workflow} v{ctx.version} is not a registered agent") from None


def _model_turn(ctx: Context) -> dict:
    return _agent_for(ctx).take_turn(ctx)


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


def _hand_off(ctx: Context) -> dict:
    return _agent_for(ctx).hand_off(ctx)


def _guardrail(ctx: Context) -> dict:
    return _agent_for(ctx).run_guardrail(ctx)


def _tripwire(ctx: Context) -> dict:
    # A person looks at it: skipping the step lets the run go on despite the guardrail.
    tripped = ctx.results.get(ctx.spec.get("guardrail_step", "")) or {}
    info = json.dumps(tripped.get("output_info"), ensure_ascii=False)[:500]
    raise ToolError(
        FailureClass.INVALID_INPUT,
        f"guardrail {tripped.get('guardrail', '?')!r} tripped its wire: {info}",
    )


def _finish(ctx: Context) -> dict:
    runner = _agent_for(ctx)
    agent, output = runner.final_output(ctx)
    turns = _turn_count(ctx)
    usage = {"requests": 0, "input_tokens": 0, "output_tokens": 0}
    for number in range(1, turns + 1):
        for key, value in ((ctx.results.get(f"turn:{number}") or {}).get("usage") or {}).items():
            if key in usage and isinstance(value, int):
                usage[key] += value
    return {
        "final_output": _output_json(agent, output),
        "last_agent": agent.name,
        "turns": turns,
        "usage": usage,
    }


def _refuse_call(ctx: Context) -> dict:
    return {"error": ctx.spec.get("error", "the call was refused")}


workflows.register_handler(TURN_HANDLER, _model_turn, waits=True)
workflows.register_handler(HANDOFF_HANDLER, _hand_off)
workflows.register_handler(HANDOFF_CALLBACK_HANDLER, _hand_off, waits=True)
workflows.register_handler(GUARDRAIL_HANDLER, _guardrail, waits=True)
workflows.register_handler(TRIPWIRE_HANDLER, _tripwire)
workflows.register_handler(FINISH_HANDLER, _finish)
workflows.register_handler(REFUSAL_HANDLER, _refuse_call)


# --------------------------------------------------------------------------------------------
# Input and output


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


# --------------------------------------------------------------------------------------------
# Tools


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
    policy: ToolPolicy = ToolPolicy(),
    *,
    agent: Agent | None = None,
    context: Callable[[dict], Any] | None = None,
) -> str:
    """Register an SDK function tool as the TaskPilots python tool `tool_name`."""
    tool = python_tool(
        tool_name,
        _sdk_invoker(function, agent),
        side_effect=policy.side_effect,
        risk=policy.risk,
        dedupes_by_key=policy.dedupes_by_key,
        lookup_fn=policy.lookup,
        verification=policy.verification,
        settle_seconds=policy.settle_seconds,
        target=policy.target or (lambda params, _n=tool_name: f"agent-tool:{_n}"),
        scope=policy.scope,
        timeout=policy.timeout if policy.timeout is not None else function.timeout_seconds,
        compensating_tool=policy.compensating_tool,
        compensation_params=policy.compensation_params,
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


# --------------------------------------------------------------------------------------------
# MCP servers of the SDK (Agent(mcp_servers=[...])) as TaskPilots MCP tools


def _listed_mcp_tools(node: _AgentNode) -> list[tuple[_McpSource, Any]]:
    """The agent's MCP servers' tools, listed on first use in this process."""
    from runs.agents.mcp import McpSetupError

    listed = []
    for source in node.mcp:
        try:
            listed.extend((source, tool) for tool in source.toolset.values())
        except McpSetupError as exc:
            raise ToolError(FailureClass.INVALID_INPUT, str(exc)) from None
    return listed


def _mcp_function_tools(agent: Agent, chosen) -> list[tuple[FunctionTool, str]]:
    """SDK function tools for the chosen MCP tools, named as the SDK names them."""
    from agents.mcp.util import MCPUtil
    from agents.strict_schema import ensure_strict_json_schema

    prefixed = agent.mcp_config.get("include_server_in_tool_names", False)
    strict = agent.mcp_config.get("convert_schemas_to_strict", False)
    made, owners = [], {}
    for source, tool in chosen:
        name = tool.mcp_name
        if prefixed:
            base = MCPUtil._build_prefixed_tool_base_name(source.sdk.name, name)
            name = MCPUtil._shorten_tool_name(base, f"{source.sdk.name}\x00{name}")
        if owners.get(name, source) is not source:
            raise ToolError(
                FailureClass.INVALID_INPUT,
                f"Duplicate tool names found across MCP servers: {name!r}; set "
                "Agent(mcp_config={'include_server_in_tool_names': True})",
            )
        owners[name] = source
        function = function_tool_for(tool.name, name=name, description=tool.description)
        if strict:
            try:
                schema = ensure_strict_json_schema(function.params_json_schema)
                function = dataclasses.replace(
                    function, params_json_schema=schema, strict_json_schema=True
                )
            except Exception:  # noqa: S110 - the SDK keeps a schema it cannot make strict
                pass
        made.append((function, tool.name))
    return made


def _mcp_source(sdk_server: Any, agent: Agent, config: Mapping[str, Any]) -> _McpSource:
    from agents.mcp import MCPServerSse

    from runs.agents.mcp import McpSetupError, register_mcp_tools, server_from_sdk

    where = f"MCP server {getattr(sdk_server, 'name', sdk_server)!r} of agent {agent.name!r}"
    if isinstance(sdk_server, MCPServerSse):  # its params look like streamable HTTP's
        raise AgentSetupError(
            f"{where}: MCPServerSse (the older HTTP+SSE transport) is not supported under "
            "TaskPilots: use MCPServerStdio or MCPServerStreamableHttp"
        )
    for attribute, why in _MCP_REFUSED:
        if getattr(sdk_server, attribute, None) not in (None, [], {}):
            raise AgentSetupError(f"{where}: {attribute} {why}")
    failure = getattr(sdk_server, "_failure_error_function", None)
    if callable(failure):
        raise AgentSetupError(f"{where}: failure_error_function {_NO_ERROR_FORMATTER}")
    if callable(getattr(sdk_server, "_needs_approval_policy", None)):
        raise AgentSetupError(
            f"{where}: a require_approval function is not supported under TaskPilots; give "
            "the tool McpToolConfig(needs_approval=<function of the arguments>) in mcp_tools="
        )
    try:
        server = server_from_sdk(sdk_server)
        toolset = register_mcp_tools(server, config=dict(config))
    except McpSetupError as exc:
        raise AgentSetupError(str(exc)) from None
    return _McpSource(sdk_server, server, toolset)


_NO_ERROR_FORMATTER = (
    "is not used under TaskPilots: a failed call is classified (outage, unknown outcome, ...) "
    "and routed by the engine's rules, never told to the model as if it were a result"
)
_MCP_REFUSED = [
    (
        "tool_meta_resolver",
        "is not supported: TaskPilots sends its own _meta (the idempotency key, run and step) "
        "with every call",
    ),
    ("tool_input_guardrails", "(MCP tool guardrails) are not run under TaskPilots yet"),
    ("tool_output_guardrails", "(MCP tool guardrails) are not run under TaskPilots yet"),
    (
        "message_handler",
        "is not supported: TaskPilots' MCP client does not pass server notifications on",
    ),
]


# --------------------------------------------------------------------------------------------
# Registration

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
    """Register `agent`, and every agent it can hand off to, as the workflow `name` (see the
    module docstring).

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


def _mcp_config_for(sdk_server: Any, mcp_config: dict) -> Mapping[str, Any]:
    from runs.agents.mcp import server_from_sdk

    keys = [sdk_server.name]
    with contextlib.suppress(Exception):  # _mcp_source says what is wrong with the server
        keys.append(server_from_sdk(sdk_server).name)
    config: dict[str, Any] = {}
    for key in keys:
        config.update(mcp_config.pop(key, None) or {})
    return config


def _check_server_names(sources) -> None:
    by_name: dict[str, Any] = {}
    for source in sources:
        other = by_name.setdefault(source.server.name, source.server)
        if other != source.server:
            raise AgentSetupError(
                f"two different MCP servers are named {source.server.name!r}: their tools would "
                "share the names mcp.<server>.<tool>; give them different names"
            )

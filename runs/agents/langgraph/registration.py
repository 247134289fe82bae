"""register_langgraph: a LangGraph graph, unchanged, as a TaskPilots workflow; its ToolNodes'
tools registered as TaskPilots python tools; the steps' handlers, by name."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from langchain_core.runnables import RunnableConfig
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph._internal._runnable import RunnableCallable
from langgraph.graph.state import CompiledStateGraph, StateGraph
from langgraph.prebuilt import ToolNode

from runs import tools as tool_registry
from runs import workflows
from runs.agents import AgentToolInfo, flat_schema, set_tool_info
from runs.agents.langgraph.journal import CURRENT_CALL, CURRENT_JOURNAL, intercept_tool_call
from runs.agents.langgraph.workflow import (
    FAILED_HANDLER,
    FINISH_HANDLER,
    NODE_HANDLER,
    REFUSAL_HANDLER,
    GraphSetupError,
    LangGraphWorkflow,
)
from runs.agents.policy import ToolPolicy
from runs.agents.steps import use_registered_tool
from runs.models import FailureClass
from runs.tools import CallContext, ToolError
from runs.workflows import Context

_GRAPHS: dict[tuple[str, int], LangGraphWorkflow] = {}


def register_langgraph(
    name: str,
    graph: StateGraph | CompiledStateGraph,
    *,
    version: int = 1,
    tools: Mapping[str, ToolPolicy | str] | None = None,
    graph_input: Callable[[dict], Any] | None = None,
    validate_input: Callable[[dict], dict] | None = None,
    output: Callable[[Any], Any] | None = None,
    stage: str = "agent",
    interrupt_queue: str = "support",
    recursion_limit: int = 25,
) -> LangGraphWorkflow:
    """Register the LangGraph `graph` (its StateGraph builder, or the graph compiled from it)
    as the workflow `name` (see runs.agents.langgraph).

    `tools` maps the tool names of the graph's ToolNodes to a ToolPolicy (side effect or read,
    risk, lookup by key, approval rule, ...), or to a registered TaskPilots tool to call
    instead; a tool not named is a medium-risk side effect (the cautious guess).
    `graph_input(run_input)` is the graph's input (default: the input's `message` as the user's
    message of a MessagesState graph); `validate_input` checks the untrusted run input at
    start; `output(final_state)` is the run's `final_output` (default: the last message's
    content). `interrupt()` approvals go to `interrupt_queue`.
    """
    builder = _builder(graph)
    functions = _tools_of(builder)
    policies = {
        k: ToolPolicy(tool=v) if isinstance(v, str) else v for k, v in (tools or {}).items()
    }
    unknown = sorted(set(policies) - set(functions))
    if unknown:
        raise GraphSetupError(f"the graph's ToolNodes have no tools named {unknown}")
    runner = LangGraphWorkflow(
        name,
        version,
        _journaled(builder),
        functions=functions,
        graph_input=graph_input,
        validate_input=validate_input,
        output=output,
        stage=stage,
        interrupt_queue=interrupt_queue,
        recursion_limit=recursion_limit,
    )
    for tool_name, function in functions.items():
        runner.tools[tool_name] = _bind(runner, tool_name, function, policies.get(tool_name))
    workflows.register(runner.workflow, replace=True)
    _GRAPHS[(name, version)] = runner
    return runner


def _builder(graph: Any) -> StateGraph:
    if isinstance(graph, CompiledStateGraph):
        if graph.interrupt_before_nodes or graph.interrupt_after_nodes:
            raise GraphSetupError(
                "the graph was compiled with interrupt_before/interrupt_after: call "
                "interrupt() in the node instead (it becomes an approval in the inbox)"
            )
        graph = graph.builder
    if not isinstance(graph, StateGraph):
        raise GraphSetupError(f"{graph!r} is not a LangGraph StateGraph or a compiled one")
    return graph


def _tools_of(builder: StateGraph) -> dict[str, Any]:
    """The tools of the graph's ToolNodes by name; a tool that needs the graph's state, store
    or runtime injected is refused, saying why."""
    found: dict[str, Any] = {}
    for node, spec in builder.nodes.items():
        if not isinstance(spec.runnable, ToolNode):
            continue
        if spec.runnable._wrap_tool_call or spec.runnable._awrap_tool_call:
            raise GraphSetupError(
                f"ToolNode {node!r} has its own wrap_tool_call: under TaskPilots each tool call "
                "is a step of its own (retries and failure routing are the engine's)"
            )
        for tool_name, tool in spec.runnable.tools_by_name.items():
            injected = getattr(spec.runnable, "_injected_args", {}).get(tool_name)
            if injected is not None and injected.all_injected_keys:
                raise GraphSetupError(
                    f"tool {tool_name!r} of node {node!r} takes injected "
                    f"{sorted(injected.all_injected_keys)}: under TaskPilots a tool call is a "
                    "step of its own, called with the model's arguments only"
                )
            if found.get(tool_name, tool) is not tool:
                raise GraphSetupError(f"two different tools are named {tool_name!r}")
            found[tool_name] = tool
    return found


def _journaled(builder: StateGraph) -> Any:
    """The graph compiled again (without a checkpointer: TaskPilots' steps are its state) with
    each node's run journaled and each ToolNode's tool calls intercepted."""
    journaled = copy.copy(builder)
    journaled.nodes = {}
    for node, spec in builder.nodes.items():
        runnable = spec.runnable
        if isinstance(runnable, ToolNode):
            runnable = _intercepted(runnable)
        else:
            runnable = _journaled_node(node, runnable)
        journaled.nodes[node] = dataclasses.replace(spec, runnable=runnable)
    journaled.compiled = False
    return journaled.compile()


def _intercepted(tool_node: ToolNode) -> ToolNode:
    """A ToolNode like `tool_node` whose tool calls go through the journal."""
    return ToolNode(
        list(tool_node.tools_by_name.values()),
        name=tool_node.name,
        tags=tool_node.tags,
        handle_tool_errors=tool_node._handle_tool_errors,
        messages_key=tool_node._messages_key,
        wrap_tool_call=intercept_tool_call,
    )


def _journaled_node(node: str, runnable: Any) -> RunnableCallable:
    def run(state: Any, config: RunnableConfig) -> Any:
        journal = CURRENT_JOURNAL.get()
        if journal is None:
            raise RuntimeError("a TaskPilots-wrapped graph ran outside TaskPilots")
        return journal.run_node(node, runnable, state, config)

    return RunnableCallable(run, name=node, trace=False)


def _bind(runner: LangGraphWorkflow, tool_name: str, function: Any, policy) -> str:
    if policy is not None and policy.tool:
        return use_registered_tool(tool_name, policy, GraphSetupError)
    policy = policy or ToolPolicy()
    target = f"{runner.name}.{tool_name}"
    schema = convert_to_openai_tool(function)["function"].get("parameters") or {}
    description = function.description or ""
    tool = policy.python_tool(
        target,
        runner.invoker(tool_name),
        timeout=None,
        params_schema=flat_schema(schema),
        description=description,
    )
    tool_registry.register(tool, replace=True)
    approval = policy.needs_approval if policy.needs_approval is not None else False
    info = AgentToolInfo(
        input_schema=schema,
        description=description,
        needs_approval=approval,
        approval_reason=policy.approval_reason,
        queue=policy.queue,
    )
    set_tool_info(target, info)
    return target


def call_context() -> CallContext:
    """The TaskPilots CallContext (idempotency key, run, step, attempt) of the tool call being
    made: call it inside a graph's tool function, e.g. to send the idempotency key along."""
    call = CURRENT_CALL.get()
    if call is None:
        raise LookupError("this tool call does not run under TaskPilots (no CallContext)")
    return call


def _runner(ctx: Context) -> LangGraphWorkflow:
    try:
        return _GRAPHS[(ctx.workflow, ctx.version)]
    except KeyError:
        raise GraphSetupError(f"{ctx.workflow} v{ctx.version} is not a registered graph") from None


def _node(ctx: Context) -> dict:
    return _runner(ctx).run_node(ctx, ctx.spec["step"])


def _finish(ctx: Context) -> dict:
    return _runner(ctx).finish(ctx)


def _refuse_call(ctx: Context) -> dict:
    return {"error": ctx.spec.get("error", "the call was refused")}


def _failed(ctx: Context) -> dict:
    raise ToolError(FailureClass.INVALID_INPUT, ctx.spec.get("error", "the graph failed"))


workflows.register_handler(NODE_HANDLER, _node, waits=True)
workflows.register_handler(FINISH_HANDLER, _finish)
workflows.register_handler(REFUSAL_HANDLER, _refuse_call)
workflows.register_handler(FAILED_HANDLER, _failed)

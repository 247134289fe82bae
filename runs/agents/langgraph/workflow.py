"""LangGraphWorkflow: a LangGraph graph as one TaskPilots workflow.

Its `next` function invokes the graph against the recorded steps (runs.agents.langgraph.
journal) and returns the first operation not recorded yet as the next step:

- `node:<s>:<node>`: a node's run in superstep s, a compute step (handler NODE_HANDLER) that runs
  the node once and records its output (a model it calls is asked once);
- `interrupt:<s>.<r>:<node>`: the node called `interrupt(value)`; an approval step showing the
  value, whose decision is what `interrupt()` returns when the node runs again;
- `approve:<s>.<i>:<tool>`, when the tool's approval rule says so, then `call:<s>.<i>:<tool>`: the
  i-th tool call a ToolNode makes in superstep s, a `side_effect` or `read` step of the
  TaskPilots tool the LangChain tool is registered as (snapshot, intent, idempotency key,
  reconciliation, as for any other tool);
- `finish`, once the graph returns: its output as JSON.

The handler names are stored with the steps in the database: they never change.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import BaseMessage, ToolMessage
from pydantic import ValidationError

from runs.agents import run_sync
from runs.agents.langgraph.journal import (
    CURRENT_CALL,
    CURRENT_JOURNAL,
    Done,
    Journal,
    Pending,
    PendingStep,
    jsonable,
    pass_signal,
)
from runs.agents.steps import tool_call_step
from runs.models import FailureClass, StepKind
from runs.tools import CallContext, ToolError
from runs.workflows import END, Context, DynamicStep, Workflow, compute

START = "start"
FINISH = "finish"
FAILED = "graph_failed"
NODE_HANDLER = "agents.langgraph.node"
FINISH_HANDLER = "agents.langgraph.finish"
REFUSAL_HANDLER = "agents.langgraph.refuse_call"
FAILED_HANDLER = "agents.langgraph.failed"
MAX_MESSAGE_CHARS = 20_000


class GraphSetupError(ValueError):
    """The graph cannot run under TaskPilots as configured (the message says what to change)."""


def default_input(data: dict) -> dict:
    """A MessagesState graph's input: the run input's `message` as the user's message."""
    return {"messages": [{"role": "user", "content": data["message"]}]}


def validate_message(data: dict) -> dict:
    message = data.get("message")
    if not isinstance(message, str) or not message.strip():
        raise ValueError("'message' must be a non-empty string")
    if len(message) > MAX_MESSAGE_CHARS:
        raise ValueError(f"'message' is longer than {MAX_MESSAGE_CHARS} characters")
    return data


def default_output(state: Any) -> Any:
    """The last message's content for a graph with `messages`, else the state as JSON."""
    messages = state.get("messages") if isinstance(state, dict) else None
    if messages and isinstance(messages[-1], BaseMessage):
        return messages[-1].content
    return jsonable(state)


@dataclass
class LangGraphWorkflow:
    """A LangGraph graph registered as a TaskPilots workflow (see runs.agents.langgraph)."""

    name: str
    version: int
    # The graph compiled again with its nodes and tool calls journaled.
    graph: Any
    # The graph's tool name → the TaskPilots tool a call of it is.
    tools: dict[str, str] = field(default_factory=dict)
    # The graph's LangChain tools (BaseTool) by name.
    functions: dict[str, Any] = field(default_factory=dict)
    graph_input: Callable[[dict], Any] | None = None
    validate_input: Callable[[dict], dict] | None = None
    output: Callable[[Any], Any] | None = None
    stage: str = "agent"
    interrupt_queue: str = "support"
    recursion_limit: int = 25
    workflow: Workflow = field(init=False)

    def __post_init__(self) -> None:
        self.workflow = Workflow(
            self.name,
            self.version,
            [compute(START, self._start, stage=self.stage)],
            next=self._next,
            description=f"LangGraph graph {self.name!r}",
            validate_input=self.validate_input
            or (validate_message if self.graph_input is None else None),
        )

    # -- one pass of the graph --------------------------------------------------------------

    def run_pass(self, run_input: dict, journal: Journal) -> tuple[Any, Pending | Done | None]:
        """Invoke the graph against the journal: (its final state, None) when it finishes,
        else (None, the Pending or Done that ended the pass)."""
        token = CURRENT_JOURNAL.set(journal)
        try:
            state = self.graph.invoke(
                (self.graph_input or default_input)(run_input),
                {"recursion_limit": self.recursion_limit},
            )
        except BaseException as exc:
            found = journal.done or pass_signal(exc)
            if found is None:
                raise
            return None, found
        finally:
            CURRENT_JOURNAL.reset(token)
        return state, journal.done

    # -- the durable loop -------------------------------------------------------------------

    def _start(self, ctx: Context) -> dict:
        return {"input": jsonable((self.graph_input or default_input)(ctx.input))}

    def _next(self, ctx: Context, last: str) -> DynamicStep | None:
        if last in (FINISH, FAILED):
            return END
        journal = Journal(ctx.results)
        try:
            _, found = self.run_pass(ctx.input, journal)
        except Exception as exc:  # the graph itself failed (a routing error, recursion limit...)
            return self._compute(FAILED, FAILED_HANDLER, error=f"{type(exc).__name__}: {exc}")
        if found is None:
            return self._compute(FINISH, FINISH_HANDLER)
        pending = journal.first_pending() or getattr(found, "step", None)
        if pending is None:  # pragma: no cover - a Done without a live step
            raise GraphSetupError("a planning pass ran a node for real")
        if pending.kind == "node":
            return self._compute(pending.name, NODE_HANDLER)
        if pending.kind == "interrupt":
            return self._interrupt_step(pending)
        return self._call_step(ctx, pending)

    def _compute(self, name: str, handler: str, **extra: Any) -> DynamicStep:
        return DynamicStep(
            name,
            StepKind.COMPUTE,
            stage=self.stage,
            extra={"handler": handler, "step": name, **extra},
        )

    def _interrupt_step(self, pending: PendingStep) -> DynamicStep:
        value = pending.value
        node = pending.name.split(":", 2)[2]
        question = value.get("question") if isinstance(value, dict) else value
        return DynamicStep(
            pending.name,
            StepKind.APPROVAL,
            params=value if isinstance(value, dict) else {"value": value},
            stage=self.stage,
            queue=self.interrupt_queue,
            reason=f"The graph {self.name!r} asks at {node!r}: {str(question)[:500]}",
        )

    def _call_step(self, ctx: Context, pending: PendingStep) -> DynamicStep:
        return tool_call_step(
            ctx,
            pending.name,
            pending.tool,
            self.tools.get(pending.tool, ""),
            pending.arguments,
            stage=self.stage,
            who=f"The graph {self.name!r}",
            refuse=lambda name, error: self._compute(name, REFUSAL_HANDLER, error=error),
        )

    # -- each step's own work ---------------------------------------------------------------

    def run_node(self, ctx: Context, step: str) -> dict:
        journal = Journal(ctx.results, live=step)
        try:
            _, found = self.run_pass(ctx.input, journal)
        except ToolError:
            raise
        except Exception as exc:
            raise ToolError(
                _failure_class(exc), f"node {step} failed: {type(exc).__name__}: {exc}"
            ) from exc
        if isinstance(found, Done):
            return found.result
        raise ToolError(
            FailureClass.INVALID_INPUT,
            f"replaying the graph did not reach step {step!r} (it reached {found or 'the end'}): "
            "are its routing functions deterministic?",
        )

    def invoker(self, tool_name: str) -> Callable[[dict, CallContext], Any]:
        """The python tool function of the graph's tool `tool_name`: the LangChain tool
        invoked once with the engine's parameters."""

        def call(params: dict, ctx: CallContext) -> Any:
            tool = self.functions[tool_name]
            token = CURRENT_CALL.set(ctx)
            try:
                if getattr(tool, "func", True) is None:  # a coroutine-only tool
                    value = run_sync(lambda: tool.ainvoke(params))
                else:
                    value = tool.invoke(params)
            except ValidationError as exc:  # nothing was sent
                raise ToolError(FailureClass.INVALID_INPUT, f"{tool_name}: {exc}") from None
            finally:
                CURRENT_CALL.reset(token)
            if isinstance(value, ToolMessage):
                value = value.content
            return jsonable(value)

        return call

    def finish(self, ctx: Context) -> dict:
        state, found = self.run_pass(ctx.input, Journal(ctx.results))
        if found is not None:
            raise ToolError(
                FailureClass.INVALID_INPUT,
                f"the graph did not finish from its recorded steps (it wants {found}): are its "
                "routing functions deterministic?",
            )
        return {
            "final_output": jsonable((self.output or default_output)(state)),
            "node_steps": sum(1 for name in ctx.results if name.startswith("node:")),
        }


def _failure_class(exc: Exception) -> str:
    # A node is compute: nothing outside changed, so a connection failure may be retried.
    if isinstance(exc, ConnectionError | TimeoutError):
        return FailureClass.OUTAGE
    return FailureClass.INVALID_INPUT

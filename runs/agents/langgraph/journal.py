"""The journal: runs a LangGraph graph against the run's recorded steps.

Each pass invokes the graph from its input with every node wrapped (`JournaledNode`) and every
ToolNode's tool calls intercepted (`intercept_tool_call`). A node whose output is recorded
returns the record (its code is not run, so a model it calls is not asked again); a tool call
whose result is recorded is answered from the record (the tool is not called again). The first
operation that is not recorded ends the pass:

- planning (the workflow's `next`): `Pending` says which step comes next;
- live (a node step's own work): that one node runs for real, with the resume values of its
  decided interrupts, and `Done` carries its output (or its new interrupt) back, to be recorded
  by the engine.

A tool call's own work needs no pass: the engine calls the tool with its parameters (runs.
agents.langgraph.workflow.LangGraphWorkflow.invoker).

Names, from LangGraph's own superstep number `s` (`langgraph_step`, the same on every pass):
`node:<s>:<node>` (`node:<s>.<r>:<node>` for its r-th run after r decided interrupts),
`interrupt:<s>.<r>:<node>`, `call:<s>.<i>:<tool>` (the i-th tool call of the message).

Node code runs again only in its own live step and after an interrupt (as LangGraph itself
re-runs a node from its start on resume); the code of recorded nodes never runs again. Routing
functions run on every pass: they have to be deterministic.
"""

from __future__ import annotations

import contextvars
import json
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any

from langchain_core.load import dumpd, load
from langchain_core.messages import AIMessage, ToolMessage
from langgraph.errors import GraphInterrupt
from langgraph.types import Command

from runs.tools import CallContext

# The journal of the pass running in this context (LangGraph copies the context into the
# threads it runs nodes and tool calls in).
CURRENT_JOURNAL: contextvars.ContextVar[Journal | None] = contextvars.ContextVar(
    "taskpilots_langgraph_journal", default=None
)
# The TaskPilots CallContext of the tool call being made (idempotency key, run, step, attempt).
CURRENT_CALL: contextvars.ContextVar[CallContext | None] = contextvars.ContextVar(
    "taskpilots_langgraph_call", default=None
)
# How long a node beside the live one waits for it to start (it is started at once unless the
# graph's routing is not deterministic).
LIVE_START_WAIT = 60.0


class NotRecordable(TypeError):
    """A node returned something TaskPilots cannot record as JSON and revive."""


class Pending(BaseException):  # noqa: N818 - a signal; BaseException: no `except Exception` eats it
    """The pass reached an operation that is not recorded yet."""

    def __init__(self, step: PendingStep) -> None:
        super().__init__(step.name)
        self.step = step


class Done(BaseException):  # noqa: N818
    """The live node of this pass ran; its result is to be recorded."""

    def __init__(self, result: dict) -> None:
        super().__init__("done")
        self.result = result


@dataclass(frozen=True)
class PendingStep:
    name: str
    kind: str  # "node", "interrupt" or "call"
    tool: str = ""
    arguments: dict = field(default_factory=dict)
    value: Any = None  # an interrupt's value
    order: tuple = ()


def node_step(superstep: int, run: int, node: str) -> str:
    return f"node:{superstep}:{node}" if run == 0 else f"node:{superstep}.{run}:{node}"


def interrupt_step(superstep: int, run: int, node: str) -> str:
    return f"interrupt:{superstep}.{run}:{node}"


def call_step(superstep: int, index: int | str, tool: str) -> str:
    return f"call:{superstep}.{index}:{tool}"


# -- recording ----------------------------------------------------------------------------------


def dump_output(output: Any) -> dict:
    """A node's output as JSON: its state update (messages as LangChain's serialized form), or a
    Command's update and goto."""
    if isinstance(output, Command):
        goto = output.goto
        if not (isinstance(goto, str) or all(isinstance(g, str) for g in goto)):
            raise NotRecordable("a node's Command may go to node names only (no Send)")
        if output.graph is not None or output.resume is not None:
            raise NotRecordable("a node's Command may carry update and goto only")
        return {"command": {"update": _dump(output.update), "goto": goto}}
    return {"update": _dump(output)}


def _dump(value: Any) -> Any:
    dumped = dumpd(value)
    text = json.dumps(dumped)
    if '"not_implemented"' in text:
        raise NotRecordable(
            f"a node returned {type(value).__name__} holding values that are not JSON or "
            "LangChain messages"
        )
    return dumped


def load_output(recorded: dict) -> Any:
    if "command" in recorded:
        command = recorded["command"]
        return Command(update=_load(command["update"]), goto=command["goto"])
    return _load(recorded["update"])


def _load(value: Any) -> Any:
    with warnings.catch_warnings():  # langchain_core marks load() beta; it is its own format
        warnings.filterwarnings("ignore", message=".*`load` is in beta")
        return load(value, allowed_objects="messages")


def jsonable(value: Any) -> Any:
    """An interrupt's value as JSON (what is not JSON shown as text)."""
    return json.loads(json.dumps(value, default=str))


def tool_message(recorded: Any, call: dict) -> ToolMessage:
    # As LangChain's tools turn a result into a ToolMessage's content.
    content = recorded if isinstance(recorded, str) else json.dumps(recorded, ensure_ascii=False)
    return ToolMessage(content=content, name=call["name"], tool_call_id=call["id"])


def resume_value(interrupted: Any, decision: dict) -> Any:
    """What `interrupt()` returns once a person decided: the approved (maybe edited) value."""
    params = decision["params"]
    return params if isinstance(interrupted, dict) else params.get("value")


# -- the journal --------------------------------------------------------------------------------


class Journal:
    """Answers recorded operations from `results`; `live` names the node step to run for real
    (None: plan only)."""

    def __init__(self, results: dict[str, Any], live: str | None = None) -> None:
        self.results = results
        self.live = live
        self._live_superstep = _superstep_of(live) if live else None
        self.pending: list[PendingStep] = []
        self.done: Done | None = None
        self._lock = threading.Lock()
        self._live_started = threading.Event()

    def raise_pending(self, step: PendingStep):
        with self._lock:
            self.pending.append(step)
        if step.order[0] == self._live_superstep:
            # A node beside the live one in its superstep waits until the live one started:
            # LangGraph cancels the tasks not started when one fails, and waits for the others.
            self._live_started.wait(timeout=LIVE_START_WAIT)
        raise Pending(step)

    def finish_live(self, result: dict):
        self.done = Done(result)
        raise self.done

    def first_pending(self) -> PendingStep | None:
        return min(self.pending, key=lambda s: s.order) if self.pending else None

    # -- nodes ------------------------------------------------------------------------------

    def run_node(self, node: str, runnable: Any, state: Any, config: dict) -> Any:
        superstep = int((config.get("metadata") or {}).get("langgraph_step", 0))
        run, resumes = 0, []
        while True:
            name = node_step(superstep, run, node)
            recorded = self.results.get(name)
            if recorded is None:
                if self.live != name:
                    self.raise_pending(PendingStep(name, "node", order=(superstep, node, run)))
                return self._run_live(runnable, state, config, resumes)
            if "interrupt" not in recorded:
                return load_output(recorded)
            approval = interrupt_step(superstep, run, node)
            decision = self.results.get(approval)
            if decision is None:
                step = PendingStep(
                    approval, "interrupt", value=recorded["interrupt"], order=(superstep, node, run)
                )
                self.raise_pending(step)
            if not isinstance(decision, dict) or "params" not in decision:
                raise RuntimeError(f"{approval} was not approved, so the node cannot go on")
            resumes.append(resume_value(recorded["interrupt"], decision))
            run += 1

    def _run_live(self, runnable: Any, state: Any, config: dict, resumes: list) -> Any:
        from langgraph._internal._constants import CONFIG_KEY_SCRATCHPAD

        scratchpad = (config.get("configurable") or {}).get(CONFIG_KEY_SCRATCHPAD)
        if resumes and scratchpad is not None:
            # The node runs again from its start, as on LangGraph's own resume: its earlier
            # interrupts return the people's decisions, in order.
            scratchpad.resume[:] = resumes
        self._live_started.set()
        try:
            output = runnable.invoke(state, config)
        except GraphInterrupt as exc:
            (first, *_) = exc.args[0]
            self.finish_live({"interrupt": jsonable(first.value)})
        self.finish_live(dump_output(output))

    # -- tool calls -------------------------------------------------------------------------

    def tool_call(self, request: Any, execute: Any) -> Any:
        call = request.tool_call
        if request.tool is None:  # not a tool of this node: ToolNode's own error message
            return execute(request)
        superstep = int((request.runtime.config.get("metadata") or {}).get("langgraph_step", 0))
        index = _index(request.state, call)
        name = call_step(superstep, index, call["name"])
        if name in self.results:
            return tool_message(self.results[name], call)
        step = PendingStep(
            name,
            "call",
            tool=call["name"],
            arguments=dict(call.get("args") or {}),
            order=(superstep, "", str(index).rjust(12)),
        )
        return self.raise_pending(step)


def _superstep_of(step: str) -> int:
    """The superstep of a node step's name (`node:<s>:<node>` or `node:<s>.<r>:<node>`)."""
    return int(step.split(":", 2)[1].split(".")[0])


def _index(state: Any, call: dict) -> int | str:
    """The call's position among the tool calls of the message that asked for it (its id when
    that message is not in the state's `messages`)."""
    messages = state.get("messages") if isinstance(state, dict) else getattr(state, "messages", [])
    for message in reversed(messages or []):
        if isinstance(message, AIMessage):
            for index, asked in enumerate(message.tool_calls):
                if asked.get("id") == call.get("id"):
                    return index
    return str(call.get("id") or 0)


def intercept_tool_call(request: Any, execute: Any) -> Any:
    """ToolNode's `wrap_tool_call` under TaskPilots."""
    journal = CURRENT_JOURNAL.get()
    if journal is None:
        raise RuntimeError("a TaskPilots-wrapped graph ran outside TaskPilots")
    return journal.tool_call(request, execute)


def pass_signal(exc: BaseException) -> Pending | Done | None:
    """Our Pending or Done, also from inside exception groups and causes."""
    if isinstance(exc, Pending | Done):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        found = [pass_signal(inner) for inner in exc.exceptions]
        done = [f for f in found if isinstance(f, Done)]
        return done[0] if done else next((f for f in found if f is not None), None)
    cause = exc.__cause__ or exc.__context__
    return pass_signal(cause) if cause is not None and cause is not exc else None

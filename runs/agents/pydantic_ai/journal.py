"""The journal: a Pydantic AI capability that runs an agent's own loop against the run's
recorded steps.

Each pass runs `agent.run(...)` from the start with this capability added. Every model request
(`wrap_model_request`) and every tool call (`wrap_tool_execute`) is looked up among the recorded
step results by its step name: a recorded one is answered from the record (the model is not
asked again, the tool not called again). The first one not recorded ends the pass:

- planning (the workflow's `next`): `Pending` says which step comes next;
- live (a model step's own work): that one request is made for real, the model asked once,
  and `Done` carries the response back, to be recorded by the engine.

A tool call's own work needs no pass: the engine hands the call its parameters, and the tool
function is called with a RunContext built from the run's input (runs.agents.pydantic_ai.
workflow.PydanticAgentWorkflow.call_tool).

The agent code between these operations (instructions, validators, output processing) runs
again on each pass, as under Temporal or DBOS: it has to be deterministic.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic_ai import ModelRetry
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import ModelMessagesTypeAdapter, ModelResponse

from runs.tools import CallContext

# The TaskPilots CallContext of the tool call being made (idempotency key, run, step, attempt).
CURRENT_CALL: contextvars.ContextVar[CallContext | None] = contextvars.ContextVar(
    "taskpilots_pydantic_ai_call", default=None
)
RETRY_KEY = "__model_retry__"
# In a tool definition's metadata: the TaskPilots tool a call of it is (an MCP server's tool,
# runs.agents.pydantic_ai.mcp_servers), whatever name the agent's wrappers give it.
TARGET_KEY = "taskpilots_tool"


def model_step(number: int) -> str:
    return f"model:{number}"


def call_step(turn: int, index: int, tool: str) -> str:
    return f"call:{turn}.{index}:{tool}"


def dump_response(response: ModelResponse) -> list:
    return ModelMessagesTypeAdapter.dump_python([response], mode="json")


def load_response(recorded: Any) -> ModelResponse:
    messages = recorded.get("response") if isinstance(recorded, dict) else None
    (response,) = ModelMessagesTypeAdapter.validate_python(messages)
    if not isinstance(response, ModelResponse):  # pragma: no cover - only ours are recorded
        raise TypeError("the recorded model step holds no ModelResponse")
    return response


class Pending(Exception):  # noqa: N818 - a signal, not an error
    """The pass reached an operation that is not recorded yet."""

    def __init__(self, step: PendingStep) -> None:
        super().__init__(step.name)
        self.step = step


class Done(Exception):  # noqa: N818
    """The live operation of this pass is done; its result is to be recorded."""

    def __init__(self, result: Any) -> None:
        super().__init__("done")
        self.result = result


@dataclass(frozen=True)
class PendingStep:
    name: str
    kind: str  # "model" or "call"
    tool: str = ""
    arguments: dict = field(default_factory=dict)
    order: tuple[int, int] = (0, 0)
    # The TaskPilots tool named by the tool definition ("": the workflow's mapping decides).
    target: str = ""


@dataclass(init=False)
class Journal(AbstractCapability[Any]):
    """Answers recorded operations from `results`; `live` names the model request to make
    for real (None: plan only)."""

    def __init__(self, results: dict[str, Any], live: str | None = None) -> None:
        self.results = results
        self.live = live
        self.requests = 0
        self.last_response: ModelResponse | None = None
        self.pending: list[PendingStep] = []

    # -- model requests ---------------------------------------------------------------------

    async def wrap_model_request(self, ctx, *, request_context, handler) -> ModelResponse:
        self.requests += 1
        name = model_step(self.requests)
        if name in self.results:
            response = load_response(self.results[name])
        elif self.live == name:
            response = await handler(request_context)
            raise Done({"response": dump_response(response), "usage": _usage(response)})
        else:
            raise self._pending(PendingStep(name, "model", order=(self.requests, -1)))
        self.last_response = response
        return response

    # -- tool calls -------------------------------------------------------------------------

    async def prepare_tools(self, ctx, tool_defs):
        # Pydantic AI's own `requires_approval=True` would end the run with a deferred request;
        # under TaskPilots it is an approval rule instead (the `approve:` step before the call).
        return [replace(d, kind="function") if d.kind == "unapproved" else d for d in tool_defs]

    async def wrap_tool_execute(self, ctx, *, call, tool_def, args, handler) -> Any:
        name = self._name(call)
        target = str((getattr(tool_def, "metadata", None) or {}).get(TARGET_KEY) or "")
        if name in self.results:
            return _replayed(self.results[name], mcp=bool(target))
        index = self._index(call)
        step = PendingStep(
            name,
            "call",
            tool=call.tool_name,
            arguments=call.args_as_dict(),
            order=(self.requests, index),
            target=target,
        )
        raise self._pending(step)

    def _index(self, call) -> int:
        calls = [p for p in (self.last_response.parts if self.last_response else ()) if _is_call(p)]
        for index, part in enumerate(calls):
            if part.tool_call_id == call.tool_call_id:
                return index
        return len(calls)

    def _name(self, call) -> str:
        return call_step(self.requests, self._index(call), call.tool_name)

    def _pending(self, step: PendingStep) -> Pending:
        self.pending.append(step)
        return Pending(step)

    def first_pending(self) -> PendingStep | None:
        return min(self.pending, key=lambda s: s.order) if self.pending else None


def _is_call(part: Any) -> bool:
    return getattr(part, "part_kind", "") == "tool-call"


def _replayed(recorded: Any, *, mcp: bool = False) -> Any:
    if isinstance(recorded, dict) and RETRY_KEY in recorded:
        raise ModelRetry(recorded[RETRY_KEY])
    if mcp and isinstance(recorded, dict) and {"result", "server", "tool"} <= set(recorded):
        # An MCP tool's normalised response (runs.agents.mcp.normalise): the model gets its
        # value, as Pydantic AI's MCPToolset gives it (structured content, or the text).
        return recorded["result"]
    return recorded


def _usage(response: ModelResponse) -> dict:
    usage = response.usage
    return {
        "input_tokens": getattr(usage, "input_tokens", 0) or 0,
        "output_tokens": getattr(usage, "output_tokens", 0) or 0,
    }


def pass_signal(exc: BaseException) -> Pending | Done | None:
    """Our Pending or Done, also from inside exception groups (tools run in task groups)."""
    if isinstance(exc, Pending | Done):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        found = [pass_signal(inner) for inner in exc.exceptions]
        done = [f for f in found if isinstance(f, Done)]
        return done[0] if done else next((f for f in found if f is not None), None)
    cause = exc.__cause__ or exc.__context__
    return pass_signal(cause) if cause is not None and cause is not exc else None

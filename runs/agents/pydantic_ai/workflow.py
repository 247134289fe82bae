"""PydanticAgentWorkflow: a Pydantic AI `Agent` as one TaskPilots workflow.

Its `next` function runs the agent's own loop against the recorded steps (runs.agents.
pydantic_ai.journal) and returns the first operation not recorded yet as the next step:

- `model:<k>`: the agent's k-th model request, a compute step (handler MODEL_HANDLER) that asks
  the model once and records the ModelResponse (Pydantic AI's ModelMessagesTypeAdapter);
- `approve:<k>.<i>:<tool>`: when the tool's approval rule says so, a person's decision first
  (the decision's parameters are what the call then uses);
- `call:<k>.<i>:<tool>`: the i-th tool call of the k-th response, a `side_effect` or `read`
  step of the TaskPilots tool the function is registered as, or of the MCP server's tool
  `mcp.<id>.<tool>` (snapshot, intent, idempotency key, reconciliation, as for any other tool);
- `finish`, once the agent's run returns: the output as JSON.

The handler names are stored with the steps in the database: they never change.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError
from pydantic_ai import ModelRetry, RunContext
from pydantic_ai.agent import AbstractAgent
from pydantic_ai.models import Model, infer_model
from pydantic_ai.usage import RunUsage
from pydantic_core import to_jsonable_python

from runs.agents import run_sync
from runs.agents.pydantic_ai.journal import (
    CURRENT_CALL,
    RETRY_KEY,
    Done,
    Journal,
    Pending,
    PendingStep,
    pass_signal,
)
from runs.agents.steps import tool_call_step
from runs.models import FailureClass, StepKind
from runs.tools import CallContext, ToolError
from runs.workflows import END, Context, DynamicStep, Workflow, compute

START = "start"
FINISH = "finish"
FAILED = "agent_failed"
MODEL_HANDLER = "agents.pydantic_ai.model_request"
FINISH_HANDLER = "agents.pydantic_ai.finish"
REFUSAL_HANDLER = "agents.pydantic_ai.refuse_call"
FAILED_HANDLER = "agents.pydantic_ai.failed"
MAX_MESSAGE_CHARS = 20_000


class AgentSetupError(ValueError):
    """The agent cannot run under TaskPilots as configured (the message says what to change)."""


@dataclass(frozen=True)
class RunInputCallContext(CallContext):
    """A tool call's CallContext with the run's input (read in the engine's thread, before
    the call), from which the call's dependencies are built."""

    run_input: dict = field(default_factory=dict)


def _default_prompt(data: dict) -> str:
    return data["message"]


def _validate_message(data: dict) -> dict:
    message = data.get("message")
    if not isinstance(message, str) or not message.strip():
        raise ValueError("'message' must be a non-empty string")
    if len(message) > MAX_MESSAGE_CHARS:
        raise ValueError(f"'message' is longer than {MAX_MESSAGE_CHARS} characters")
    return data


@dataclass
class PydanticAgentWorkflow:
    """A Pydantic AI agent registered as a TaskPilots workflow (see runs.agents.pydantic_ai)."""

    name: str
    version: int
    agent: AbstractAgent
    # The agent's tool name → the TaskPilots tool a call of it is.
    tools: dict[str, str]
    # The agent's function tools (pydantic_ai.Tool) by name.
    functions: dict[str, Any] = field(default_factory=dict)
    # The agent's toolsets other than its own function tools, each MCP server in them swapped
    # for its TaskPilots tools (runs.agents.pydantic_ai.mcp_servers); None: the agent's own.
    toolsets: list | None = None
    deps: Callable[[dict], Any] | None = None
    prompt: Callable[[dict], str] | None = None
    validate_input: Callable[[dict], dict] | None = None
    stage: str = "agent"
    workflow: Workflow = field(init=False)

    def __post_init__(self) -> None:
        self.workflow = Workflow(
            self.name,
            self.version,
            [compute(START, self._start, stage=self.stage)],
            next=self._next,
            description=f"Pydantic AI agent {self.agent.name or self.name!r}",
            validate_input=self.validate_input
            or (_validate_message if self.prompt is None else None),
        )

    # -- one pass of the agent's loop -------------------------------------------------------

    def run_pass(self, run_input: dict, journal: Journal) -> tuple[Any, Pending | Done | None]:
        """Run the agent against the journal: (its run result, None) when it finishes, else
        (None, the Pending or Done that ended the pass)."""
        prompt = (self.prompt or _default_prompt)(run_input)
        deps = self.deps(run_input) if self.deps is not None else None

        async def go():
            if self.toolsets is None:
                return await self.agent.run(prompt, deps=deps, capabilities=[journal])
            with self.agent.override(toolsets=self.toolsets):
                return await self.agent.run(prompt, deps=deps, capabilities=[journal])

        try:
            return run_sync(go), None
        except Exception as exc:
            found = pass_signal(exc)
            if found is None:
                raise
            return None, found

    # -- the durable loop -------------------------------------------------------------------

    def _start(self, ctx: Context) -> dict:
        return {"prompt": (self.prompt or _default_prompt)(ctx.input)}

    def _next(self, ctx: Context, last: str) -> DynamicStep | None:
        if last in (FINISH, FAILED):
            return END
        journal = Journal(ctx.results)
        try:
            _, found = self.run_pass(ctx.input, journal)
        except Exception as exc:  # the agent itself failed (retries used up, a usage limit...)
            listing = find_tool_error(exc)
            if listing is not None:  # an MCP server's tools could not be listed: a person looks
                raise listing from None
            return self._compute(FAILED, FAILED_HANDLER, error=f"{type(exc).__name__}: {exc}")
        if found is None:
            return self._compute(FINISH, FINISH_HANDLER)
        pending = journal.first_pending() or getattr(found, "step", None)
        if pending is None:  # pragma: no cover - a Done without a live step
            raise AgentSetupError("a planning pass did an operation for real")
        if pending.kind == "model":
            return self._compute(pending.name, MODEL_HANDLER)
        return self._call_step(ctx, pending)

    def _compute(self, name: str, handler: str, **extra: Any) -> DynamicStep:
        return DynamicStep(
            name,
            StepKind.COMPUTE,
            stage=self.stage,
            extra={"handler": handler, "step": name, **extra},
        )

    def _call_step(self, ctx: Context, pending: PendingStep) -> DynamicStep:
        return tool_call_step(
            ctx,
            pending.name,
            pending.tool,
            pending.target or self.tools.get(pending.tool, ""),
            pending.arguments,
            stage=self.stage,
            who=f"The agent {self.agent.name or self.name!r}",
            refuse=lambda name, error: self._compute(name, REFUSAL_HANDLER, error=error),
        )

    # -- each step's own work ---------------------------------------------------------------

    def request_model(self, ctx: Context, step: str) -> dict:
        journal = Journal(ctx.results, live=step)
        try:
            _, found = self.run_pass(ctx.input, journal)
        except Exception as exc:
            listing = find_tool_error(exc)
            if listing is not None:  # an MCP server's tools could not be listed
                raise listing from None
            raise ToolError(
                _model_failure_class(exc), f"model request failed: {type(exc).__name__}: {exc}"
            ) from exc
        return _done(found, step)

    def invoker(self, tool_name: str) -> Callable[[dict, CallContext], Any]:
        """The python tool function of the agent's tool `tool_name`: the tool function called
        once, with the engine's parameters and a RunContext built from the run's input."""

        def call(params: dict, ctx: CallContext) -> Any:
            function = self.functions[tool_name]
            run_input = ctx.run_input if isinstance(ctx, RunInputCallContext) else {}
            try:
                args = function.function_schema.validator.validate_python(params)
            except ValidationError as exc:  # nothing was sent
                raise ToolError(FailureClass.INVALID_INPUT, f"{tool_name}: {exc}") from None
            run_context = RunContext(
                deps=self.deps(run_input) if self.deps is not None else None,
                model=self.model(),
                usage=RunUsage(),
                prompt=(self.prompt or _default_prompt)(run_input) if run_input else None,
                tool_name=tool_name,
                tool_call_id=ctx.idempotency_key or f"{ctx.run_id}:{ctx.step}",
                agent=self.agent,
            )

            async def invoke():
                token = CURRENT_CALL.set(ctx)
                try:
                    return await function.function_schema.call(args, run_context)
                finally:
                    CURRENT_CALL.reset(token)

            try:
                value = run_sync(invoke)
            except ModelRetry as exc:  # told to the model, as Pydantic AI does
                return {RETRY_KEY: str(exc.message)}
            return to_jsonable_python(value, fallback=str)

        return call

    def model(self) -> Any:
        model = self.agent.model
        if model is None or isinstance(model, Model):
            return model
        try:
            return infer_model(model)
        except Exception:  # a tool rarely reads ctx.model; a model that cannot be built here
            return None

    def finish(self, ctx: Context) -> dict:
        journal = Journal(ctx.results)
        result, found = self.run_pass(ctx.input, journal)
        if found is not None:
            raise ToolError(
                FailureClass.INVALID_INPUT,
                f"the agent did not finish from its recorded steps (it wants {found}): is the "
                "code between its model requests and tool calls deterministic?",
            )
        usage = {"input_tokens": 0, "output_tokens": 0}
        for number in range(1, journal.requests + 1):
            recorded = (ctx.results.get(f"model:{number}") or {}).get("usage") or {}
            for key in usage:
                usage[key] += int(recorded.get(key) or 0)
        return {
            "final_output": to_jsonable_python(result.output, fallback=str),
            "model_requests": journal.requests,
            "usage": usage,
        }


def find_tool_error(exc: BaseException) -> ToolError | None:
    """The ToolError that ended a pass (listing an MCP server's tools failed), also from inside
    exception groups and causes; None when there is none."""
    if isinstance(exc, ToolError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        found = (find_tool_error(inner) for inner in exc.exceptions)
        return next((f for f in found if f is not None), None)
    cause = exc.__cause__ or exc.__context__
    return find_tool_error(cause) if cause is not None and cause is not exc else None


def _done(found: Pending | Done | None, step: str) -> Any:
    if isinstance(found, Done):
        return found.result
    raise ToolError(
        FailureClass.INVALID_INPUT,
        f"replaying the agent did not reach step {step!r} (it reached {found or 'the end'}): "
        "is the code between its model requests and tool calls deterministic?",
    )


def _model_failure_class(exc: Exception) -> str:
    # A model request is compute: nothing outside changed, so most failures may be retried.
    from pydantic_ai.exceptions import ModelHTTPError, UnexpectedModelBehavior

    if isinstance(exc, ModelHTTPError):
        status = exc.status_code
        if status in (401, 403):
            return FailureClass.PERMISSION
        if status == 404:
            return FailureClass.API_DRIFT
        if status == 429 or status >= 500:
            return FailureClass.TRANSIENT
        return FailureClass.INVALID_INPUT
    if isinstance(exc, UnexpectedModelBehavior):
        return FailureClass.INVALID_INPUT
    if isinstance(exc, ConnectionError | TimeoutError):
        return FailureClass.OUTAGE
    return FailureClass.INVALID_INPUT

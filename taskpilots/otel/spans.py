"""The spans of a run, made through the engine's hook points (runs/hooks.py) and the people's
side's decisions (a signal of approvals.HumanDecision): docs/deploy.md, "Traces".

One trace per run, whose ids every process derives from the run's id (runs/traceids.py):

- `run <workflow>`: the run's own span, the root of its trace, from its creation to its end;
  exported once the run's last event commits (succeeded, failed, cancelled, compensated), by
  the process that wrote it;
- `step <name>`: one execution of a step (an attempt, or a step executed ahead of its claim),
  a child of the run's span, linked to the span that was current (the Celery task's);
- `tool <name>`: a call to a tool — the call itself, a lookup by key, a verification read — a
  child of the step's span (of the run's, for a lookup outside any step: the consistency
  check);
- `chat <model>`: a model request of an agent's turn, a child of the step's span;
- `decision <verb>`: a person's decision (approve, reject, take over, …), a child of the run's
  span, linked to the request that made it.

Attributes are the run's, the step's, the tool's and the outcome's under `taskpilots.`, a model
request's under the GenAI semantic conventions (`gen_ai.`) too. No parameters, results or model
text leave the process; an error's message does, cut to 200 characters.
"""

from __future__ import annotations

import contextvars
import dataclasses
import datetime as dt
import threading
from typing import Any

from django.db import transaction
from django.db.models.signals import post_save
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.propagate import inject
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.status import Status, StatusCode

from approvals.models import HumanDecision
from runs import hooks, traceids
from runs.engine.liveness import ClaimLost
from runs.engine.outcomes import (
    AskApproval,
    Failed,
    HeldByPause,
    Park,
    Recheck,
    Succeeded,
    UnknownOutcome,
)
from runs.models import Run
from runs.tools import LookupResult, NotSent, ToolError, ToolResult
from runs.verbs import Verb

RUN_ID = "taskpilots.run.id"
WORKFLOW = "taskpilots.workflow.name"
WORKFLOW_VERSION = "taskpilots.workflow.version"
RUN_STATUS = "taskpilots.run.status"
ACTOR = "taskpilots.actor"
STEP_NAME = "taskpilots.step.name"
STEP_KIND = "taskpilots.step.kind"
STEP_ATTEMPT = "taskpilots.step.attempt"
STEP_ITERATION = "taskpilots.step.iteration"
STEP_STAGE = "taskpilots.step.stage"
STEP_AHEAD = "taskpilots.step.ahead"
STEP_RECLAIMED = "taskpilots.step.reclaimed"
WORKER = "taskpilots.worker"
TOOL = "taskpilots.tool.name"
TOOL_OPERATION = "taskpilots.tool.operation"
TOOL_SIDE_EFFECT = "taskpilots.tool.side_effect"
IDEMPOTENCY_KEY = "taskpilots.idempotency_key"
EXTERNAL_ID = "taskpilots.external_id"
OUTCOME = "taskpilots.outcome"
FAILURE_CLASS = "taskpilots.failure_class"
DECISION_VERB = "taskpilots.decision.verb"
DECISION_ACTOR = "taskpilots.decision.actor"
DECISION_ID = "taskpilots.decision.id"
APPROVAL_ID = "taskpilots.approval.id"
BULK_ACTION_ID = "taskpilots.bulk_action.id"
ERROR_TYPE = "error.type"

# What a tool span and a model request copy from the step that makes them.
_FROM_STEP = (RUN_ID, WORKFLOW, STEP_NAME, STEP_KIND, STEP_ATTEMPT)
# The events that end a run, and the status each leaves.
_RUN_ENDS = {
    Verb.RUN_SUCCEEDED: "succeeded",
    Verb.RUN_FAILED: "failed",
    Verb.RUN_CANCELLED: "cancelled",
    Verb.RUN_COMPENSATED: "compensated",
}
_ERROR_CHARS = 200

# The attributes of the step whose span is current in this context (tool spans copy them).
_STEP: contextvars.ContextVar[dict | None] = contextvars.ContextVar("taskpilots_step", default=None)
# Ids a span about to start must have (the run's own span: runs/traceids.py); see RunIds.
_FORCED_IDS: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar(
    "taskpilots_forced_ids", default=None
)


class RunIds(RandomIdGenerator):
    """Random ids, but the ids of the run's own span when one is being started: a span's ids
    cannot be chosen through the API, only by the provider's id generator."""

    def generate_trace_id(self) -> int:
        forced = _FORCED_IDS.get()
        return forced[0] if forced else super().generate_trace_id()

    def generate_span_id(self) -> int:
        forced = _FORCED_IDS.get()
        return forced[1] if forced else super().generate_span_id()


class _Recent:
    """A map of the runs this process traced lately, bounded (the oldest entry goes first),
    shared by the worker's threads."""

    LIMIT = 4096

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, Any] = {}

    def get(self, key: str) -> Any:
        return self._entries.get(key)

    def put(self, key: str, value: Any) -> None:
        with self._lock:
            self._entries[key] = value
            if len(self._entries) > self.LIMIT:
                del self._entries[next(iter(self._entries))]

    def pop(self, key: str) -> Any:
        with self._lock:
            return self._entries.pop(key, None)


@dataclasses.dataclass
class _Open:
    """A span started by Spans.start, for Spans.end: the context it made current, the step
    attributes it set (a step's), and the claim whose outcome it waits for (a step's)."""

    span: Any
    attached: object
    step_token: contextvars.Token | None = None
    claim: Any = None


def _ns(moment: dt.datetime | str) -> int:
    """An aware time (or its ISO 8601 text) as nanoseconds since the epoch, exactly."""
    if isinstance(moment, str):
        moment = dt.datetime.fromisoformat(moment)
    return (moment - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1) * 1000


def _failed(span, failure: str, message: str) -> None:
    span.set_attributes({OUTCOME: "failed", FAILURE_CLASS: failure, ERROR_TYPE: failure})
    span.set_status(Status(StatusCode.ERROR, message[:_ERROR_CHARS]))


def _raised(span, error: BaseException) -> None:
    """The work raised something that is not an outcome: said on the span, raised on."""
    if isinstance(error, ClaimLost):  # the worker stood down: nothing was recorded or sent
        span.set_attribute(OUTCOME, "claim_lost")
        return
    if isinstance(error, ToolError):
        _failed(span, error.failure_class, error.message)
        return
    span.record_exception(error)
    span.set_attributes({OUTCOME: "error", ERROR_TYPE: type(error).__name__})
    span.set_status(Status(StatusCode.ERROR, str(error)[:_ERROR_CHARS]))


def outcome_of(result: Any) -> tuple[str, str, str]:
    """(outcome, failure class, error) of a step's Outcome, as its span says them."""
    if isinstance(result, Succeeded):
        if result.degraded is not None:
            return "degraded", result.degraded[0], ""
        return "succeeded", "", ""
    if isinstance(result, Failed):
        return "failed", result.failure_class, result.error
    if isinstance(result, UnknownOutcome):  # a person decides
        return "unknown_outcome", "unknown_outcome", result.error
    if isinstance(result, Recheck):  # the system is asked by key again later
        return "recheck", "unknown_outcome", ""
    if isinstance(result, Park):
        return "waiting", "", ""
    if isinstance(result, AskApproval):
        return "approval_requested", "", ""
    if isinstance(result, HeldByPause):
        return "held_by_pause", "", ""
    return "failed", "", ""  # None: a compute step that failed ahead of its claim


class Spans:
    """The tracer registered on runs.hooks, the tool wrapper, the observer of committed events
    and the receiver of decisions, all making spans with one provider's tracer."""

    def __init__(self, provider: TracerProvider):
        self.provider = provider
        self.tracer = provider.get_tracer("taskpilots")
        # Per run: its own span's context (ids and the sampler's decision: a digest and a
        # sampler call), and (workflow, version, created) from its steps, for its span when it
        # ends in this process (the run row is read otherwise). Per tool: its wrapped copy.
        self._parents = _Recent()
        self._runs = _Recent()
        self._tools: dict[str, tuple[Any, Any]] = {}

    # -- the run's trace -------------------------------------------------------------------

    def run_context(self, run_id) -> Context:
        """A context whose current span is the run's own (remote: exported when the run ends),
        sampled as the provider's sampler decides for the run's trace id with no parent — the
        same decision in every process."""
        key = str(run_id)
        parent = self._parents.get(key)
        if parent is None:
            trace_id, span_id = traceids.ids(run_id)
            decision = self.provider.sampler.should_sample(Context(), trace_id, "run")
            flags = TraceFlags.SAMPLED if decision.decision.is_sampled() else TraceFlags.DEFAULT
            parent = SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(flags))
            self._parents.put(key, parent)
        return trace.set_span_in_context(NonRecordingSpan(parent))

    def committed(self, run_id: str, events: list[dict]) -> None:
        """Observer of committed timeline events: the run's own span once it has ended."""
        for event in events:
            status = _RUN_ENDS.get(event.get("verb"))
            if status is not None:
                self.run_ended(run_id, status, event)

    def run_ended(self, run_id: str, status: str, event: dict) -> None:
        known = self._runs.pop(str(run_id))
        self._parents.pop(str(run_id))
        if known is None:  # its steps ran elsewhere (or long ago): one read
            known = (
                Run.objects.filter(pk=run_id)
                .values_list("workflow", "workflow_version", "created_at")
                .first()
            )
        if known is None:
            return
        workflow, version, created_at = known
        attributes = {
            RUN_ID: str(run_id),
            WORKFLOW: workflow,
            WORKFLOW_VERSION: version,
            RUN_STATUS: status,
            ACTOR: str(event.get("actor") or "system"),
        }
        forced = _FORCED_IDS.set(traceids.ids(run_id))
        try:
            span = self.tracer.start_span(
                f"run {workflow}", Context(), attributes=attributes, start_time=_ns(created_at)
            )
        finally:
            _FORCED_IDS.reset(forced)
        if status == "failed":
            span.set_status(Status(StatusCode.ERROR, "the run failed"))
        span.end(end_time=_ns(event["at"]))

    # -- steps and model requests (runs.hooks.traced) ---------------------------------------

    def start(self, what: str, subject: Any):
        if what == "step":
            return self._start_step(subject)
        if what == "model_request":
            return self._start_model_request(subject)
        return None

    def end(self, token: _Open | None, result: Any, error: BaseException | None) -> None:
        if token is None:
            return
        try:
            if error is not None:
                _raised(token.span, error)
            elif token.claim is not None:
                _step_result(token.span, token.claim, result)
            else:
                _model_result(token.span, result)
        finally:
            if token.step_token is not None:
                _STEP.reset(token.step_token)
            otel_context.detach(token.attached)
            token.span.end()

    def _start_step(self, claim) -> _Open:
        run, step = claim.run, claim.step
        attributes = {
            RUN_ID: str(run.pk),
            WORKFLOW: run.workflow,
            WORKFLOW_VERSION: run.workflow_version,
            STEP_NAME: step.name,
            STEP_KIND: str(step.kind),
            STEP_ATTEMPT: step.attempts,
            STEP_ITERATION: step.iteration,
            WORKER: claim.worker,
        }
        if step.stage:
            attributes[STEP_STAGE] = step.stage
        if step.tool:
            attributes[TOOL] = step.tool
        if step.id is None:  # executed ahead of its claim (runs.engine.inline): no row yet
            attributes[STEP_AHEAD] = True
        if claim.reclaimed:
            attributes[STEP_RECLAIMED] = True
        current = trace.get_current_span().get_span_context()
        links = [Link(current)] if current.is_valid else None
        span = self.tracer.start_span(
            f"step {step.name}", self.run_context(run.pk), attributes=attributes, links=links
        )
        if run.created_at is not None:
            self._runs.put(attributes[RUN_ID], (run.workflow, run.workflow_version, run.created_at))
        attached = otel_context.attach(trace.set_span_in_context(span))
        return _Open(span, attached, _STEP.set(attributes), claim)

    def _start_model_request(self, request: dict) -> _Open:
        step = _STEP.get() or {}
        attributes = {name: step[name] for name in _FROM_STEP if name in step}
        attributes["gen_ai.operation.name"] = "chat"
        attributes["gen_ai.agent.name"] = str(request.get("agent") or "")
        model = str(request.get("model") or "")
        if model:
            attributes["gen_ai.request.model"] = model
        name = f"chat {model}" if model else "chat"
        span = self.tracer.start_span(name, kind=SpanKind.CLIENT, attributes=attributes)
        return _Open(span, otel_context.attach(trace.set_span_in_context(span)))

    # -- tool calls (runs.hooks.wrap_tools) -------------------------------------------------

    def wrap_tool(self, tool):
        """The tool with each call to the outside world in a span (made once per tool as the
        registry hands it out: a new copy when the registry's changes)."""
        known = self._tools.get(tool.name)
        if known is not None and known[0] is tool:
            return known[1]
        wrapped = self._wrapped(tool)
        self._tools[tool.name] = (tool, wrapped)
        return wrapped

    def _wrapped(self, tool):
        changes: dict[str, Any] = {"invoke": self._call(tool, tool.invoke, "invoke")}
        if tool.lookup is not None:
            changes["lookup"] = self._call(tool, tool.lookup, "lookup")
        verification = tool.verification
        if verification is not None:
            reads = {"read": self._call(tool, verification.read, "verify")}
            if verification.baseline is not None:
                reads["baseline"] = self._call(tool, verification.baseline, "baseline")
            changes["verification"] = dataclasses.replace(verification, **reads)
        return dataclasses.replace(tool, **changes)

    def _call(self, tool, fn, operation: str):
        def traced(first, ctx):
            attributes, parent = self._call_frame(ctx)
            attributes[TOOL] = tool.name
            attributes[TOOL_OPERATION] = operation
            attributes[TOOL_SIDE_EFFECT] = tool.side_effect
            if ctx.idempotency_key:
                attributes[IDEMPOTENCY_KEY] = ctx.idempotency_key
            with self.tracer.start_as_current_span(
                f"tool {tool.name}",
                parent,
                kind=SpanKind.CLIENT,
                attributes=attributes,
                record_exception=False,
                set_status_on_exception=False,
            ) as span:
                try:
                    result = fn(first, ctx)
                except NotSent:
                    span.set_attribute(OUTCOME, "not_sent")
                    raise
                except BaseException as exc:
                    _raised(span, exc)
                    raise
                _call_result(span, result)
                return result

        return traced

    def _call_frame(self, ctx) -> tuple[dict, Context | None]:
        """The attributes a tool span takes from its step, and its parent: the current context
        inside the run's step, the run's span otherwise."""
        step = _STEP.get()
        if step is not None and step[RUN_ID] == ctx.run_id:
            return {name: step[name] for name in _FROM_STEP}, None
        attributes = {RUN_ID: ctx.run_id, STEP_NAME: ctx.step, STEP_ATTEMPT: ctx.attempt}
        return attributes, self.run_context(ctx.run_id)

    # -- people's decisions (post_save of approvals.HumanDecision) ---------------------------

    def decision_saved(self, sender, instance: HumanDecision, created: bool, **kwargs) -> None:
        if not created:
            return
        current = trace.get_current_span().get_span_context()
        link = [Link(current)] if current.is_valid else None
        transaction.on_commit(lambda: self.decided(instance, link))

    def decided(self, decision: HumanDecision, links=None) -> None:
        attributes = {
            RUN_ID: str(decision.run_id),
            DECISION_ID: decision.pk,
            DECISION_VERB: decision.verb,
            DECISION_ACTOR: f"user:{decision.user.get_username()}",
        }
        if decision.step_id:
            attributes[STEP_NAME] = decision.step.name
        if decision.approval_id:
            attributes[APPROVAL_ID] = decision.approval_id
        if decision.bulk_action_id:
            attributes[BULK_ACTION_ID] = decision.bulk_action_id
        span = self.tracer.start_span(
            f"decision {decision.verb}",
            self.run_context(decision.run_id),
            attributes=attributes,
            links=links,
            start_time=_ns(decision.created_at),
        )
        span.end()


def _step_result(span, claim, result) -> None:
    outcome, failure, error = outcome_of(result)
    key = claim.step.idempotency_key or ""
    if not key and isinstance(result, Succeeded) and result.committed is not None:
        key = result.committed[0].idempotency_key
    if key:
        span.set_attribute(IDEMPOTENCY_KEY, key)
    if failure:
        span.set_attribute(FAILURE_CLASS, failure)
    if outcome in ("failed", "unknown_outcome"):
        if failure:
            span.set_attribute(ERROR_TYPE, failure)
        span.set_status(Status(StatusCode.ERROR, error[:_ERROR_CHARS]))
    span.set_attribute(OUTCOME, outcome)


def _model_result(span, response) -> None:
    span.set_attribute(OUTCOME, "succeeded")
    usage = getattr(response, "usage", None)
    for name, value in (
        ("gen_ai.usage.input_tokens", getattr(usage, "input_tokens", None)),
        ("gen_ai.usage.output_tokens", getattr(usage, "output_tokens", None)),
        ("gen_ai.response.id", getattr(response, "response_id", None)),
    ):
        if isinstance(value, int | str) and value != "":
            span.set_attribute(name, value)


def _call_result(span, result) -> None:
    external_id = ""
    if isinstance(result, LookupResult):
        span.set_attribute(OUTCOME, "found" if result.found else "not_found")
        external_id = result.external_id if result.found else ""
    else:
        span.set_attribute(OUTCOME, "succeeded")
        if isinstance(result, ToolResult):
            external_id = result.external_id
    if external_id:
        span.set_attribute(EXTERNAL_ID, str(external_id))


def register(provider: TracerProvider) -> Spans:
    """Make this process's runs traced with `provider`: the engine's hook points and the
    decisions' signal. `unregister` undoes it (tests)."""
    spans = Spans(provider)
    hooks.trace(spans)
    hooks.wrap_tools(spans.wrap_tool)
    hooks.observe_events(spans.committed)
    hooks.propagate(inject)
    post_save.connect(spans.decision_saved, sender=HumanDecision, weak=False, dispatch_uid=spans)
    return spans


def unregister(spans: Spans) -> None:
    for registered, item in (
        (hooks.tracers, spans),
        (hooks.tool_wrappers, spans.wrap_tool),
        (hooks.event_observers, spans.committed),
        (hooks.propagators, inject),
    ):
        if item in registered:
            registered.remove(item)
    post_save.disconnect(sender=HumanDecision, dispatch_uid=spans)

"""The engine: flows that span several models — advancing a run, the side-effect protocol,
failure routing, waits, human decisions, compensation and the sweeper.

Invariants (docs/architecture.md): PostgreSQL is the source of truth and Celery messages are
hints; no side effect is called without a committed Snapshot and an `intended` SideEffect row;
completed steps never run again; an unknown outcome is reconciled by key or handed to a person;
every state change writes its timeline event in the same transaction.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from approvals.models import ApprovalRequest, EscalationRule, ToolPause
from runs import tools as tool_registry
from runs import workflows as workflow_registry
from runs.models import (
    FailureClass,
    InboundEvent,
    Run,
    SideEffect,
    Snapshot,
    Step,
    StepKind,
    TimelineEvent,
    TransitionError,
    Wait,
    canonical_json,
    digest,
    to_json_value,
)
from runs.tools import CallContext, LookupResult, Tool, ToolError, ToolResult
from runs.workflows import Context, DynamicStep, StepDef, Workflow

logger = logging.getLogger("taskpilots.engine")

MAX_PARAMS_BYTES = 256 * 1024
SUMMARY_CHARS = 300

WORKER_ID = f"{socket.gethostname()}:{os.getpid()}"

# Fault injection for drills: tools after whose successful call this process dies before it can
# record the receipt ("side effect done, local record failed"). Off unless the variable is set.
CRASH_AFTER_CALL = frozenset(
    name.strip()
    for name in os.environ.get("TASKPILOTS_CHAOS_CRASH_AFTER_CALL", "").split(",")
    if name.strip()
)


def _worker_id() -> str:
    # Re-read after a fork (prefork pool children have their own pid).
    global WORKER_ID
    pid = os.getpid()
    if not WORKER_ID.endswith(f":{pid}"):
        WORKER_ID = f"{socket.gethostname()}:{pid}"
    return WORKER_ID


def _conf(name: str):
    return settings.TASKPILOTS[name]


# --------------------------------------------------------------------------------------------
# Dispatch: Celery messages are only hints that a run has work.


def enqueue(run_id, *, countdown: float | None = None, expires: float | None = None) -> None:
    """Ask a worker to advance the run once the current transaction commits.

    `expires` bounds hints that are repeated anyway (the sweeper's): when no worker consumes for
    a while, stale copies are dropped on receipt instead of each costing a database round trip.
    """
    if _conf("DISPATCH") != "celery":
        return
    from runs.tasks import advance_run

    def send():
        try:
            options: dict = {"countdown": countdown} if countdown else {}
            if expires:
                options["expires"] = expires
            advance_run.apply_async((str(run_id),), **options)
        except Exception:  # the broker being down only delays the run: the sweeper re-derives it
            logger.warning("could not enqueue run %s; the sweeper will pick it up", run_id)

    transaction.on_commit(send)


# --------------------------------------------------------------------------------------------
# Starting runs


class StartError(ValueError):
    """The run cannot start: unknown workflow, invalid input, or a business key conflict."""


class BusinessKeyConflict(StartError):
    """The business key already started a run for another request: `why` is "workflow" (another
    workflow or version) or "input" (the same workflow with other input)."""

    def __init__(self, run: Run, why: str = "input"):
        self.run = run
        self.why = why
        what = "another workflow" if why == "workflow" else "other input"
        super().__init__(
            f"business key {run.business_key!r} already started run {run.pk} with {what}"
        )


def start_run(
    workflow: str,
    input: dict,
    *,
    version: int | None = None,
    business_key: str | None = None,
    principal: str = "system",
    scopes: list[str] | None = None,
    session_context_ref: str = "",
    actor: str = "system",
) -> tuple[Run, bool]:
    """Create a run (or return the existing one for the same business key and input).

    Returns (run, created). A business key names one request to one workflow: the same key
    with another workflow (or another explicit version), or with different input, raises
    BusinessKeyConflict; nothing is written for a rejected start.
    """
    try:
        definition = workflow_registry.get(workflow, version)
    except workflow_registry.UnknownWorkflow as exc:
        raise StartError(str(exc)) from None
    if not isinstance(input, dict):
        raise StartError("input must be a JSON object")
    if definition.validate_input is not None:
        try:
            input = definition.validate_input(input)
        except (ValueError, TypeError, KeyError) as exc:
            raise StartError(f"invalid input for {workflow}: {exc}") from None
    input = to_json_value(input)
    input_digest = digest(input)
    if business_key is not None:
        existing = Run.objects.filter(business_key=business_key).first()
        if existing is not None:
            return _same_start(existing, definition, version, input_digest)
    try:
        with transaction.atomic():
            run = Run.objects.create(
                workflow=definition.name,
                workflow_version=definition.version,
                input=input,
                input_digest=input_digest,
                business_key=business_key,
                principal=principal,
                scopes=list(scopes if scopes is not None else definition.scopes),
                session_context_ref=session_context_ref,
            )
            run.record(
                "run.created",
                {
                    "workflow": run.workflow,
                    "version": run.workflow_version,
                    "business_key": business_key,
                    "input_digest": input_digest,
                    "principal": principal,
                },
                actor=actor,
            )
            enqueue(run.pk)
    except IntegrityError:
        # Two starts with the same business key raced; the loser returns the winner's run.
        existing = Run.objects.filter(business_key=business_key).first()
        if business_key is None or existing is None:
            raise
        return _same_start(existing, definition, version, input_digest)
    return run, True


def _same_start(
    existing: Run, definition: Workflow, version: int | None, input_digest: str
) -> tuple[Run, bool]:
    # Without an explicit version a retry may resolve to a newer one: still the same request.
    if existing.workflow != definition.name or (
        version is not None and existing.workflow_version != version
    ):
        raise BusinessKeyConflict(existing, why="workflow")
    if existing.input_digest != input_digest:
        raise BusinessKeyConflict(existing)
    return existing, False


# --------------------------------------------------------------------------------------------
# Context


def build_context(run: Run, steps: list[Step] | None = None) -> Context:
    if steps is None:
        steps = list(
            run.steps.order_by("position").only(
                "name", "iteration", "status", "result", "kind", "tool", "position"
            )
        )
    results: dict[str, Any] = {}
    history = []
    for step in steps:
        if step.status in Step.DONE and step.status != Step.Status.SKIPPED:
            results[step.name] = step.result
        history.append(
            {
                "name": step.name,
                "iteration": step.iteration,
                "status": step.status,
                "kind": step.kind,
                "tool": step.tool,
            }
        )
    return Context(
        run_id=str(run.pk),
        workflow=run.workflow,
        version=run.workflow_version,
        input=run.input,
        results=results,
        principal=run.principal,
        scopes=tuple(run.scopes or ()),
        history=history,
    )


def _summary(results: dict[str, Any]) -> dict[str, str]:
    out = {}
    for name, value in results.items():
        text = canonical_json(value)
        out[name] = text if len(text) <= SUMMARY_CHARS else text[: SUMMARY_CHARS - 1] + "…"
    return out


# --------------------------------------------------------------------------------------------
# Claiming


@dataclass
class Claim:
    run: Run
    step: Step
    workflow: Workflow
    definition: StepDef
    ctx: Context
    worker: str
    reclaimed: bool = False


def _lease_until(now: datetime) -> datetime:
    return now + timedelta(seconds=_conf("LEASE_SECONDS"))


def claim_next(run_id, *, worker: str | None = None, now: datetime | None = None) -> Claim | None:
    """Claim the run's next step, or return None when there is nothing to do right now.

    1. Lock the run row (short transaction; serialises claimers of one run).
    2. Leave runs that are not runnable (waiting, parked, finished) alone.
    3. Pick the first unfinished step; when none is left, decide the next one from the workflow
       (recorded as a new row) or finish the run.
    4. Claim it with a compare-and-set to `running` and a lease; a running step whose lease
       expired is taken back (its worker died).
    """
    worker = worker or _worker_id()
    now = now or timezone.now()
    with transaction.atomic():
        run = Run.objects.select_for_update().filter(pk=run_id).first()
        if run is None or run.status not in Run.RUNNABLE:
            return None
        try:
            workflow = workflow_registry.get(run.workflow, run.workflow_version)
        except workflow_registry.UnknownWorkflow:
            run.ask_human(
                f"Workflow {run.workflow} version {run.workflow_version} is no longer "
                "registered in this deployment; the run cannot resume automatically. Deploy "
                "that version again, or finish the run by hand.",
                queue="ops",
            )
            return None
        steps = list(run.steps.order_by("position"))
        current = next((s for s in steps if s.status in Step.UNFINISHED), None)
        if run.status == Run.Status.PENDING:
            run.start()
        ctx = build_context(run, steps)
        if current is None:
            return _open_next_step(run, workflow, steps, ctx, worker, now)
        return _claim_existing(run, workflow, current, ctx, worker, now)


def _open_next_step(run, workflow, steps, ctx, worker, now) -> Claim | None:
    if run.status == Run.Status.COMPENSATING:
        _finish_compensation(run)
        return None
    if not steps:
        choice: StepDef | DynamicStep | None = workflow.steps[0]
    else:
        last = steps[-1]
        try:
            choice = workflow.following(ctx, last.name, last.spec)
        except Exception as exc:  # a next() function failed: a person looks at the data
            run.ask_human(
                f"Choosing the step after {last.name!r} failed: {type(exc).__name__}: {exc}",
                queue="ops",
                failure_class=FailureClass.INVALID_INPUT,
            )
            return None
    if choice is None:
        run.succeed(ctx.results.get(steps[-1].name) if steps else None)
        return None
    spec = choice.spec()
    name = choice.name
    if isinstance(choice, DynamicStep) and steps:
        spec.setdefault(
            "after",
            steps[-1].spec.get("after", "") if steps[-1].spec.get("dynamic") else steps[-1].name,
        )
    definition = workflow.definition_of(name, spec) if spec else choice
    iteration = sum(1 for s in steps if s.name == name)
    step = Step.objects.create(
        run=run,
        name=name,
        iteration=iteration,
        position=(steps[-1].position + 1) if steps else 0,
        kind=definition.kind,
        stage=definition.stage,
        tool=definition.tool,
        spec=to_json_value(spec),
        status=Step.Status.RUNNING,
        attempts=1,
        lease_owner=worker,
        lease_expires_at=_lease_until(now),
        started_at=now,
    )
    updates = {}
    if definition.stage and run.stage != definition.stage:
        updates["stage"] = definition.stage
    if updates:
        Run.objects.filter(pk=run.pk).update(**updates)
        run.stage = definition.stage
    TimelineEvent.append(
        run.pk,
        "step.started",
        {
            "step": name,
            "iteration": iteration,
            "kind": step.kind,
            "attempt": 1,
            "stage": step.stage,
        },
    )
    ctx.iteration = iteration
    ctx.spec = step.spec
    return Claim(run, step, workflow, definition, ctx, worker)


def _claim_existing(run, workflow, step, ctx, worker, now) -> Claim | None:
    S = Step.Status
    reclaimed = False
    if step.status == S.RUNNING:
        if step.lease_expires_at and step.lease_expires_at > now:
            return None  # someone is on it
        reclaimed = True
    elif step.status == S.RETRY_SCHEDULED:
        if step.next_attempt_at and step.next_attempt_at > now:
            return None
    elif step.status == S.WAITING:
        # A waiting step under a runnable run can only be a tool-recovery wait whose probe the
        # sweeper found due (event, timer and approval waits settle the step before resuming
        # the run). The sweeper's decision stands, whatever this host's clock says.
        if not Wait.objects.filter(
            step=step, kind=Wait.Kind.TOOL_RECOVERY, status=Wait.Status.PENDING
        ).exists():
            run.ask_human(f"Step {step.name!r} is waiting with nothing to wait for.", queue="ops")
            return None
    elif step.status != S.PENDING:
        # needs_human / unknown_outcome under a runnable run: park the run for a person.
        run.ask_human(
            f"Step {step.name!r} is {step.get_status_display().lower()} and needs a person.",
            queue="support",
            failure_class=step.error_class,
        )
        return None
    try:
        definition = workflow.definition_of(step.name, step.spec)
    except workflow_registry.WorkflowError as exc:
        run.ask_human(str(exc), queue="ops")
        return None
    attempt = step.attempts + 1
    fields = {
        "attempts": attempt,
        "lease_owner": worker,
        "lease_expires_at": _lease_until(now),
        "next_attempt_at": None,
        "started_at": step.started_at or now,
    }
    data = {"attempt": attempt, "kind": step.kind}
    if reclaimed:
        # The previous holder's lease ran out: it crashed or hung. Take the step back.
        expected_owner = step.lease_owner
        count = Step.objects.filter(
            pk=step.pk, status=S.RUNNING, lease_owner=expected_owner
        ).update(**fields)
        if count == 0:
            return None
        TimelineEvent.append(
            run.pk,
            "step.lease_reclaimed",
            {
                "step": step.name,
                "iteration": step.iteration,
                "previous_worker": expected_owner,
                **data,
            },
        )
        for name, value in fields.items():
            setattr(step, name, value)
    else:
        step.transition(S.RUNNING, verb="step.started", data=data, **fields)
    ctx.iteration = step.iteration
    ctx.spec = step.spec
    return Claim(run, step, workflow, definition, ctx, worker, reclaimed=reclaimed)


# --------------------------------------------------------------------------------------------
# Outcomes


@dataclass
class Outcome:
    """What executing a step produced, recorded by `record_outcome` in one transaction."""

    status: str  # a Step status
    result: Any = None
    failure_class: str = ""
    error: str = ""
    # Side effects to settle in the same transaction: (effect, target status, fields).
    effect_updates: list[tuple[SideEffect, str, dict]] = field(default_factory=list)
    # For a re-check of an unknown outcome: when to claim the step again.
    retry_at: datetime | None = None
    # For waits/approvals: rows to create when recording.
    wait: dict | None = None
    approval: dict | None = None
    events: list[tuple[str, dict]] = field(default_factory=list)
    # The step's tool is paused by an admin: park the step without calling it.
    paused: dict | None = None


def advance(run_id, *, worker: str | None = None, budget: float | None = None) -> int:
    """Execute the run's steps until it parks, finishes, or the time budget is spent.

    Returns the number of steps executed. Consecutive steps that need no wait run in this one
    invocation, so a run costs database commits rather than broker round trips; past the budget
    the run is handed back to the broker.
    """
    budget = _conf("INLINE_BUDGET_SECONDS") if budget is None else budget
    deadline = time.monotonic() + budget
    executed = 0
    while True:
        claim = claim_next(run_id, worker=worker)
        if claim is None:
            return executed
        outcome = execute(claim)
        go_on = record_outcome(claim, outcome)
        executed += 1
        if not go_on:
            return executed
        if time.monotonic() >= deadline:
            with transaction.atomic():
                enqueue(run_id)
            return executed


def execute(claim: Claim) -> Outcome:
    """Run the claimed step outside any transaction (a tool call never holds a lock)."""
    kind = claim.step.kind
    try:
        if kind in (StepKind.READ, StepKind.SIDE_EFFECT):
            held = _held_by_pause(claim)
            if held is not None:
                return held
        if kind == StepKind.COMPUTE:
            return _execute_compute(claim)
        if kind == StepKind.READ:
            return _execute_read(claim)
        if kind == StepKind.SIDE_EFFECT:
            return _execute_side_effect(claim)
        if kind == StepKind.APPROVAL:
            return _execute_approval(claim)
        if kind == StepKind.WAIT_EVENT:
            return _execute_wait_event(claim)
        if kind == StepKind.WAIT_TIMER:
            return _execute_wait_timer(claim)
    except ToolError as exc:
        return _failure(exc.failure_class, exc.message)
    except tool_registry.UnknownTool as exc:
        return _failure(FailureClass.INVALID_INPUT, str(exc))
    return _failure(FailureClass.INVALID_INPUT, f"unknown step kind {kind!r}")


# A step held by a pause is looked at again this often even if nobody resumes the tool (a pause
# closed by other means than approvals.rules.resume_tool, which wakes the held steps at once).
PAUSE_RECHECK = timedelta(hours=1)


def _held_by_pause(claim: Claim) -> Outcome | None:
    """Never call a paused tool: the step waits for an admin to resume it.

    One query on the partial unique index of open pauses per tool call, rather than a cache: a
    pause must hold from the moment it commits, in every worker, and the lookup costs far less
    than the call it guards. Checked before the snapshot and intent are written, so a held side
    effect leaves nothing half-done (and no lookup-by-key call is made either).
    """
    tool_name = claim.definition.tool or claim.step.tool
    pause = ToolPause.active_for(tool_name)
    if pause is None:
        if claim.step.routing.get("paused_tool"):
            _end_pause_wait(claim)
        return None
    return Outcome(
        Step.Status.WAITING,
        paused={"tool": tool_name, "pause": pause.pk, "reason": pause.reason[:500]},
    )


def _end_pause_wait(claim: Claim) -> None:
    with transaction.atomic():
        Run.lock(claim.run.pk)
        for wait in Wait.objects.filter(
            step=claim.step,
            kind=Wait.Kind.TOOL_RECOVERY,
            status=Wait.Status.PENDING,
            correlation_key__startswith="pause:",
        ):
            _resolve_wait(wait, None, resolved_by="tool resumed")
        Step.objects.filter(pk=claim.step.pk).update(routing={})
    claim.step.routing = {}


def _park_for_pause(claim: Claim, paused: dict) -> bool:
    """Park the step like an outage wait, but not as a failure: the claim's attempt is given
    back and no failure is counted."""
    run, step = claim.run, claim.step
    correlation = f"pause:{paused['pause']}"
    wait = Wait.objects.filter(step=step, status=Wait.Status.PENDING).first()
    if wait is None:
        Wait.objects.create(
            run=run,
            step=step,
            kind=Wait.Kind.TOOL_RECOVERY,
            event_type=paused["tool"],
            correlation_key=correlation,
        )
    elif wait.correlation_key != correlation:
        Wait.objects.filter(pk=wait.pk).update(correlation_key=correlation)
    routing = {"rule": "(tool paused by an admin)", "action": "wait",
               "paused_tool": paused["tool"], "pause": paused["pause"]}  # fmt: skip
    step.transition(
        Step.Status.WAITING,
        verb="step.tool_paused",
        held_by=claim.worker,
        attempts=max(step.attempts - 1, 0),
        next_attempt_at=timezone.now() + PAUSE_RECHECK,
        routing=routing,
        data={"tool": paused["tool"], "pause": paused["pause"], "reason": paused["reason"]},
    )
    run.wait(f"{paused['tool']} is paused by an admin: {paused['reason']}"[:2000])
    return False


def _failure(failure_class: str, error: str, **kw) -> Outcome:
    return Outcome(status="failed", failure_class=failure_class, error=error[:4000], **kw)


def _execute_compute(claim: Claim) -> Outcome:
    try:
        result = claim.definition.fn(claim.ctx)
        return Outcome(Step.Status.SUCCEEDED, result=to_json_value(result))
    except ToolError:
        raise
    except Exception as exc:
        return _failure(FailureClass.INVALID_INPUT, f"{type(exc).__name__}: {exc}")


def _build_params(claim: Claim, tool: Tool | None) -> dict:
    try:
        params = claim.definition.build_params(claim.ctx)
    except Exception as exc:
        raise ToolError(
            FailureClass.INVALID_INPUT, f"building parameters failed: {type(exc).__name__}: {exc}"
        ) from None
    if claim.step.spec.get("params_override") is not None:
        params = claim.step.spec["params_override"]
    if tool is not None:
        params = tool.validate(params)
    try:
        text = canonical_json(params)
    except (TypeError, ValueError) as exc:
        raise ToolError(FailureClass.INVALID_INPUT, f"parameters are not JSON: {exc}") from None
    if len(text.encode()) > MAX_PARAMS_BYTES:
        raise ToolError(FailureClass.INVALID_INPUT, "parameters exceed 256 KiB")
    if "\x00" in text:
        raise ToolError(FailureClass.INVALID_INPUT, "parameters contain a NUL character")
    return to_json_value(params)


def _call_context(claim: Claim, tool: Tool, key: str = "") -> CallContext:
    return CallContext(
        idempotency_key=key,
        run_id=str(claim.run.pk),
        step=claim.step.name
        if not claim.step.iteration
        else f"{claim.step.name}#{claim.step.iteration}",
        attempt=claim.step.attempts,
        timeout=tool.timeout if tool.timeout is not None else _conf("TOOL_TIMEOUT_SECONDS"),
        principal=claim.run.principal,
        scopes=tuple(claim.run.scopes or ()),
    )


def _check_scope(claim: Claim, tool: Tool) -> None:
    scopes = claim.run.scopes or []
    if tool.scope and tool.scope not in scopes and "*" not in scopes:
        raise ToolError(
            FailureClass.PERMISSION,
            f"run acts as {claim.run.principal!r} without scope {tool.scope!r} for {tool.name}",
        )


def _execute_read(claim: Claim) -> Outcome:
    tool = tool_registry.get(claim.definition.tool)
    params = _build_params(claim, tool)
    _check_scope(claim, tool)
    try:
        result = tool.invoke(params, _call_context(claim, tool))
    except ToolError as exc:
        return _route_or_degrade(claim, tool, params, exc)
    return Outcome(Step.Status.SUCCEEDED, result=_result_value(result))


def _result_value(result: ToolResult) -> Any:
    return to_json_value(result.response)


def _route_or_degrade(claim: Claim, tool: Tool, params: dict, exc: ToolError) -> Outcome:
    """A read failed: if its rule says degrade and there is a fallback, use it right away."""
    rule = match_rule(claim, exc.failure_class, tool)
    if rule is not None and rule.action == EscalationRule.Action.DEGRADE:
        if not tool.fallback_tool:
            return _failure(
                exc.failure_class,
                f"{exc.message} (rule says degrade, but {tool.name} has no fallback tool)",
            )
        fallback = tool_registry.get(tool.fallback_tool)
        if ToolPause.active_for(fallback.name) is not None:
            return _failure(exc.failure_class, f"{exc.message}; fallback {fallback.name} is paused")
        try:
            result = fallback.invoke(params, _call_context(claim, fallback))
        except ToolError as fallback_exc:
            return _failure(
                fallback_exc.failure_class,
                f"{exc.message}; fallback {fallback.name} failed too: {fallback_exc.message}",
            )
        return Outcome(
            Step.Status.DEGRADED,
            result=to_json_value(
                {"degraded": True, "fallback_tool": fallback.name, "response": result.response}
            ),
            failure_class=exc.failure_class,
            error=exc.message,
            events=[
                (
                    "step.degraded",
                    {
                        "step": claim.step.name,
                        "rule": rule.describe(),
                        "failure_class": exc.failure_class,
                        "fallback_tool": fallback.name,
                    },
                )
            ],
        )
    return _failure(exc.failure_class, exc.message)


# -- the side-effect protocol ------------------------------------------------------------------


class IdempotencyKeyConflict(Exception):
    pass


def idempotency_key_for(step: Step) -> str:
    if step.idempotency_key:
        return step.idempotency_key
    suffix = f"-{step.iteration}" if step.iteration else ""
    return f"tp-{step.run_id}-{step.name}{suffix}"


def _missing_fields(values: dict, has_prior: bool) -> list[str]:
    missing = []
    for name in (
        "session_context_ref",
        "target_resource",
        "permissions",
        "stage",
        "prior_results_summary",
        "idempotency_key",
        "params",
        "tool",
        "run_id",
    ):
        value = values.get(name)
        if name == "permissions":
            value = value and value.get("actor")
        if name == "prior_results_summary" and not has_prior:
            continue  # the first step has nothing before it: not a gap
        if value in (None, "", [], {}):
            missing.append(name)
    return missing


def _write_intent(
    claim: Claim, tool: Tool, params: dict, key: str
) -> tuple[SideEffect, Outcome | None]:
    """Commit the Snapshot and the `intended` SideEffect before the call (the idempotency check).

    Returns the ledger row and, when no call must be made, the outcome to record instead.
    """
    run, step = claim.run, claim.step
    checksum = digest(params)
    values = {
        "run_id": str(run.pk),
        "session_context_ref": run.session_context_ref,
        "tool": tool.name,
        "params": params,
        "target_resource": tool.target_of(params),
        "permissions": {"actor": run.principal, "scopes": list(run.scopes or [])},
        "prior_results_summary": _summary(claim.ctx.results),
        "stage": step.stage,
        "idempotency_key": key,
    }
    missing = _missing_fields(values, has_prior=bool(claim.ctx.results))
    with transaction.atomic():
        Run.lock(run.pk)  # the lock order: the run before its ledger row
        effect = SideEffect.objects.select_for_update().filter(idempotency_key=key).first()
        if effect is not None and effect.params_checksum != checksum:
            raise IdempotencyKeyConflict(
                f"idempotency key {key} was first used with other parameters "
                f"(checksum {effect.params_checksum[:12]}…, now {checksum[:12]}…); refusing "
                "to call again. A person must check which parameters are right."
            )
        if effect is not None and effect.status in (
            SideEffect.Status.COMMITTED,
            SideEffect.Status.COMPENSATED,
        ):
            TimelineEvent.append(
                run.pk,
                "side_effect.reused",
                {"step": step.name, "key": key, "external_id": effect.external_id},
            )
            return effect, Outcome(Step.Status.SUCCEEDED, result=effect.receipt.get("response"))
        if effect is not None and effect.status == SideEffect.Status.INTENDED:
            # Left behind by an attempt that never reported back (worker died mid-call).
            effect.transition(
                SideEffect.Status.UNKNOWN,
                verb="side_effect.unknown",
                data={"reason": "a previous attempt did not report back"},
            )
            return effect, None
        if effect is not None and effect.status == SideEffect.Status.UNKNOWN:
            return effect, None
        snapshot = Snapshot(
            run=run,
            step=step,
            attempt=step.attempts,
            workflow_version=run.workflow_version,
            stage=step.stage,
            tool=tool.name,
            params=params,
            target_resource=values["target_resource"],
            permissions=values["permissions"],
            prior_results_summary=values["prior_results_summary"],
            session_context_ref=run.session_context_ref,
            idempotency_key=key,
            missing_fields=missing,
        )
        snapshot.save()
        TimelineEvent.append(
            run.pk,
            "snapshot.written",
            {
                "step": step.name,
                "snapshot": snapshot.pk,
                "key": key,
                "tool": tool.name,
                "target": snapshot.target_resource,
                "checksum": snapshot.checksum,
                "missing_fields": missing,
            },
        )
        required_missing = [f for f in tool.required_snapshot_fields if f in missing]
        if required_missing:
            raise ToolError(
                FailureClass.INVALID_INPUT,
                f"the snapshot lacks fields {tool.name} requires: {', '.join(required_missing)}",
            )
        if effect is None:
            effect = SideEffect.objects.create(
                idempotency_key=key,
                run=run,
                step=step,
                snapshot=snapshot,
                tool=tool.name,
                target=snapshot.target_resource,
                params_checksum=checksum,
            )
            TimelineEvent.append(
                run.pk,
                "side_effect.intended",
                {"step": step.name, "key": key, "tool": tool.name, "target": effect.target},
            )
        else:  # not_committed before: a new attempt with the same key
            effect.transition(
                SideEffect.Status.INTENDED,
                verb="side_effect.intended",
                data={"step": step.name, "attempt": step.attempts},
                snapshot=snapshot,
            )
        if step.idempotency_key != key:
            Step.objects.filter(pk=step.pk).update(idempotency_key=key)
            step.idempotency_key = key
    return effect, None


def _settle_window(claim: Claim, tool: Tool) -> timedelta:
    if tool.settle_seconds is not None:
        return timedelta(seconds=tool.settle_seconds)
    timeout = _call_context(claim, tool).timeout or 0
    return timedelta(seconds=2 * timeout + 1)


def _reconcile(claim: Claim, tool: Tool, effect: SideEffect) -> str:
    """Settle an unknown outcome without guessing.

    Returns "committed" (the receipt is recorded), "resend" (safe to call again with the same
    key: the system says it never got it, or it dedupes by key), "recheck" (the system has no
    record yet, but the request may still be in flight there: ask again once the tool's settle
    window has passed) or "unknown" (a person decides).
    """
    if tool.lookup is not None:
        try:
            found: LookupResult = tool.lookup(
                effect.idempotency_key, _call_context(claim, tool, effect.idempotency_key)
            )
        except ToolError as exc:
            TimelineEvent.append(
                claim.run.pk,
                "side_effect.lookup_failed",
                {"key": effect.idempotency_key, "error": exc.message},
            )
            # The system cannot answer right now: that is no evidence either way. Ask again
            # later, a bounded number of times, before handing the question to a person.
            if exc.failure_class in (FailureClass.TRANSIENT, FailureClass.OUTAGE) and (
                claim.step.attempts < RECHECK_ATTEMPTS
            ):
                return "recheck"
            found = None
        if found is not None and found.found:
            effect.transition(
                SideEffect.Status.COMMITTED,
                verb="side_effect.committed",
                data={"confirmed_by": "reconcile", "external_id": found.external_id},
                external_id=found.external_id,
                receipt=to_json_value(
                    {
                        "external_id": found.external_id,
                        "response": found.response,
                        "response_digest": digest(found.response),
                    }
                ),
                confirmed_by="reconcile",
            )
            return "committed"
        if found is not None and timezone.now() < effect.attempted_at + _settle_window(claim, tool):
            return "recheck"
        if found is not None:
            effect.transition(
                SideEffect.Status.NOT_COMMITTED,
                verb="side_effect.not_committed",
                data={"confirmed_by": "reconcile"},
            )
            return "resend"
    if tool.dedupes_by_key:
        TimelineEvent.append(
            claim.run.pk,
            "side_effect.resend_with_same_key",
            {"key": effect.idempotency_key, "why": f"{tool.name} dedupes by idempotency key"},
        )
        return "resend"
    return "unknown"


def _execute_side_effect(claim: Claim) -> Outcome:
    tool = tool_registry.get(claim.definition.tool)
    if not tool.side_effect:
        raise ToolError(FailureClass.INVALID_INPUT, f"{tool.name} is not a side-effect tool")
    params = _build_params(claim, tool)
    _check_scope(claim, tool)
    key = idempotency_key_for(claim.step)
    try:
        effect, done = _write_intent(claim, tool, params, key)
    except IdempotencyKeyConflict as exc:
        return _failure(
            FailureClass.INVALID_INPUT,
            str(exc),
            events=[("side_effect.key_conflict", {"key": key, "step": claim.step.name})],
        )
    if done is not None:
        return done
    if effect.status == SideEffect.Status.UNKNOWN:
        verdict = _reconcile(claim, tool, effect)
        if verdict == "committed":
            return Outcome(Step.Status.SUCCEEDED, result=effect.receipt.get("response"))
        if verdict == "unknown":
            return _unknown_outcome(tool, effect, "a previous attempt did not report back")
        if verdict == "recheck":
            return _recheck(claim, tool, effect)
        effect, _ = (
            _write_intent(claim, tool, params, key)
            if effect.status == (SideEffect.Status.NOT_COMMITTED)
            else (effect, None)
        )
    ctx = _call_context(claim, tool, key)
    try:
        result = tool.invoke(params, ctx)
        if tool.name in CRASH_AFTER_CALL:
            logger.error("chaos: exiting after %s committed, before recording it", tool.name)
            os._exit(137)
    except ToolError as exc:
        if exc.failure_class != FailureClass.UNKNOWN_OUTCOME:
            return _failure(
                exc.failure_class,
                exc.message,
                effect_updates=[(effect, SideEffect.Status.NOT_COMMITTED, {})],
            )
        if effect.status == SideEffect.Status.INTENDED:
            effect.transition(
                SideEffect.Status.UNKNOWN, verb="side_effect.unknown", data={"error": exc.message}
            )
        verdict = _reconcile(claim, tool, effect)
        if verdict == "committed":
            return Outcome(Step.Status.SUCCEEDED, result=effect.receipt.get("response"))
        if verdict == "resend":
            # Known not committed, or safe to resend: an ordinary retry with the same key.
            return _failure(FailureClass.TRANSIENT, f"{exc.message} (reconciled: safe to retry)")
        if verdict == "recheck":
            return _recheck(claim, tool, effect)
        return _unknown_outcome(tool, effect, exc.message)
    return Outcome(
        Step.Status.SUCCEEDED,
        result=_result_value(result),
        effect_updates=[
            (
                effect,
                SideEffect.Status.COMMITTED,
                {
                    "external_id": result.external_id[:255],
                    "receipt": to_json_value(
                        {
                            "external_id": result.external_id,
                            "response": result.response,
                            "response_digest": digest(result.response),
                        }
                    ),
                    "confirmed_by": "tool",
                },
            )
        ],
    )


RECHECK_ATTEMPTS = 8


def _recheck(claim: Claim, tool: Tool, effect: SideEffect) -> Outcome:
    """Nothing found by key yet, inside the settle window, or the system could not be asked:
    never resend now (the first request may still land); ask again later — once the window has
    passed, and with a growing pause while the system does not answer."""
    backoff = timedelta(seconds=min(60, 2 ** max(claim.step.attempts - 1, 0)))
    at = max(effect.attempted_at + _settle_window(claim, tool), timezone.now() + backoff)
    return Outcome(
        Step.Status.RETRY_SCHEDULED,
        retry_at=at,
        failure_class=FailureClass.UNKNOWN_OUTCOME,
        error=f"{tool.name} has no record of key {effect.idempotency_key} yet; the request may "
        f"still be in flight, so it is asked again at {at:%H:%M:%S} before anything is resent.",
    )


def _unknown_outcome(tool: Tool, effect: SideEffect, error: str) -> Outcome:
    return Outcome(
        Step.Status.UNKNOWN_OUTCOME,
        failure_class=FailureClass.UNKNOWN_OUTCOME,
        error=(
            f"{error}. {tool.name} may or may not have done this; it cannot be asked by key and "
            f"does not dedupe, so a person must check (idempotency key {effect.idempotency_key})."
        ),
    )


# -- approvals and waits ---------------------------------------------------------------------


def _execute_approval(claim: Claim) -> Outcome:
    definition = claim.definition
    params = _build_params(claim, None)
    if definition.when is not None and not definition.when(claim.ctx):
        return Outcome(Step.Status.SUCCEEDED, result={"decision": "not_required", "params": params})
    reason = definition.reason(claim.ctx) if callable(definition.reason) else definition.reason
    rule = _find_rule(claim.run.workflow, claim.step.name, definition.tool, "", "")
    sla = definition.sla or (timedelta(seconds=rule.approval_sla_seconds) if rule else None)
    risk = tool_registry.get(definition.tool).risk if definition.tool else "medium"
    return Outcome(
        Step.Status.NEEDS_HUMAN,
        approval={
            "queue": definition.queue,
            "reason": reason or f"Approval needed for {claim.step.name}",
            "risk": risk,
            "tool": definition.tool,
            "proposed_params": params,
            "due_at": timezone.now() + sla if sla else None,
        },
    )


def _execute_wait_event(claim: Claim) -> Outcome:
    definition = claim.definition
    try:
        correlation = str(definition.correlation(claim.ctx))
    except Exception as exc:
        return _failure(FailureClass.INVALID_INPUT, f"correlation key: {exc}")
    due = timezone.now() + definition.timeout if definition.timeout else None
    return Outcome(
        Step.Status.WAITING,
        wait={
            "kind": Wait.Kind.EVENT,
            "event_type": definition.event_type,
            "correlation_key": correlation,
            "due_at": due,
        },
    )


def _execute_wait_timer(claim: Claim) -> Outcome:
    delay = claim.definition.delay
    delay = delay(claim.ctx) if callable(delay) else delay
    return Outcome(
        Step.Status.WAITING, wait={"kind": Wait.Kind.TIMER, "due_at": timezone.now() + delay}
    )


# --------------------------------------------------------------------------------------------
# Recording outcomes


def record_outcome(claim: Claim, outcome: Outcome) -> bool:
    """Commit the outcome with its timeline events; return True if the run may go on inline.

    Ledger updates are keyed by idempotency key and land even when this worker has lost its lease
    (a receipt must never be dropped); the step's own update is guarded by the lease.
    """
    run, step = claim.run, claim.step
    with transaction.atomic():
        Run.lock(run.pk)  # the lock order: the run before its step and ledger rows
        for effect, target, fields in outcome.effect_updates:
            if effect.status == target:
                continue
            try:
                with transaction.atomic():
                    effect.transition(
                        target,
                        verb=f"side_effect.{target}",
                        data={"step": step.name, "external_id": fields.get("external_id", "")},
                        **fields,
                    )
            except TransitionError:
                logger.warning("side effect %s already settled", effect.idempotency_key)
        for verb, data in outcome.events:
            TimelineEvent.append(run.pk, verb, data)
        try:
            with transaction.atomic():
                return _apply_outcome(claim, outcome)
        except TransitionError:
            TimelineEvent.append(
                run.pk,
                "step.outcome_discarded",
                {
                    "step": step.name,
                    "worker": claim.worker,
                    "why": "the lease expired and the step was taken over",
                },
            )
            return False


def _apply_outcome(claim: Claim, outcome: Outcome) -> bool:
    run, step = claim.run, claim.step
    S = Step.Status
    lease = claim.worker
    if outcome.status in (S.SUCCEEDED, S.DEGRADED):
        recovered = bool(step.error_class) or step.attempts > 1
        step.transition(
            outcome.status,
            verb=f"step.{outcome.status}",
            held_by=lease,
            result=outcome.result,
            error_class=outcome.failure_class,
            last_error=outcome.error,
            data={"attempt": step.attempts},
        )
        if step.spec.get("compensates"):
            _settle_compensation(step)
        if recovered:
            # The tool came back: close the outage wait this step was probing under.
            Wait.objects.filter(
                step=step, kind=Wait.Kind.TOOL_RECOVERY, status=Wait.Status.PENDING
            ).update(status=Wait.Status.RESOLVED, resolved_at=timezone.now(), resolved_by="probe")
        return True
    if outcome.status == S.RETRY_SCHEDULED and outcome.retry_at is not None:
        step.transition(
            S.RETRY_SCHEDULED,
            verb="side_effect.recheck_scheduled",
            held_by=lease,
            error_class=outcome.failure_class,
            last_error=outcome.error,
            next_attempt_at=outcome.retry_at,
            data={"recheck_at": outcome.retry_at, "attempt": step.attempts},
        )
        seconds = (outcome.retry_at - timezone.now()).total_seconds()
        if seconds <= 5:
            enqueue(run.pk, countdown=max(seconds, 0))
        return False
    if outcome.status == S.WAITING and outcome.paused is not None:
        return _park_for_pause(claim, outcome.paused)
    if outcome.status == S.WAITING and outcome.wait is not None:
        return _park_on_wait(claim, outcome.wait)
    if outcome.status == S.NEEDS_HUMAN and outcome.approval is not None:
        data = outcome.approval
        ApprovalRequest.objects.create(run=run, step=step, **data)
        Wait.objects.create(run=run, step=step, kind=Wait.Kind.APPROVAL, due_at=data["due_at"])
        step.transition(
            S.NEEDS_HUMAN,
            verb="approval.requested",
            held_by=lease,
            data={"queue": data["queue"], "reason": data["reason"], "tool": data["tool"]},
        )
        run.ask_human(data["reason"], queue=data["queue"], due_at=data["due_at"])
        return False
    if outcome.status == S.UNKNOWN_OUTCOME:
        rule = match_rule(claim, FailureClass.UNKNOWN_OUTCOME)
        step.transition(
            S.UNKNOWN_OUTCOME,
            verb="step.unknown_outcome",
            held_by=lease,
            error_class=FailureClass.UNKNOWN_OUTCOME,
            last_error=outcome.error,
            routing=rule.describe() if rule else {},
        )
        _bump_failures(run)
        run.ask_human(
            outcome.error,
            queue=rule.queue if rule else "support",
            failure_class=FailureClass.UNKNOWN_OUTCOME,
            due_at=_person_due(rule),
        )
        return False
    return _route_failure(claim, outcome)


def _park_on_wait(claim: Claim, wait: dict) -> bool:
    run, step = claim.run, claim.step
    row = Wait.objects.create(run=run, step=step, **wait)
    if row.kind == Wait.Kind.EVENT:
        early = (
            InboundEvent.objects.select_for_update(skip_locked=True)
            .filter(
                event_type=row.event_type,
                correlation_key=row.correlation_key,
                matched_wait__isnull=True,
            )
            .order_by("received_at")
            .first()
        )
        if early is not None:
            # The callback came before we waited for it: consume it now.
            _resolve_wait(row, early.payload, resolved_by=f"event:{early.event_id}")
            InboundEvent.objects.filter(pk=early.pk).update(matched_wait=row)
            step.transition(
                Step.Status.SUCCEEDED,
                verb="step.succeeded",
                held_by=claim.worker,
                result=early.payload,
                data={"event_id": early.event_id, "early": True},
            )
            return True
    if row.kind == Wait.Kind.TIMER and row.due_at <= timezone.now():
        _resolve_wait(row, None, resolved_by="timer")
        step.transition(
            Step.Status.SUCCEEDED,
            verb="step.succeeded",
            held_by=claim.worker,
            result={"timer": "elapsed"},
        )
        return True
    step.transition(
        Step.Status.WAITING,
        verb="step.waiting",
        held_by=claim.worker,
        data={
            "wait": row.kind,
            "event_type": row.event_type,
            "correlation_key": row.correlation_key,
            "due_at": row.due_at,
        },
    )
    run.wait(f"waiting for {row.event_type or row.kind}")
    return False


def _resolve_wait(wait: Wait, payload: Any, *, resolved_by: str) -> None:
    Wait.objects.filter(pk=wait.pk).update(
        status=Wait.Status.RESOLVED,
        payload=payload,
        resolved_by=resolved_by,
        resolved_at=timezone.now(),
    )
    TimelineEvent.append(
        wait.run_id, "wait.resolved", {"wait": wait.pk, "kind": wait.kind, "by": resolved_by}
    )


def _bump_failures(run: Run, *, escalate: bool = False) -> None:
    from django.db.models import F

    updates = {"failure_count": F("failure_count") + 1}
    if escalate:
        updates["escalation_level"] = F("escalation_level") + 1
    Run.objects.filter(pk=run.pk).update(**updates)


# --------------------------------------------------------------------------------------------
# Failure routing


def _find_rule(workflow: str, step: str, tool: str, failure_class: str, risk: str):
    # Read at routing time, so an admin's edit routes the next failure (the console's tester
    # uses the same function).
    return EscalationRule.first_match(
        workflow=workflow, step=step, tool=tool, failure_class=failure_class, risk=risk
    )


def match_rule(claim: Claim, failure_class: str, tool: Tool | None = None):
    tool_name = claim.definition.tool or claim.step.tool
    if tool is None and tool_name:
        try:
            tool = tool_registry.get(tool_name)
        except tool_registry.UnknownTool:
            tool = None
    return _find_rule(
        claim.run.workflow, claim.step.name, tool_name, failure_class, tool.risk if tool else ""
    )


def _route_failure(claim: Claim, outcome: Outcome) -> bool:
    """Apply the first matching escalation rule to a failed attempt.

    retry → backoff with jitter until max attempts, then escalate; wait → probe the tool until
    its wait window closes, then escalate; degrade (reads are degraded before recording; here it
    means no fallback worked) → escalate; compensate → undo committed side effects; escalate →
    a person's queue; fail → the run fails.
    """
    run, step = claim.run, claim.step
    S, A = Step.Status, EscalationRule.Action
    now = timezone.now()
    rule = match_rule(claim, outcome.failure_class)
    action = rule.action if rule else A.ESCALATE
    queue = rule.queue if rule else "ops"
    routing = {
        **(rule.describe() if rule else {"rule": "(no rule matched)"}),
        "failure_class": outcome.failure_class,
    }
    reason = outcome.error
    if action == A.RETRY:
        if step.attempts < rule.max_attempts:
            delay = rule.backoff(step.attempts)
            step.transition(
                S.RETRY_SCHEDULED,
                verb="step.retry_scheduled",
                held_by=claim.worker,
                error_class=outcome.failure_class,
                last_error=outcome.error,
                next_attempt_at=now + delay,
                routing=routing,
                data={
                    "routing": routing,
                    "attempt": step.attempts,
                    "retry_in_s": round(delay.total_seconds(), 3),
                    "error": outcome.error[:500],
                },
            )
            _bump_failures(run)
            if delay.total_seconds() <= 5:
                enqueue(run.pk, countdown=delay.total_seconds())
            return False
        action = A.ESCALATE
        reason = f"Gave up after {step.attempts} attempts: {outcome.error}"
    if action == A.WAIT:
        wait = Wait.objects.filter(
            step=step, kind=Wait.Kind.TOOL_RECOVERY, status=Wait.Status.PENDING
        ).first()
        if wait is None:
            wait = Wait.objects.create(
                run=run,
                step=step,
                kind=Wait.Kind.TOOL_RECOVERY,
                event_type=claim.definition.tool,
                due_at=now + timedelta(seconds=rule.wait_window_seconds),
            )
        if now < wait.due_at:
            probe_at = min(now + timedelta(seconds=rule.probe_interval_seconds), wait.due_at)
            step.transition(
                S.WAITING,
                verb="step.waiting_for_tool",
                held_by=claim.worker,
                error_class=outcome.failure_class,
                last_error=outcome.error,
                next_attempt_at=probe_at,
                routing=routing,
                data={
                    "routing": routing,
                    "probe_at": probe_at,
                    "window_ends": wait.due_at,
                    "error": outcome.error[:500],
                },
            )
            _bump_failures(run)
            run.wait(f"waiting for {claim.definition.tool} to recover")
            return False
        Wait.objects.filter(pk=wait.pk).update(status=Wait.Status.EXPIRED, resolved_at=now)
        action = A.ESCALATE
        reason = (
            f"{claim.definition.tool} was still failing when its wait window of "
            f"{rule.wait_window_seconds}s closed: {outcome.error}"
        )
    if action == A.DEGRADE:
        action = A.ESCALATE
        reason = f"Could not degrade: {outcome.error}"
    if action in (A.COMPENSATE, A.FAIL):
        step.transition(
            S.FAILED,
            verb="step.failed",
            held_by=claim.worker,
            error_class=outcome.failure_class,
            last_error=outcome.error,
            routing=routing,
            data={"routing": routing},
        )
        _bump_failures(run)
        if action == A.FAIL:
            run.fail(f"{step.name}: {outcome.error}")
            return False
        begin_compensation(
            run,
            f"{step.name} failed ({outcome.failure_class}); rule "
            f"{routing.get('rule')!r} compensates",
        )
        return True
    # escalate
    step.transition(
        S.NEEDS_HUMAN,
        verb="step.escalated",
        held_by=claim.worker,
        error_class=outcome.failure_class,
        last_error=reason[:4000],
        routing=routing,
        data={"routing": routing, "error": reason[:500]},
    )
    _bump_failures(run, escalate=True)
    run.ask_human(
        reason[:2000], queue=queue, failure_class=outcome.failure_class, due_at=_person_due(rule)
    )
    return False


def _person_due(rule) -> datetime | None:
    """When a person must have handled what `rule` hands them (its SLA; none when 0): past it,
    the sweeper escalates the run (approvals.sla)."""
    if rule is None or not rule.approval_sla_seconds:
        return None
    return timezone.now() + timedelta(seconds=rule.approval_sla_seconds)


# --------------------------------------------------------------------------------------------
# Compensation


def begin_compensation(run: Run, reason: str, *, actor: str = "system") -> None:
    """Undo the run's committed side effects, newest first, each as a keyed side-effect step.

    Side effects whose tool has no compensating tool are listed for a person at the end.
    """
    effects = list(
        SideEffect.objects.filter(run=run, status=SideEffect.Status.COMMITTED)
        .select_related("step", "snapshot")
        .order_by("-committed_at", "-id")
    )
    # Whatever the run was about to do is abandoned.
    for step in Step.objects.filter(run=run, status__in=Step.UNFINISHED).exclude(
        spec__has_key="compensates"
    ):
        step.transition(
            Step.Status.SKIPPED, verb="step.skipped", actor=actor, data={"reason": reason}
        )
    if not effects:
        run.cancel(reason, actor=actor)
        return
    run.begin_compensation(reason, actor=actor)
    last = run.steps.order_by("-position").values_list("position", flat=True).first() or 0
    for offset, effect in enumerate(effects, start=1):
        try:
            tool = tool_registry.get(effect.tool)
        except tool_registry.UnknownTool:
            tool = None
        if tool is None or not tool.compensating_tool:
            TimelineEvent.append(
                run.pk,
                "compensation.not_available",
                {"key": effect.idempotency_key, "tool": effect.tool},
            )
            continue
        original = {
            "key": effect.idempotency_key,
            "external_id": effect.external_id,
            "params": effect.snapshot.params,
            "response": effect.receipt.get("response"),
        }
        params = (
            tool.compensation_params(original["params"], original)
            if tool.compensation_params
            else {"original": original}
        )
        name = f"compensate:{effect.step.name}"
        iteration = Step.objects.filter(run=run, name=name).count()
        Step.objects.create(
            run=run,
            name=name,
            iteration=iteration,
            position=last + offset,
            kind=StepKind.SIDE_EFFECT,
            stage="compensation",
            tool=tool.compensating_tool,
            spec=to_json_value(
                {
                    "dynamic": True,
                    "kind": StepKind.SIDE_EFFECT,
                    "tool": tool.compensating_tool,
                    "params": params,
                    "stage": "compensation",
                    "compensates": effect.pk,
                }
            ),
        )
        TimelineEvent.append(
            run.pk,
            "compensation.planned",
            {"step": name, "compensates": effect.idempotency_key, "tool": tool.compensating_tool},
        )
    enqueue(run.pk)


def _settle_compensation(step: Step) -> None:
    effect = SideEffect.objects.filter(pk=step.spec["compensates"]).first()
    if effect is None or effect.status != SideEffect.Status.COMMITTED:
        return
    comp_key = SideEffect.objects.filter(step=step).values_list("idempotency_key", flat=True)
    effect.transition(
        SideEffect.Status.COMPENSATED,
        verb="side_effect.compensated",
        compensation_key=comp_key.first() or "",
    )
    original = Step.objects.get(pk=effect.step_id)
    if original.status == Step.Status.SUCCEEDED:
        original.transition(Step.Status.COMPENSATED, verb="step.compensated")


def _finish_compensation(run: Run) -> None:
    leftovers = list(
        SideEffect.objects.filter(run=run, status=SideEffect.Status.COMMITTED)
        .exclude(step__spec__has_key="compensates")
        .values_list("tool", "idempotency_key")
    )
    if leftovers:
        listed = ", ".join(f"{tool} ({key})" for tool, key in leftovers)
        run.ask_human(
            f"Compensation finished, but these side effects have no compensating "
            f"tool and must be undone by hand: {listed}",
            queue="support",
        )
        return
    run.mark_compensated()


# --------------------------------------------------------------------------------------------
# Wake-ups: events, timers, approvals


def deliver_event(
    event_id: str, event_type: str, correlation_key: str, payload: Any, *, source: str = "system"
) -> str:
    """Resolve the wait for (event_type, correlation_key), or keep the event until one exists.

    Returns "resumed", "stored" (nobody waits yet; it is matched when a wait is created) or
    "duplicate" (this event_id was seen before: acknowledged, changes nothing).
    """
    payload = to_json_value(payload)
    with transaction.atomic():
        event, created = InboundEvent.objects.get_or_create(
            event_id=event_id,
            defaults={
                "event_type": event_type,
                "correlation_key": correlation_key,
                "payload": payload,
                "source": source,
            },
        )
        if not created:
            return "duplicate"
        pending = Wait.objects.filter(
            kind=Wait.Kind.EVENT,
            status=Wait.Status.PENDING,
            event_type=event_type,
            correlation_key=correlation_key,
        ).order_by("created_at")
        while True:
            # The lock order: find the wait without locking it, lock its run, then the wait,
            # and look again when it was settled meanwhile (a cancel, a timeout).
            candidate = pending.values_list("pk", "run_id").first()
            if candidate is None:
                return "stored"
            run = Run.objects.select_for_update().get(pk=candidate[1])
            wait = (
                pending.select_for_update(of=("self",))
                .select_related("step")
                .filter(pk=candidate[0])
                .first()
            )
            if wait is not None:
                break
        _resolve_wait(wait, payload, resolved_by=f"event:{event_id}")
        InboundEvent.objects.filter(pk=event.pk).update(matched_wait=wait)
        wait.step.transition(
            Step.Status.SUCCEEDED,
            verb="step.succeeded",
            actor=source,
            result=payload,
            data={"event_id": event_id},
        )
        if run.status == Run.Status.WAITING:
            run.resume(actor=source, reason=f"event {event_type}")
            enqueue(run.pk)
    return "resumed"


# --------------------------------------------------------------------------------------------
# The sweeper: re-derives all due work from the database.


@dataclass
class SweepReport:
    expired_leases: int = 0
    due_retries: int = 0
    tool_probes: int = 0
    timers_fired: int = 0
    waits_timed_out: int = 0
    sla_breaches: int = 0
    notifications_due: int = 0
    stale_runs: int = 0
    enqueued: set = field(default_factory=set)

    def as_dict(self) -> dict:
        data = {k: v for k, v in self.__dict__.items() if k != "enqueued"}
        data["enqueued"] = len(self.enqueued)
        return data


def sweep(now: datetime | None = None) -> SweepReport:
    """One pass: wake what is due and re-enqueue what is stuck. Safe to run concurrently and
    repeatedly; it only enqueues hints and makes conditional state changes."""
    now = now or timezone.now()
    batch = _conf("SWEEP_BATCH")
    report = SweepReport()

    expires = max(_conf("STALE_RUN_SECONDS"), 5)

    def hint(run_id):
        if run_id not in report.enqueued:
            report.enqueued.add(run_id)
            with transaction.atomic():
                enqueue(run_id, expires=expires)

    # 1. Steps whose worker died: the next claim takes them back.
    for run_id in Step.objects.filter(
        status=Step.Status.RUNNING, lease_expires_at__lt=now
    ).values_list("run_id", flat=True)[:batch]:
        report.expired_leases += 1
        hint(run_id)
    # 2. Retries whose backoff is over.
    for run_id in Step.objects.filter(
        status=Step.Status.RETRY_SCHEDULED, next_attempt_at__lte=now
    ).values_list("run_id", flat=True)[:batch]:
        report.due_retries += 1
        hint(run_id)
    # 3. Steps waiting for a tool to recover: time to probe.
    probes = Step.objects.filter(status=Step.Status.WAITING, next_attempt_at__lte=now)
    for step in probes.select_related("run")[:batch]:
        with transaction.atomic():
            run = Run.objects.select_for_update().get(pk=step.run_id)
            if run.status == Run.Status.WAITING:
                run.resume(reason=f"probing {step.tool}")
        report.tool_probes += 1
        hint(step.run_id)
    # 4. Timers that are due, and event waits past their deadline.
    for wait in Wait.objects.filter(
        status=Wait.Status.PENDING, due_at__lte=now, kind__in=[Wait.Kind.TIMER, Wait.Kind.EVENT]
    ).select_related("step")[:batch]:
        if _wake_wait(wait, now):
            if wait.kind == Wait.Kind.TIMER:
                report.timers_fired += 1
            else:
                report.waits_timed_out += 1
            hint(wait.run_id)
    # 5. People past their SLA: escalate once per due time, by the run's `timeout` rule.
    from approvals import notifications, sla

    for run_id in sla.overdue_runs(now, batch):
        if sla.escalate_overdue(run_id, now):
            report.sla_breaches += 1
            hint(run_id)  # a rule that compensates has work for a worker
    # 6. Notifications: record those new timeline events ask for, send what is due (a lost
    # task, a channel's next try after a failure).
    report.notifications_due = notifications.sweep(now, batch)
    # 7. Runnable runs nobody is working on (a lost message): nothing live, nothing scheduled.
    stale_before = now - timedelta(seconds=_conf("STALE_RUN_SECONDS"))
    busy = Step.objects.filter(run=OuterRef("pk")).filter(
        Q(status=Step.Status.RUNNING, lease_expires_at__gt=now)
        | Q(status=Step.Status.RETRY_SCHEDULED, next_attempt_at__gt=now)
    )
    stale = (
        Run.objects.filter(status__in=Run.RUNNABLE, updated_at__lt=stale_before)
        .exclude(Exists(busy))
        .values_list("pk", flat=True)[:batch]
    )
    for run_id in stale:
        if run_id not in report.enqueued:
            report.stale_runs += 1
        hint(run_id)
    return report


def _wake_wait(wait: Wait, now: datetime) -> bool:
    with transaction.atomic():
        # The lock order: the run, then the wait. A run someone is acting on is left for the
        # next pass rather than waited for.
        if not Run.lock(wait.run_id, skip_locked=True):
            return False
        locked = Wait.objects.select_for_update().filter(pk=wait.pk, status=Wait.Status.PENDING)
        if locked.first() is None:
            return False
        run = Run.objects.get(pk=wait.run_id)
        step = Step.objects.get(pk=wait.step_id)
        if wait.kind == Wait.Kind.TIMER:
            _resolve_wait(wait, None, resolved_by="timer")
            step.transition(
                Step.Status.SUCCEEDED, verb="step.succeeded", result={"timer": "elapsed"}
            )
            if run.status == Run.Status.WAITING:
                run.resume(reason="timer elapsed")
            return True
        Wait.objects.filter(pk=wait.pk).update(status=Wait.Status.EXPIRED, resolved_at=now)
        rule = _find_rule(run.workflow, step.name, step.tool, FailureClass.TIMEOUT, "")
        action = rule.action if rule else EscalationRule.Action.ESCALATE
        routing = {**(rule.describe() if rule else {}), "failure_class": FailureClass.TIMEOUT}
        reason = (
            f"No {wait.event_type} event for {wait.correlation_key} arrived by "
            f"{wait.due_at:%Y-%m-%d %H:%M:%S} UTC."
        )
        if action in (EscalationRule.Action.FAIL, EscalationRule.Action.COMPENSATE):
            step.transition(
                Step.Status.FAILED,
                verb="step.failed",
                routing=routing,
                error_class=FailureClass.TIMEOUT,
                last_error=reason,
            )
            if action == EscalationRule.Action.FAIL:
                run.fail(reason)
            else:
                begin_compensation(run, reason)
        else:
            step.transition(
                Step.Status.NEEDS_HUMAN,
                verb="step.escalated",
                routing=routing,
                error_class=FailureClass.TIMEOUT,
                last_error=reason,
                data={"routing": routing},
            )
            _bump_failures(run, escalate=True)
            run.ask_human(
                reason, queue=rule.queue if rule else "support", failure_class=FailureClass.TIMEOUT
            )
        return True


def run_until_quiet(run_id, *, max_steps: int = 1000) -> Run:
    """Advance a run in this process until it has nothing runnable (tests, drills, the shell)."""
    total = 0
    while total < max_steps:
        executed = advance(run_id, budget=3600)
        total += executed
        if executed == 0:
            break
    return Run.objects.get(pk=run_id)

"""Recording what a step produced: its ledger row, its own state, the run's next move and their
timeline events, in one transaction."""

from __future__ import annotations

import logging

from django.db import transaction
from django.utils import timezone

from runs.engine.claim import Claim
from runs.engine.compensation import settle_compensation
from runs.engine.dispatch import enqueue
from runs.engine.outcomes import (
    AskApproval,
    Failed,
    HeldByPause,
    Outcome,
    Park,
    Recheck,
    Succeeded,
    UnknownOutcome,
)
from runs.engine.pauses import hold_for_pause
from runs.engine.routing import escalate_to_person, route_failure
from runs.engine.waits import close_recovery_wait, park
from runs.models import (
    FailureClass,
    RouteAction,
    Run,
    SideEffect,
    Step,
    StepKind,
    TimelineEvent,
    TransitionError,
    Wait,
)
from runs.people import people
from runs.verbs import Verb

logger = logging.getLogger("taskpilots.engine")

# The routing of a side effect the gate handed to people for approval of its call.
GATE_ROUTING = {"rule": "(approval needed before the call)", "action": RouteAction.APPROVE.value}


def record_outcome(claim: Claim, outcome: Outcome) -> bool:
    """Commit the outcome with its timeline events; return True if the run may go on inline.

    Ledger updates are keyed by idempotency key and land even when this worker has lost its lease
    (a receipt must never be dropped); the step's own update is guarded by the lease.
    """
    run, step = claim.run, claim.step
    with transaction.atomic():
        Run.lock(run.pk)  # the lock order: the run before its step and ledger rows
        _settle_ledger(claim, outcome)
        for verb, data in getattr(outcome, "events", ()):
            TimelineEvent.append(run.pk, verb, data)
        try:
            with transaction.atomic():
                return _apply(claim, outcome)
        except TransitionError:
            TimelineEvent.append(
                run.pk,
                Verb.STEP_OUTCOME_DISCARDED,
                {
                    "step": step.name,
                    "worker": claim.worker,
                    "why": "the lease expired and the step was taken over",
                },
            )
            _answer_with_late_receipt(claim, outcome)
            return False


def _answer_with_late_receipt(claim: Claim, outcome: Outcome) -> None:
    """The call's receipt landed after the step's new owner had parked it for a person over an
    unknown outcome: the receipt answers that question. The step goes back to the engine, whose
    replay takes the receipt from the ledger instead of calling again, and the run leaves the
    inbox. A run a person has taken over stays theirs (the console shows the receipt)."""
    if not (isinstance(outcome, Succeeded) and outcome.committed is not None):
        return
    effect, _ = outcome.committed
    run = Run.objects.get(pk=claim.run.pk)  # locked by record_outcome
    step = Step.objects.select_for_update().get(pk=claim.step.pk)
    if run.status != Run.Status.NEEDS_HUMAN or step.status != Step.Status.UNKNOWN_OUTCOME:
        return
    committed = SideEffect.Status.COMMITTED
    if not SideEffect.objects.filter(pk=effect.pk, status=committed).exists():
        return
    step.request_retry(actor="system", data={"why": "the call's receipt came in late"})
    run.resume(reason=f"the receipt of {step.name} came in after it was parked")
    enqueue(run.pk)


def _settle_ledger(claim: Claim, outcome: Outcome) -> None:
    """The receipt of a call that landed, or the refusal of one that did not."""
    if isinstance(outcome, Succeeded) and outcome.committed is not None:
        effect, receipt = outcome.committed
        target, settle = (
            SideEffect.Status.COMMITTED,
            (lambda: effect.commit(receipt, confirmed_by="tool", data={"step": claim.step.name})),
        )
    elif isinstance(outcome, Failed) and outcome.not_committed is not None:
        effect = outcome.not_committed
        target, settle = SideEffect.Status.NOT_COMMITTED, effect.mark_not_committed
    else:
        return
    if effect.status == target:
        return
    try:
        with transaction.atomic():
            settle()
    except TransitionError:
        logger.warning("side effect %s already settled", effect.idempotency_key)


def _apply(claim: Claim, outcome: Outcome) -> bool:
    run, step, lease = claim.run, claim.step, claim.lease
    match outcome:
        case Succeeded(result=result, degraded=degraded, degraded_details=details, read=read):
            recovered = bool(step.error_class) or step.attempts > 1
            # A read's input and response summary land in the same update as its result.
            fields = {"read_record": read} if read else {}
            if degraded is None:
                step.succeed_attempt(result, held_by=lease, read_record=read)
            else:
                step.degrade(
                    result,
                    held_by=lease,
                    failure_class=degraded[0],
                    error=degraded[1],
                    details=details,
                    **fields,
                )
                run.count_failure()  # the tool failed; its fallback served the step
            if step.spec.get("compensates"):
                settle_compensation(step)
            if recovered:
                close_recovery_wait(step)
            return True
        case Recheck(at=at, error=error):
            step.schedule_recheck(at, held_by=lease, error=error)
            seconds = (at - timezone.now()).total_seconds()
            if seconds <= 5:
                enqueue(run.pk, countdown=max(seconds, 0))
            return False
        case HeldByPause():
            return hold_for_pause(run, step, outcome, held_by=lease)
        case Park():
            return park(run, step, outcome, held_by=lease)
        case AskApproval(approval=approval):
            request = people().ask(run, step, approval)
            Wait.open(step, Wait.Kind.APPROVAL, due_at=approval.due_at)
            step.request_approval(
                held_by=lease,
                approval=request,
                queue=approval.queue,
                reason=approval.reason,
                tool=approval.tool,
                # A call the gate stopped (runs.engine.gate): not a failure, a question.
                routing=None if step.kind == StepKind.APPROVAL else GATE_ROUTING,
            )
            run.ask_human(approval.reason, queue=approval.queue, due_at=approval.due_at)
            return False
        case UnknownOutcome(error=error):
            return route_failure(
                run, step, FailureClass.UNKNOWN_OUTCOME, error, held_by=lease, tool=step.tool
            )
        case Failed(failure_class=failure_class, error=error, to_person=to_person):
            tool = claim.definition.tool or step.tool
            if to_person is not None:
                return escalate_to_person(
                    run, step, failure_class, error, held_by=lease, tool=tool, routing=to_person
                )
            return route_failure(run, step, failure_class, error, held_by=lease, tool=tool)
    raise TypeError(f"not an outcome: {outcome!r}")

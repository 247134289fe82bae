"""SLA breaches: runs that stayed with a person past their due time (Run.attention_due_at; for an
approval that is ApprovalRequest.due_at) are escalated by the sweeper, once per due time.

The route is the escalation rule that matches the run's current step with failure class
`timeout` (the same one that routes an event wait that timed out):
- escalate (the default): the run, and its pending approval, move to the rule's `escalate_to`
  queue (or stay in theirs), one escalation level up, with the rule's `escalate_after_seconds`
  as the new SLA (none when 0: the run then stays marked as breached);
- fail: a pending approval expires and the run fails;
- compensate: a pending approval expires and the run's committed side effects are undone.
A step whose outcome is unknown is only ever escalated: failing or compensating it would guess
(docs/architecture.md, invariant 4). Taken-over runs are left to their owner.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import IntegrityError, transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from approvals.models import ApprovalRequest, SlaBreach
from runs.engine import Origin, Route, choose, end_step
from runs.models import FailureClass, RouteAction, Run, Step, Wait

A = RouteAction


def overdue_runs(now: datetime, batch: int) -> list:
    """Runs waiting for a person past their due time and not yet escalated for it (served by
    the inbox index run_inbox_idx and the breach table's unique (run, due_at))."""
    escalated = SlaBreach.objects.filter(run=OuterRef("pk"), due_at=OuterRef("attention_due_at"))
    return list(
        Run.objects.filter(status=Run.Status.NEEDS_HUMAN, attention_due_at__lte=now)
        .exclude(Exists(escalated))
        .order_by("attention_due_at")
        .values_list("pk", flat=True)[:batch]
    )


def escalate_overdue(run_id, now: datetime | None = None) -> bool:
    """Escalate one overdue run, once for its current due time. Returns False when there was
    nothing to do (already escalated, decided, or no longer overdue).

    1. Lock the run; re-check it still waits for a person past its due time.
    2. Route the breach (runs.engine.routing, failure class `timeout`, origin SLA) for its
       current step (workflow, step, tool, risk).
    3. Record the SlaBreach (unique per run and due time) and `run.sla_breached` naming the rule
       (its notification intents are recorded by the same event), one level up.
    4. Apply the rule's action (see the module docstring).
    """
    now = now or timezone.now()
    with transaction.atomic():
        run = Run.objects.select_for_update().filter(pk=run_id).first()
        if run is None or run.status != Run.Status.NEEDS_HUMAN:
            return False
        if run.attention_due_at is None or run.attention_due_at > now:
            return False
        step = run.steps.filter(status__in=Step.UNFINISHED).order_by("position").first()
        approval = None
        if step is not None and step.kind == "approval":
            approval = ApprovalRequest.objects.filter(
                step=step, status=ApprovalRequest.Status.PENDING
            ).first()
        route = choose(
            run,
            step,
            FailureClass.TIMEOUT,
            origin=Origin.SLA,
            tool=(approval.tool if approval else "") or (step.tool if step else ""),
            risk=approval.risk if approval else None,
        )
        breach = _record_breach(run, route, approval, now)
        if breach is None:
            return False  # escalated for this due time already
        if route.action == A.ESCALATE:
            return True
        reason = (
            f"No decision by {breach['due_at']:%Y-%m-%d %H:%M:%S} UTC; rule "
            f"{route.routing.get('rule')!r}: {breach['outcome']}."
        )
        if approval is not None:
            approval.expire(by="sla")
            for wait in Wait.objects.filter(
                step=step, kind=Wait.Kind.APPROVAL, status=Wait.Status.PENDING
            ):
                wait.expire()
        end_step(run, step, route, FailureClass.TIMEOUT, reason, origin=Origin.SLA)
        return True


def _record_breach(run: Run, route: Route, approval, now: datetime) -> dict | None:
    """The SlaBreach row and `run.sla_breached` (one level up, the rule's queue and next SLA);
    None when this due time was escalated before."""
    rule, action = route.rule, route.action
    due, from_queue = run.attention_due_at, run.queue
    to_queue = (rule.escalate_to if rule and action == A.ESCALATE else "") or from_queue
    next_due = due
    if action == A.ESCALATE and rule and rule.escalate_after_seconds:
        next_due = now + timedelta(seconds=rule.escalate_after_seconds)
    try:
        with transaction.atomic():
            SlaBreach.objects.create(
                run=run,
                due_at=due,
                breached_at=now,
                level=run.escalation_level + 1,
                from_queue=from_queue,
                to_queue=to_queue,
                action=action,
                rule=rule.describe() if rule else {},
            )
    except IntegrityError:
        return None
    if action == A.ESCALATE:
        moved = f"moved to queue {to_queue}" if to_queue != from_queue else f"kept in {from_queue}"
        outcome = f"{moved}, escalation level {run.escalation_level + 1}"
    elif action == A.FAIL:
        outcome = "the run fails"
    else:
        outcome = "committed side effects are undone"
    data = {
        "due_at": due,
        "waiting_for": "approval" if approval is not None else "person",
        "rule": route.routing,
        "action": action,
        "level": run.escalation_level + 1,
        "from_queue": from_queue,
        "to_queue": to_queue,
        "next_due_at": next_due if next_due != due else None,
        "outcome": outcome,
    }
    event = run.breach_sla(queue=to_queue, due_at=next_due, data=data)
    if approval is not None and action == A.ESCALATE:
        approval.requeue(to_queue, next_due)
    # The breach's notifications, recorded in its transaction (keyed: at most once each).
    from approvals import notifications  # not at a worker's start (approvals.tasks)

    notifications.record_event(run.pk, event.verb, event.seq, event.data)
    return data

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
from django.db.models import Exists, F, OuterRef
from django.utils import timezone

from approvals import notifications
from approvals.models import ApprovalRequest, EscalationRule, SlaBreach
from runs import tools as tool_registry
from runs.models import FailureClass, Run, Step, TimelineEvent, Wait

A = EscalationRule.Action


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


def _risk(step: Step | None, approval: ApprovalRequest | None) -> str:
    if approval is not None:
        return approval.risk
    if step is not None and step.tool:
        try:
            return tool_registry.get(step.tool).risk
        except tool_registry.UnknownTool:
            return ""
    return ""


def escalate_overdue(run_id, now: datetime | None = None) -> bool:
    """Escalate one overdue run, once for its current due time. Returns False when there was
    nothing to do (already escalated, decided, or no longer overdue).

    1. Lock the run; re-check it still waits for a person past its due time.
    2. Find the `timeout` rule for its current step (workflow, step, tool, risk).
    3. Record the SlaBreach (unique per run and due time) and `run.sla_breached` naming the rule
       (its notification intents are recorded by the same event), one level up.
    4. Apply the rule's action (see the module docstring).
    """
    from runs import engine

    now = now or timezone.now()
    with transaction.atomic():
        run = Run.objects.select_for_update().filter(pk=run_id).first()
        if (
            run is None
            or run.status != Run.Status.NEEDS_HUMAN
            or run.attention_due_at is None
            or run.attention_due_at > now
        ):
            return False
        step = run.steps.filter(status__in=Step.UNFINISHED).order_by("position").first()
        approval = None
        if step is not None and step.kind == "approval":
            approval = ApprovalRequest.objects.filter(
                step=step, status=ApprovalRequest.Status.PENDING
            ).first()
        rule = EscalationRule.first_match(
            workflow=run.workflow,
            step=step.name if step else "",
            tool=(approval.tool if approval else "") or (step.tool if step else ""),
            failure_class=FailureClass.TIMEOUT,
            risk=_risk(step, approval),
        )
        action = rule.action if rule else A.ESCALATE
        if action not in (A.FAIL, A.COMPENSATE) or step is None:
            action = A.ESCALATE
        if step is not None and step.status == Step.Status.UNKNOWN_OUTCOME:
            action = A.ESCALATE
        due = run.attention_due_at
        from_queue = run.queue
        to_queue = (rule.escalate_to if rule and action == A.ESCALATE else "") or from_queue
        level = run.escalation_level + 1
        next_due = due
        if action == A.ESCALATE and rule and rule.escalate_after_seconds:
            next_due = now + timedelta(seconds=rule.escalate_after_seconds)
        try:
            with transaction.atomic():
                SlaBreach.objects.create(
                    run=run, due_at=due, breached_at=now, level=level, from_queue=from_queue,
                    to_queue=to_queue, action=action, rule=rule.describe() if rule else {},
                )  # fmt: skip
        except IntegrityError:
            return False  # escalated for this due time already
        Run.objects.filter(pk=run.pk).update(
            escalation_level=F("escalation_level") + 1,
            queue=to_queue,
            attention_due_at=next_due,
            updated_at=now,
        )
        if approval is not None and action == A.ESCALATE:
            ApprovalRequest.objects.filter(pk=approval.pk).update(queue=to_queue, due_at=next_due)
        routing = {**(rule.describe() if rule else {"rule": "(no rule matched)"}),
                   "failure_class": FailureClass.TIMEOUT}  # fmt: skip
        what = "approval" if approval is not None else "person"
        if action == A.ESCALATE:
            outcome = (
                f"moved to queue {to_queue}" if to_queue != from_queue else f"kept in {from_queue}"
            ) + f", escalation level {level}"
        elif action == A.FAIL:
            outcome = "the run fails"
        else:
            outcome = "committed side effects are undone"
        breach = TimelineEvent.append(
            run.pk,
            "run.sla_breached",
            {
                "due_at": due,
                "waiting_for": what,
                "rule": routing,
                "action": action,
                "level": level,
                "from_queue": from_queue,
                "to_queue": to_queue,
                "next_due_at": next_due if next_due != due else None,
                "outcome": outcome,
            },
        )
        # The breach's notifications, recorded in its transaction (keyed: at most once each).
        notifications.record_event(run.pk, breach.verb, breach.seq, breach.data)
        if action == A.ESCALATE:
            return True
        reason = (
            f"No decision by {due:%Y-%m-%d %H:%M:%S} UTC; rule {routing.get('rule')!r}: {outcome}."
        )
        if approval is not None:
            ApprovalRequest.objects.filter(pk=approval.pk).update(
                status=ApprovalRequest.Status.EXPIRED
            )
            Wait.objects.filter(
                step=step, kind=Wait.Kind.APPROVAL, status=Wait.Status.PENDING
            ).update(status=Wait.Status.EXPIRED, resolved_at=now, resolved_by="sla")
        step.transition(
            Step.Status.FAILED,
            verb="step.failed",
            routing=routing,
            error_class=FailureClass.TIMEOUT,
            last_error=reason,
            data={"routing": routing},
        )
        if action == A.FAIL:
            run.fail(reason)
        else:
            engine.begin_compensation(run, reason)
        return True

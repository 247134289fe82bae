"""What every action on a run shares (approvals/actions.py): the run locked first with its
version checked and the person's permission, the current step, the structured record of the
decision, the waits nobody waits for any more cancelled, the run handed back to the engine."""

from __future__ import annotations

from contextvars import ContextVar

from django.utils import timezone

from approvals.models import ApprovalRequest, HumanDecision, shown
from approvals.permissions import DecisionConflict, check_may_act
from runs.engine import enqueue
from runs.models import Run, Snapshot, Step, Wait, to_json_value

# Set by approvals/bulk.py while it carries out one item of a bulk action: the decision the
# action records names the bulk action (HumanDecision.bulk_action).
BULK_ACTION: ContextVar[int | None] = ContextVar("bulk_action", default=None)


def actor_name(user) -> str:
    return f"user:{user.get_username()}"


def lock_run(run_id, expected_version: int | None, user=None, *, action: str) -> Run:
    """Lock the run (always the first row a transaction locks), check that it has not moved on
    since the person loaded it, then that `user` may take `action` on it now."""
    run = Run.objects.select_for_update(of=("self",)).select_related("owner").get(pk=run_id)
    check_version(run, expected_version)
    check_may_act(run, user, action)
    return run


def check_version(run: Run, expected_version: int | None) -> None:
    if expected_version is not None and run.lock_version != expected_version:
        last = HumanDecision.objects.filter(run=run).select_related("user").order_by("-id").first()
        who = (
            f" — last action: {last.get_verb_display().lower()} by {last.user.get_username()} "
            f"at {timezone.localtime(last.created_at):%Y-%m-%d %H:%M:%S}"
            if last
            else ""
        )
        raise DecisionConflict(
            f"This run changed since you opened it (its status is now “{run.get_status_display()}”)"
            f"{who}. Reload to see where it stands."
        )


def current_step(run: Run) -> Step | None:
    return (
        Step.objects.select_for_update()
        .filter(run=run, status__in=Step.UNFINISHED)
        .order_by("position")
        .first()
    )


def record_decision(
    run,
    user,
    verb,
    *,
    step=None,
    approval=None,
    snapshot=None,
    shown=None,
    before=None,
    after=None,
    proof="",
    comment="",
    conditions=(),
) -> HumanDecision:
    """The structured record of a person's action, bound to what they were shown: the approval
    (tool, target, parameters and their digest), the snapshot of the call they settled, or the
    parameters they edited. Nothing else is guessed onto it."""
    return HumanDecision.objects.create(
        run=run,
        step=step,
        approval=approval,
        user=user,
        verb=verb,
        snapshot=snapshot,
        shown=to_json_value(shown or (snapshot_shown(snapshot) if snapshot else {})),
        before=to_json_value(before),
        after=to_json_value(after),
        proof=proof[:2000],
        comment=comment[:4000],
        conditions=list(conditions),
        bulk_action_id=BULK_ACTION.get(),
    )


def snapshot_shown(snapshot: Snapshot) -> dict:
    return shown(snapshot.tool, snapshot.params)


def cancel_waiting(*, run=None, step=None, actor: str, reason: str, waits: bool = True) -> None:
    """Nobody waits any more for the step (or the run): its pending waits and approval
    requests are cancelled, each with its event."""
    scope = {"step": step} if step is not None else {"run": run}
    if waits:
        for wait in Wait.objects.filter(status=Wait.Status.PENDING, **scope):
            wait.cancel(by=actor, actor=actor)
    for approval in ApprovalRequest.objects.filter(
        status=ApprovalRequest.Status.PENDING, **scope
    ).select_related("step"):
        approval.cancel(actor=actor, reason=reason)


def resume(run: Run, user, reason: str) -> None:
    """Hand the run back to the engine (a taken-over run stays with its owner)."""
    if run.status == Run.Status.NEEDS_HUMAN:
        run.resume(actor=actor_name(user), reason=reason)
    if run.status in Run.RUNNABLE:
        enqueue(run.pk)

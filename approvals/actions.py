"""What people do to runs: every action checks who may take it (approvals/permissions.py, the
same rule for the console and the API) under the run's row lock, with a compare-and-set on its
version, is recorded as a HumanDecision and a timeline event in the same transaction, and leaves
the run where the engine can pick it up.

Lock order (as everywhere, see `Run.lock` in runs/models/run.py): the Run row first, then its Step,
then SideEffect / Wait / ApprovalRequest rows.

Two people acting at once, a double submit, or acting on a run that moved on: exactly one wins;
the other gets DecisionConflict saying who did what, and when.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from approvals.acting import (
    actor_name,
    cancel_waiting,
    check_version,
    current_step,
    lock_run,
    record_decision,
    resume,
)
from approvals.gate import requirement
from approvals.models import (
    ApprovalRequest,
    HumanDecision,
    Takeover,
    known_queues,
    params_diff,
    shown,
)
from approvals.params import InvalidParams, validate_params
from approvals.permissions import (
    ActionForbidden,
    ActionRefused,
    DecisionConflict,
    can_act,
    check_may_act,
)
from runs import tools as tool_registry
from runs.conditions import ConditionError, parse_text
from runs.conditions import validate as validate_conditions
from runs.engine import begin_compensation, enqueue, undoable
from runs.models import Receipt, Run, SideEffect, Snapshot, Step, Wait, digest, to_json_value

D = ApprovalRequest.Decision
DECISION_VERBS = {
    D.APPROVED: "approve",
    D.APPROVED_WITH_EDITS: "approve_with_edits",
    D.REJECTED: "reject",
}


__all__ = [
    "ActionForbidden",
    "ActionRefused",
    "DecisionConflict",
    "InvalidParams",
    "check_may_act",
    "validate_params",
]


# --------------------------------------------------------------------------------------------
# Approvals


def decide_approval(
    approval_id: int,
    user,
    decision: str,
    *,
    edited_params: dict | None = None,
    comment: str = "",
    expected_version: int | None = None,
    conditions: list | None = None,
) -> ApprovalRequest:
    """Record a person's decision on an approval and resume (or compensate) the run.

    1. Lock the run, its step, then the request (the lock order); if the request is no longer
       pending, raise DecisionConflict naming who decided.
    2. Validate edited parameters against the tool's schema; store the decision, resolve the
       approval wait, write the HumanDecision bound to what the person was shown (tool, target,
       proposed parameters and their digest) with the edits as a diff.
    3. Approve: the step succeeds with the (edited) parameters and the run resumes; the side
       effect that follows snapshots exactly those parameters and names this decision. Reject:
       the step fails and committed side effects are compensated (or the run is cancelled when
       there is nothing to undo).
    """
    if decision not in D.values:
        raise ActionRefused(f"decision must be one of {', '.join(D.values)}")
    with transaction.atomic():
        run, step, approval = _lock_pending_approval(approval_id, user, expected_version)
        decision, params, conditions = _what_is_approved(
            approval, decision, edited_params, conditions
        )
        if decision != D.REJECTED:
            # Counted on the parameters approved, never on the ones first proposed: an edit
            # that raises the amount past a two-person threshold needs a second person.
            _require_approvers(run, step, approval, params)
        if approval.approvals_required > 1:
            check_may_approve_twoperson(run, approval, user, decision)
        if decision != D.REJECTED and approval.approvals_required > 1:
            if not approval.awaits_second:
                _approve_first(run, step, approval, user, decision, params, comment, conditions)
                return approval
            # Either approver's conditions apply: the call must meet all of them.
            conditions = approval.first_conditions + [
                c for c in conditions if c not in approval.first_conditions
            ]
            if params != approval.proposed_params:
                decision = D.APPROVED_WITH_EDITS  # the first approver's edits
        approval.decide(user, decision, params=params, comment=comment, conditions=conditions)
        _carry_out(run, step, approval, user, decision, params, comment, conditions)
    approval.refresh_from_db()
    return approval


def _require_approvers(run: Run, step: Step, approval: ApprovalRequest, params: dict) -> None:
    """Raise the request's number of approvers to what the gate's rules ask for these
    parameters (approvals.gate.requirement: the same answer the call will meet)."""
    if not approval.tool:
        return
    try:
        tool = tool_registry.get(approval.tool)
    except tool_registry.UnknownTool:
        return
    declared = step.name if step.kind == "approval" else ""
    need = requirement(
        workflow=run.workflow, step=step.name, tool=tool, params=params, declared=declared
    )
    if need.approvers > approval.approvals_required:
        approval.require_approvers(need.approvers, reasons=need.reasons, because=need.rules)


def _what_is_approved(approval, decision, edited_params, conditions) -> tuple[str, dict, list]:
    """The decision, the parameters it approves (edits validated against the tool's schema)
    and its conditions (validated against those parameters)."""
    params = approval.approved_params
    if decision == D.APPROVED_WITH_EDITS:
        params = validate_params(approval.tool, edited_params, proposed=params)
        if params == approval.approved_params:
            decision = D.APPROVED  # nothing was changed
        elif approval.awaits_second:
            raise ActionRefused(
                f"{approval.first_approved_by.get_username()} approved these parameters; "
                "as the second approver, approve them as they are or reject."
            )
    if conditions and decision == D.REJECTED:
        raise InvalidConditions("A rejection takes no conditions.")
    try:
        conditions = validate_conditions(conditions, params)
    except ConditionError as exc:
        raise InvalidConditions(str(exc), index=exc.index) from None
    return decision, params, conditions


def _approve_first(run, step, approval, user, decision, params, comment, conditions) -> None:
    """The first of two approvals: recorded and shown; the run waits for the second."""
    approval.approve_first(user, params=params, comment=comment, conditions=conditions)
    record_decision(
        run,
        user,
        DECISION_VERBS[decision],
        step=step,
        approval=approval,
        shown=approval.shown(),
        before=approval.proposed_params,
        after=params,
        comment=comment,
        conditions=conditions,
    )


def _carry_out(run, step, approval, user, decision, params, comment, conditions) -> None:
    """A decided approval: resolve its wait, record the decision bound to what was shown, then
    resume the run with the approved call, or fail the step and undo what was done."""
    actor = actor_name(user)
    for wait in Wait.objects.filter(step=step, kind=Wait.Kind.APPROVAL, status=Wait.Status.PENDING):
        wait.resolve({"decision": decision}, by=actor, actor=actor)
    edited = decision == D.APPROVED_WITH_EDITS
    diff = params_diff(approval.proposed_params, params)
    record = record_decision(
        run,
        user,
        DECISION_VERBS[decision],
        step=step,
        approval=approval,
        shown=approval.shown(),
        before=approval.proposed_params,
        after={"params": params, "diff": diff} if edited else params,
        comment=comment,
        conditions=conditions,
    )
    if decision == D.REJECTED:
        step.fail(error=f"rejected by {user.get_username()}: {comment}", actor=actor)
        Takeover.end(run, user, "rejected")
        begin_compensation(run, f"rejected by {user.get_username()}", actor=actor)
        return
    if step.kind != "approval":
        # The gate asked about this very call (runs.engine.gate): it is made again with the
        # approved parameters, and meets the gate again, which now finds this approval.
        _call_again(step, params, record, actor=actor)
        resume(run, user, f"approval {decision}")
        return
    # What the side effect after this step executes, and the decision its snapshot names
    # (runs.engine.ledger reads `human_decision`).
    first = approval.first_approved_by
    answer = {
        "decision": decision,
        "params": params,
        "by": user.get_username(),
        "comment": comment,
        "human_decision": record.reference(),
        **({"approved_by": [first.get_username(), user.get_username()]} if first else {}),
        # Enforced on the call (runs.engine.ledger): broken, nothing is called.
        **({"conditions": conditions} if conditions else {}),
    }
    step.succeed(answer, actor=actor)
    resume(run, user, f"approval {decision}")


def _call_again(step: Step, params: dict, record: HumanDecision, *, actor: str) -> None:
    """Send a side-effect step back to the engine to be called with `params`, which `record`
    approved or edited. A key whose earlier call is known not to have happened stays bound to
    its parameters: other parameters get the next key."""
    fields: dict[str, Any] = {
        "spec": {**step.spec, "params_override": params, "human_decision": record.reference()}
    }
    effect = SideEffect.objects.filter(step=step).order_by("-id").first()
    if effect is not None and effect.status == SideEffect.Status.COMMITTED:
        raise ActionRefused("This side effect already happened; it cannot be called again.")
    if effect is not None and effect.params_checksum != digest(params):
        fields["idempotency_key"] = _next_key(step, effect)
    step.request_retry(
        actor=actor,
        data={"approved": record.reference(), "new_key": fields.get("idempotency_key", "")},
        **fields,
    )


def _next_key(step: Step, effect: SideEffect) -> str:
    generation = SideEffect.objects.filter(step=step).count() + 1
    return f"{effect.idempotency_key.split('~r')[0]}~r{generation}"


def check_may_approve_twoperson(run: Run, approval: ApprovalRequest, user, decision: str) -> None:
    """A two-person approval's own rules, under the locks: the person who started the run or
    took it over approves neither time, and nobody approves twice. (Anyone allowed to decide
    may reject.)"""
    if decision == D.REJECTED:
        return
    name = user.get_username()
    if run.principal == f"user:{name}":
        raise ActionRefused(
            f"{name} started this run, so they cannot approve it: it needs two other people."
        )
    if Takeover.objects.filter(run=run, user=user).exists():
        raise ActionRefused(
            f"{name} took this run over, so they cannot approve it: it needs two other people."
        )
    if approval.first_approved_by_id == user.pk:
        raise ActionRefused(
            f"You already approved this; it needs a second approver other than {name}."
        )


def _lock_pending_approval(approval_id: int, user, expected_version):
    """The run, the step and the request, locked in that order, with the request still pending
    and the run as the person saw it; else DecisionConflict naming who decided and when."""
    run_id, step_id = ApprovalRequest.objects.values_list("run_id", "step_id").get(pk=approval_id)
    run = lock_run(run_id, None, user, action="decide")
    step = Step.objects.select_for_update().get(pk=step_id)
    approval = (
        ApprovalRequest.objects.select_for_update(of=("self",))
        .select_related("decided_by", "first_approved_by", "step")
        .get(pk=approval_id)
    )
    if approval.status != ApprovalRequest.Status.PENDING:
        who = approval.decided_by.get_username() if approval.decided_by else "the system"
        when = (
            f" at {timezone.localtime(approval.decided_at):%Y-%m-%d %H:%M:%S}"
            if approval.decided_at
            else ""
        )
        raise DecisionConflict(
            f"Already {approval.get_decision_display().lower() or approval.status} by {who}{when}."
        )
    check_version(run, expected_version)
    return run, step, approval


class InvalidConditions(ActionRefused):
    """Approval conditions that cannot be accepted (runs.conditions.validate says why)."""

    field = "conditions"

    def __init__(self, message: str, index: int | None = None):
        super().__init__(message)
        self.index = index


def parse_conditions(text: str, params: Any) -> list[dict]:
    """The console's conditions text (runs.conditions.parse_text), as InvalidConditions."""
    if not text or not text.strip():
        return []
    try:
        return parse_text(text, params if isinstance(params, dict) else {})
    except ConditionError as exc:
        raise InvalidConditions(str(exc), index=exc.index) from None


# --------------------------------------------------------------------------------------------
# Unknown outcomes


def confirm_outcome(
    step_id: int,
    user,
    *,
    happened: bool,
    proof: str = "",
    comment: str = "",
    expected_version: int | None = None,
) -> Step:
    """A person settles an unknown outcome: it happened (the external reference is the proof)
    or it did not (the step is retried with the same idempotency key)."""
    actor = actor_name(user)
    run_id = Step.objects.values_list("run_id", flat=True).get(pk=step_id)
    with transaction.atomic():
        run = lock_run(run_id, expected_version, user, action="settle an outcome of")
        step = Step.objects.select_for_update().get(pk=step_id)
        if step.status != Step.Status.UNKNOWN_OUTCOME:
            raise DecisionConflict(
                f"Step {step.name} is {step.get_status_display().lower()}, not an unknown "
                "outcome: someone has already settled it."
            )
        effect = SideEffect.objects.select_for_update().get(
            step=step, idempotency_key=step.idempotency_key
        )
        late = effect.status == SideEffect.Status.COMMITTED
        if late and not happened:
            # The call's receipt came in while the question was open: it did happen.
            raise DecisionConflict(
                f"The tool's receipt for {step.name} came in meanwhile (external id "
                f"{effect.external_id or 'none given'}): it happened. Confirm that it happened."
            )
        observed = (effect.changed_result or {}).get("observed")
        if happened:
            proof = proof.strip() or (effect.external_id if late else "")
            if observed and proof == observed.get("external_id"):
                # Accepting what the tool now reports for the key (reconciliation found it
                # there, but not as the snapshot expected): its answer is the receipt.
                return _accept_changed_result(run, user, step, effect, observed, comment)
            if not proof:
                raise ActionRefused(
                    "To confirm it happened, give the external reference (e.g. the message or "
                    "record id) as proof."
                )
            # Shaped like a tool response, so later steps read it the same way.
            answer = {"id": proof, "external_id": proof, "confirmed_by": actor}
            if late:  # the tool's own receipt is in the ledger: it is the step's answer
                answer = effect.receipt.get("response", answer)
            else:
                effect.commit(
                    Receipt(proof, {**answer, "comment": comment}), confirmed_by=actor, actor=actor
                )
            step.succeed(answer, actor=actor)
        else:
            effect.mark_not_committed(confirmed_by=actor, actor=actor)
            step.request_retry(actor=actor)
        record_decision(
            run,
            user,
            "confirm_happened" if happened else "confirm_not_happened",
            step=step,
            snapshot=effect.snapshot,
            before={"status": "committed by a late receipt" if late else "unknown"},
            after={"status": effect.status},
            proof=proof,
            comment=comment,
        )
        resume(run, user, "outcome confirmed")
    return step


def _accept_changed_result(run, user, step, effect, observed: dict, comment: str) -> Step:
    """confirm_outcome's "it happened, as the tool now reports it": the tool's answer found by
    key becomes the receipt and the step's result, confirmed by the person."""
    actor = actor_name(user)
    answer = observed.get("response")
    changes = effect.changed_result.get("changes", {})
    effect.commit(
        Receipt(observed.get("external_id", ""), answer),
        confirmed_by=actor,
        actor=actor,
        data={"accepted_changed_result": True},
    )
    step.succeed(answer, actor=actor)
    record_decision(
        run,
        user,
        "confirm_happened",
        step=step,
        snapshot=effect.snapshot,
        before={"status": "unknown", "expected": changes.get("expected", {})},
        after={"status": effect.status, "accepted": observed.get("response_digest", "")},
        proof=observed.get("external_id", ""),
        comment=comment,
    )
    resume(run, user, "changed result accepted")
    return step


# --------------------------------------------------------------------------------------------
# Steps: retry now, retry with edits, skip, done by hand


def retry_step(run_id, user, *, comment: str = "", expected_version=None) -> Step:
    actor = actor_name(user)
    with transaction.atomic():
        run = lock_run(run_id, expected_version, user, action="retry a step of")
        step = current_step(run)
        _refuse_unknown(step)
        if step is None:
            raise ActionRefused("There is no unfinished step to retry.")
        if step.status in (Step.Status.NEEDS_HUMAN, Step.Status.PENDING):
            if step.kind == "approval" or _awaits_approval(step):
                raise ActionRefused("This step is an approval: approve or reject it instead.")
            if step.status == Step.Status.NEEDS_HUMAN:
                step.request_retry(actor=actor)
        elif step.status in (Step.Status.RETRY_SCHEDULED, Step.Status.WAITING):
            if Wait.objects.filter(
                step=step, status=Wait.Status.PENDING, kind__in=[Wait.Kind.EVENT, Wait.Kind.TIMER]
            ).exists():
                raise ActionRefused("This step waits for an event or a timer, not for a retry.")
            step.retry_now(actor=actor)
            if run.status == Run.Status.WAITING:
                run.resume(actor=actor, reason="retry now")
        else:
            raise ActionRefused(f"Step {step.name} is {step.status}; it cannot be retried now.")
        record_decision(run, user, "retry", step=step, comment=comment)
        resume(run, user, "retry now")
    return step


def retry_with_edits(run_id, user, params: dict, *, comment: str = "", expected_version=None):
    """Fix the parameters of a step that a person has to look at, and run it again.

    A side effect known not to have happened gets a new idempotency key (the old key stays
    bound to the old parameters); one whose outcome is unknown cannot be edited.
    """
    actor = actor_name(user)
    with transaction.atomic():
        run = lock_run(run_id, expected_version, user, action="edit a step of")
        step = current_step(run)
        _refuse_unknown(step)
        if (
            step is None
            or step.status != Step.Status.NEEDS_HUMAN
            or step.kind not in ("side_effect", "read")
        ):
            raise ActionRefused(
                "Only a read or side-effect step waiting for a person can be edited and retried."
            )
        before = _last_params(step)
        params = validate_params(step.tool, params, proposed=before)
        spec = {**step.spec, "params_override": params}
        fields = {"spec": spec}
        if step.kind == "side_effect":
            effect = SideEffect.objects.filter(step=step).order_by("-id").first()
            if effect is not None and effect.status == SideEffect.Status.COMMITTED:
                raise ActionRefused("This side effect already happened; it cannot be edited.")
            if effect is not None:
                fields["idempotency_key"] = _next_key(step, effect)
        # An approval the gate asked for covers the parameters it showed, not these: the call
        # with the edited parameters meets the gate again (runs.engine.gate).
        cancel_waiting(step=step, actor=actor, reason="parameters edited")
        record = record_decision(
            run,
            user,
            "approve_with_edits",
            step=step,
            shown=shown(step.tool, before),
            before=before,
            after={"params": params, "diff": params_diff(before, params)},
            comment=comment,
        )
        # The new attempt's snapshot names the decision it executes (runs.engine.ledger).
        fields["spec"]["human_decision"] = record.reference()
        step.request_retry(
            actor=actor,
            data={
                "edited": params_diff(before, params),
                "new_key": fields.get("idempotency_key", ""),
            },
            **fields,
        )
        resume(run, user, "retry with edited parameters")
    return step


def _awaits_approval(step: Step) -> bool:
    """A side-effect step the gate handed to people for approval of its call."""
    return ApprovalRequest.objects.filter(step=step, status=ApprovalRequest.Status.PENDING).exists()


def _last_params(step: Step) -> dict | None:
    snapshot = Snapshot.objects.filter(step=step).order_by("-id").first()
    if snapshot is not None:
        return snapshot.params
    return step.spec.get("params_override") or step.spec.get("params")


def _refuse_unknown(step: Step | None) -> None:
    if step is not None and step.status == Step.Status.UNKNOWN_OUTCOME:
        raise ActionRefused(
            "The outcome of this step is unknown: confirm whether it happened first."
        )


def skip_step(run_id, user, *, reason: str, expected_version=None) -> Step:
    actor = actor_name(user)
    if not reason.strip():
        raise ActionRefused("Say why the step is skipped.")
    with transaction.atomic():
        run = lock_run(run_id, expected_version, user, action="skip a step of")
        step = current_step(run)
        if step is None:
            raise ActionRefused("There is no unfinished step to skip.")
        _refuse_unknown(step)
        cancel_waiting(step=step, actor=actor, reason="step skipped")
        step.skip(reason=reason, actor=actor)
        record_decision(run, user, "skip", step=step, comment=reason)
        if run.status == Run.Status.WAITING:
            run.resume(actor=actor, reason="step skipped")
        resume(run, user, "step skipped")
    return step


def complete_by_hand(run_id, user, *, result: Any, comment: str = "", expected_version=None):
    """The person did the step's work outside TaskPilots; record its result and go on."""
    actor = actor_name(user)
    with transaction.atomic():
        run = lock_run(run_id, expected_version, user, action="complete a step of")
        step = current_step(run)
        if step is None:
            raise ActionRefused("There is no unfinished step to complete.")
        _refuse_unknown(step)
        if step.kind == "approval":
            # Its result is what the call after it executes: only a decision may give one.
            raise ActionRefused("This step is an approval: approve or reject it instead.")
        result = to_json_value(result)
        effect = SideEffect.objects.filter(step=step).order_by("-id").first()
        if effect is not None and effect.status == SideEffect.Status.INTENDED:
            raise ActionRefused("A worker is calling the tool right now; wait for it.")
        for wait in Wait.objects.filter(step=step, status=Wait.Status.PENDING):
            wait.resolve(None, by=actor, actor=actor)
        cancel_waiting(step=step, actor=actor, reason="step done by hand", waits=False)
        if step.status in (Step.Status.RETRY_SCHEDULED, Step.Status.PENDING):
            step.escalate(failure_class="", error="", routing={}, actor=actor)
        step.complete_by_hand(result, actor=actor)
        record_decision(run, user, "complete_by_hand", step=step, after=result, comment=comment)
        if run.status == Run.Status.WAITING:
            run.resume(actor=actor, reason="step done by hand")
        resume(run, user, "step done by hand")
    return step


# --------------------------------------------------------------------------------------------
# Takeover and cancel


def take_over(run_id, user, *, comment: str = "", expected_version=None) -> Run:
    """Claim the run: automation stops touching it until it is released."""
    with transaction.atomic():
        run = lock_run(run_id, expected_version, user, action="take over")
        if run.status == Run.Status.TAKEN_OVER:
            raise DecisionConflict(f"Already taken over by {run.owner.get_username()}.")
        if run.is_terminal:
            raise ActionRefused(f"The run is {run.status}; there is nothing to take over.")
        Takeover.begin(run, user)
        record_decision(run, user, "take_over", comment=comment)
    return run


def release(
    run_id,
    user,
    *,
    needed_engineer: bool,
    engineer_note: str = "",
    comment: str = "",
    expected_version=None,
) -> Run:
    """Give the run back: to the engine if its step can go on, otherwise to the inbox. The
    person says whether handling it needed an engineer (the takeover-cost metrics read it)."""
    if not isinstance(needed_engineer, bool):
        raise ActionRefused("Say whether this run needed an engineer (yes or no).")
    with transaction.atomic():
        run = lock_run(run_id, expected_version, user, action="release")
        if run.status != Run.Status.TAKEN_OVER:
            raise DecisionConflict("The run is not taken over.")
        Takeover.end(
            run,
            user,
            comment or "released",
            needed_engineer=needed_engineer,
            engineer_note=engineer_note,
        )
        step = current_step(run)
        parked = step is not None and step.status in (
            Step.Status.NEEDS_HUMAN,
            Step.Status.UNKNOWN_OUTCOME,
        )
        answer = {"needed_engineer": needed_engineer, "engineer_note": engineer_note[:2000]}
        record_decision(run, user, "release", after=answer, comment=comment)
        if parked:
            run.release(user)
        elif step is not None and step.status == Step.Status.WAITING:
            run.release(user, to=Run.Status.WAITING)
        else:
            run.release(user, to=Run.Status.RUNNING)
            enqueue(run.pk)
    return run


def cancel_run(
    run_id,
    user=None,
    *,
    reason: str,
    compensate: bool = True,
    expected_version=None,
    actor: str = "system",
) -> Run:
    """Stop the run; committed side effects are compensated (newest first) unless told not to.

    Without a `user` the caller acts on its own account (`actor`, e.g. an API client), which
    is refused on a taken-over run: only its owner or an admin decides about it.
    """
    actor = actor_name(user) if user else actor
    if not reason.strip():
        raise ActionRefused("Say why the run is cancelled.")
    with transaction.atomic():
        run = lock_run(run_id, expected_version, user, action="cancel")
        if run.is_terminal:
            raise DecisionConflict(f"The run is already {run.get_status_display().lower()}.")
        if run.status == Run.Status.COMPENSATING:
            raise DecisionConflict("The run is already being compensated.")
        step = current_step(run)
        if (
            step is not None
            and step.status == Step.Status.RUNNING
            and step.lease_expires_at
            and (step.lease_expires_at > timezone.now())
        ):
            raise ActionRefused(
                f"A worker is executing {step.name} right now; take the run over "
                "or try again in a moment."
            )
        _refuse_unknown(step)
        cancel_waiting(run=run, actor=actor, reason=f"run cancelled: {reason}")
        if user is not None:
            record_decision(run, user, "cancel", comment=reason)
            Takeover.end(run, user, f"cancelled: {reason}")
        committed = SideEffect.objects.filter(run=run, status=SideEffect.Status.COMMITTED)
        if compensate and committed.exists() and not _only_by_hand_left(step, committed):
            begin_compensation(run, f"cancelled: {reason}", actor=actor)
        else:
            run.cancel(reason, actor=actor)
    return run


def _only_by_hand_left(step: Step | None, committed) -> bool:
    """The run's compensation already ran and left it to a person (no step is left; what is
    still committed has no compensating tool): cancelling closes it rather than asking a person
    about the same effects again. The page said so before the person cancelled."""
    if step is not None:
        return False
    return not any(undoable(tool) for tool in committed.values_list("tool", flat=True))


def move_to_queue(run_id, user, *, queue: str, comment: str = "", expected_version=None) -> Run:
    """Hand a run that waits for a person to another queue (its inbox and channels hear of
    it: approvals.notifications), recorded as a `reassign` decision and `run.requeued`."""
    queue = (queue or "").strip()
    known = known_queues()
    if queue not in known:
        raise ActionRefused(
            f"Unknown queue {queue!r}: use one of {', '.join(known) or '(none configured)'}."
        )
    with transaction.atomic():
        run = lock_run(run_id, expected_version, user, action="reassign")
        if run.status != Run.Status.NEEDS_HUMAN:
            raise ActionRefused("Only a run that waits for a person can move to another queue.")
        if run.queue == queue:
            raise ActionRefused(f"The run is in {queue} already.")
        before = run.queue
        run.requeue(queue, actor=actor_name(user), reason=comment)
        record_decision(
            run, user, "reassign", before={"queue": before}, after={"queue": queue}, comment=comment
        )
    return run


def reassign(run_id, user, *, to, comment: str = "", expected_version=None) -> Run:
    """Hand a taken-over run to another person: the owner's takeover ends and `to`'s begins
    (both on the timeline), so automation still keeps its hands off the run."""
    if not can_act(to):
        raise ActionRefused(f"{to.get_username()} is not in the support or admin group.")
    with transaction.atomic():
        run = lock_run(run_id, expected_version, user, action="reassign")
        if run.status != Run.Status.TAKEN_OVER:
            raise DecisionConflict("The run is not taken over.")
        if run.owner_id == to.pk:
            raise DecisionConflict(f"{to.get_username()} already has this run.")
        before = run.owner.get_username()
        Takeover.end(run, user, f"reassigned to {to.get_username()}")
        run.release(user)
        Takeover.begin(run, to)
        after = {"owner": to.get_username()}
        record_decision(
            run, user, "reassign", before={"owner": before}, after=after, comment=comment
        )
    return run

"""Human actions on runs: each is recorded, resumes the run correctly, and loses cleanly when
someone else acted first."""

from __future__ import annotations

import threading

import pytest
from django.db import connections

from approvals import actions
from approvals.models import ApprovalRequest, HumanDecision, Takeover
from runs import engine
from runs.models import Run, SideEffect, Step, digest

pytestmark = pytest.mark.django_db

REPLY_INPUT = {"message": "Where is my refund?", "email": "ann@example.com", "ticket": "T-1"}


def start(workflow, input, **kw):
    run, _ = engine.start_run(workflow, input, **kw)
    return engine.run_until_quiet(run.pk)


def fresh(run):
    return Run.objects.get(pk=run.pk)


def test_take_over_stops_automation_until_release(sandbox, support_user):
    run = start("test.refund", {"amount": 150, "payment": "pay_1"})
    actions.take_over(run.pk, support_user, expected_version=run.lock_version)
    run = fresh(run)
    assert run.status == "taken_over" and run.owner == support_user
    assert engine.claim_next(run.pk) is None  # the engine leaves it alone
    actions.release(run.pk, support_user, needed_engineer=False)
    run = fresh(run)
    assert run.status == "needs_human" and run.owner is None
    assert Takeover.objects.get(run=run).ended_at is not None
    assert [d.verb for d in HumanDecision.objects.filter(run=run).order_by("id")] == [
        "take_over", "release"]  # fmt: skip


def test_only_the_owner_or_an_admin_decides_a_taken_over_run(sandbox, support_user, admin_user):
    from tests.factories import UserFactory

    other = UserFactory(username="other-support", groups=["support"])
    run = start("test.refund", {"amount": 150, "payment": "pay_1"})
    actions.take_over(run.pk, support_user)
    approval = ApprovalRequest.objects.get(run=run)
    with pytest.raises(actions.ActionForbidden, match="taken this run over"):
        actions.decide_approval(approval.pk, other, "approved")
    actions.decide_approval(approval.pk, admin_user, "approved")


def test_a_stale_page_loses_with_a_clear_message(sandbox, support_user, admin_user):
    run = start("test.refund", {"amount": 150, "payment": "pay_1"})
    seen = run.lock_version
    actions.take_over(run.pk, admin_user, expected_version=seen)
    with pytest.raises(actions.DecisionConflict, match="changed since you opened it.*alex-admin"):
        actions.cancel_run(run.pk, support_user, reason="dup", expected_version=seen)


@pytest.mark.django_db(transaction=True)
def test_two_people_deciding_at_once_exactly_one_wins(sandbox, support_user, admin_user):
    run = start("test.refund", {"amount": 150, "payment": "pay_1"})
    approval = ApprovalRequest.objects.get(run=run)
    barrier = threading.Barrier(2)
    results = []

    def decide(user, decision):
        try:
            barrier.wait()
            actions.decide_approval(approval.pk, user, decision)
            results.append("won")
        except actions.DecisionConflict as exc:
            results.append(str(exc))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=decide, args=(support_user, "approved")),
               threading.Thread(target=decide, args=(admin_user, "rejected"))]  # fmt: skip
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results.count("won") == 1
    assert any("Already" in r for r in results)
    assert HumanDecision.objects.filter(run=run).count() == 1


def test_retry_now_runs_an_escalated_step_again(sandbox, support_user):
    from tests.factories import EscalationRuleFactory

    EscalationRuleFactory(position=1, failure_class="transient", action="escalate")
    sandbox.inject("mail", "503", action="send")
    run = start("test.reply", REPLY_INPUT)
    assert run.status == "needs_human"
    actions.retry_step(run.pk, support_user, expected_version=run.lock_version)
    run = engine.run_until_quiet(run.pk)
    assert run.status == "succeeded"
    assert len(sandbox.ledger(system="mail", run=str(run.pk))) == 1


def test_edit_and_retry_uses_a_new_key_for_new_parameters(sandbox, support_user):
    run = start("test.reply", {**REPLY_INPUT, "ticket": ""})  # 422 from tickets
    step = Step.objects.get(run=run, name="close_ticket")
    old_key = step.idempotency_key
    with pytest.raises(actions.ActionRefused, match="ticket_id must be a string"):
        actions.retry_with_edits(run.pk, support_user, {"ticket_id": 7, "status": "solved"})
    actions.retry_with_edits(run.pk, support_user, {"ticket_id": "T-1", "status": "solved"})
    run = engine.run_until_quiet(run.pk)
    assert run.status == "succeeded"
    step.refresh_from_db()
    assert step.idempotency_key != old_key and step.idempotency_key.startswith(old_key)
    assert SideEffect.objects.get(idempotency_key=old_key).status == "not_committed"
    ledger = sandbox.ledger(system="tickets", run=str(run.pk))
    assert len(ledger) == 1 and ledger[0]["request"]["ticket_id"] == "T-1"


def test_an_unknown_outcome_cannot_be_skipped_or_retried(sandbox, support_user):
    sandbox.inject("crm", "commit_then_500", action="create")
    run = start("test.lead", {"email": "lee@example.com", "name": "Lee"})
    with pytest.raises(actions.ActionRefused, match="confirm whether it happened"):
        actions.skip_step(run.pk, support_user, reason="meh")
    with pytest.raises(actions.ActionRefused, match="confirm whether it happened"):
        actions.retry_step(run.pk, support_user)
    step = Step.objects.get(run=run, name="create_contact")
    with pytest.raises(actions.ActionRefused, match="proof"):
        actions.confirm_outcome(step.pk, support_user, happened=True, proof="  ")
    assert len(sandbox.ledger(system="crm")) == 1


def test_skip_and_done_by_hand(sandbox, support_user):
    run = start("test.refund", {"amount": 150, "payment": "pay_1"})
    with pytest.raises(actions.ActionRefused, match="Say why"):
        actions.skip_step(run.pk, support_user, reason=" ")
    # An approval's result is what the call after it executes: "done by hand" would approve
    # any parameters without an approval (no request decided, no rule counted).
    with pytest.raises(actions.ActionRefused, match="approve or reject"):
        forged = {"decision": "approved", "params": {"payment_id": "pay_1", "amount": 99999}}
        actions.complete_by_hand(run.pk, support_user, result=forged, comment="on the phone")
    assert ApprovalRequest.objects.get(run=run).status == "pending"
    approval = ApprovalRequest.objects.get(run=run)
    actions.decide_approval(approval.pk, support_user, "approved")
    run = engine.run_until_quiet(run.pk)
    assert run.status == "waiting"  # refund done, waiting for settlement
    actions.complete_by_hand(run.pk, support_user, result={"settled": True}, comment="by phone")
    run = engine.run_until_quiet(run.pk)
    assert run.status == "succeeded"
    assert [e["request"]["amount"] for e in sandbox.ledger(system="payments")] == [150]


def test_cancel_compensates_committed_effects(sandbox, support_user):
    run = start("test.refund", {"amount": 50, "payment": "pay_1"})
    assert run.status == "waiting"
    actions.cancel_run(run.pk, support_user, reason="customer withdrew")
    run = engine.run_until_quiet(run.pk)
    assert run.status == "compensated"
    actions_in_ledger = [e["action"] for e in sandbox.ledger(system="payments", run=str(run.pk))]
    assert actions_in_ledger == ["refund", "void"]
    with pytest.raises(actions.DecisionConflict, match="already"):
        actions.cancel_run(run.pk, support_user, reason="again")


def test_cancel_without_effects_just_cancels(support_user):
    run = start("test.timer", {})
    actions.cancel_run(run.pk, support_user, reason="not needed")
    assert fresh(run).status == "cancelled"


def test_a_decision_records_what_was_shown_and_the_call_names_it(sandbox, support_user):
    # A decision was once bound to the run's latest earlier snapshot, not to what the approver
    # saw; the call that carried it out did not say which decision it executed.
    run = start("test.refund", {"amount": 150, "payment": "pay_9"})
    approval = ApprovalRequest.objects.get(run=run)
    actions.decide_approval(
        approval.pk,
        support_user,
        "approved_with_edits",
        edited_params={"payment_id": "pay_9", "amount": 120},
    )
    decision = HumanDecision.objects.get(run=run, verb="approve_with_edits")
    shown = {"tool": "payments.refund", "target": approval.shown()["target"],
             "params": {"payment_id": "pay_9", "amount": 150}}  # fmt: skip
    assert decision.snapshot is None  # no call had been snapshotted: the proposal was shown
    assert {k: decision.shown[k] for k in shown} == shown
    assert decision.shown["digest"] == digest(shown)
    engine.run_until_quiet(run.pk)
    effect = SideEffect.objects.get(run=run, tool="payments.refund")
    assert effect.snapshot.params["amount"] == 120
    # ... and the approval the gate found covering exactly these parameters (runs.engine.gate).
    assert effect.snapshot.human_decision == {
        "id": decision.pk, "verb": "approve_with_edits", "by": support_user.get_username(),
        "tool": "payments.refund", "shown_digest": decision.shown["digest"],
        "approval": approval.pk, "approvers": [support_user.get_username()],
        "params_digest": digest(effect.snapshot.params), "required": 1,
        "reasons": ["the workflow asks for approval at approve"],
    }  # fmt: skip
    assert effect.snapshot.compute_checksum() == effect.snapshot.checksum


def test_an_edited_retry_names_the_edit_in_its_snapshot(sandbox, support_user):
    run = start("test.reply", {**REPLY_INPUT, "ticket": ""})
    step = Step.objects.get(run=run, status="needs_human")
    actions.retry_with_edits(run.pk, support_user, {"ticket_id": "T-1", "status": "solved"})
    decision = HumanDecision.objects.get(run=run, verb="approve_with_edits")
    assert decision.shown["tool"] == step.tool
    engine.run_until_quiet(run.pk)
    snapshot = SideEffect.objects.get(step=step, status="committed").snapshot
    assert snapshot.human_decision["id"] == decision.pk

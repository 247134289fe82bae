"""The three demo workflows from the seeds, end to end against the sandbox."""

from __future__ import annotations

import pytest

from approvals import actions
from approvals.models import ApprovalRequest
from runs import engine
from runs.models import Step

pytestmark = pytest.mark.django_db

REPLY = {"message": "I was charged twice, I want a refund", "email": "ann@example.com",
         "ticket_id": "T-100", "subject": "Double charge"}  # fmt: skip
LEAD = {"email": "lee@acme.example", "name": "Lee Chen", "company": "Acme", "employees": 900}


def run_to_rest(workflow, input):
    run, _ = engine.start_run(workflow, input, session_context_ref="conv-1")
    return engine.run_until_quiet(run.pk)


def test_support_reply_answers_from_the_knowledge_base(sandbox):
    run = run_to_rest("support.reply", REPLY)
    assert run.status == "succeeded"
    mail = sandbox.ledger(system="mail", run=str(run.pk))
    assert len(mail) == 1 and "refund" in mail[0]["request"]["body"].lower()
    assert len(sandbox.ledger(system="tickets", run=str(run.pk))) == 1


def test_support_reply_degrades_to_the_faq_when_search_is_down(sandbox):
    sandbox.inject("kb", "503", action="search", count=-1)
    run = run_to_rest("support.reply", REPLY)
    assert run.status == "succeeded"
    assert Step.objects.get(run=run, name="search_kb").status == "degraded"


def test_small_refund_runs_without_approval_and_waits_for_settlement(sandbox):
    run = run_to_rest("refund.approval", {"payment_id": "pay_1", "amount": 40})
    assert run.status == "waiting"
    refund = sandbox.ledger(system="payments", run=str(run.pk))[0]
    assert engine.deliver_event("settle-1", "payment.settled", refund["external_id"], {}) == (
        "resumed")  # fmt: skip
    assert engine.run_until_quiet(run.pk).status == "succeeded"


def test_large_refund_waits_for_a_person_then_settles(sandbox, support_user):
    run = run_to_rest("refund.approval", {"payment_id": "pay_2", "amount": 250})
    assert run.status == "needs_human"
    approval = ApprovalRequest.objects.get(run=run)
    assert "above the 100 threshold" in approval.reason
    actions.decide_approval(approval.pk, support_user, "approved")
    run = engine.run_until_quiet(run.pk)
    assert run.status == "waiting"
    assert len(sandbox.ledger(system="payments", run=str(run.pk))) == 1


def test_lead_sync_creates_tags_and_notifies(sandbox):
    sandbox.inject("crm", "429", action="tag", count=1)  # the tag tool is flaky
    run = run_to_rest("crm.lead_sync", LEAD)
    assert run.status == "running"  # the tag step is in backoff
    Step.objects.filter(run=run, status="retry_scheduled").update(next_attempt_at=None)
    run = engine.run_until_quiet(run.pk)
    assert run.status == "succeeded"
    crm = sandbox.ledger(system="crm", run=str(run.pk))
    assert [e["action"] for e in crm] == ["create", "tag"]
    assert crm[1]["request"]["tag"] == "enterprise:Acme"
    assert len(sandbox.ledger(system="mail", run=str(run.pk))) == 1


@pytest.mark.parametrize(
    ("workflow", "bad"),
    [("support.reply", {**REPLY, "email": ""}), ("refund.approval", {"payment_id": "p",
                                                                       "amount": -5}),
     ("crm.lead_sync", {"email": "x@example.com"})],
)  # fmt: skip
def test_bad_input_is_refused_at_start(workflow, bad):
    with pytest.raises(engine.StartError, match="must be"):
        engine.start_run(workflow, bad)

"""SLA breaches: a run left with a person past its due time escalates once per due time, by the
`timeout` rule that matches it (escalate to the next queue, or fail, or compensate)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from approvals import actions
from approvals.models import ApprovalRequest, EscalationRule, SlaBreach
from runs import engine
from runs.models import Run, Step, TimelineEvent, Wait
from tests.approvals.console_helpers import approval_run, fast_passwords, fresh  # noqa: F401

pytestmark = pytest.mark.django_db


def later(**delta):
    return timezone.now() + timedelta(**delta)


@pytest.fixture
def timeout_rule():
    rule = EscalationRule.objects.get(name="Timed-out wait: a person decides")
    rule.escalate_to = "supervisors"
    rule.escalate_after_seconds = 3600
    rule.save()
    return rule


def test_an_overdue_approval_escalates_once_to_the_next_queue(timeout_rule):
    run = approval_run()
    assert run.status == "needs_human" and run.queue == "support"
    assert run.attention_due_at is not None  # the approval SLA (4 h by default)
    now = later(hours=5)
    assert engine.sweep(now=now).sla_breaches == 1
    # A second pass (a retried or concurrent sweep) changes nothing.
    assert engine.sweep(now=now).sla_breaches == 0
    run = fresh(run)
    assert run.status == "needs_human"
    assert (run.queue, run.escalation_level) == ("supervisors", 1)
    assert run.attention_due_at == now + timedelta(hours=1)
    approval = ApprovalRequest.objects.get(run=run)
    assert approval.status == "pending"
    assert (approval.queue, approval.due_at) == ("supervisors", run.attention_due_at)
    event = TimelineEvent.objects.get(run=run, verb="run.sla_breached")
    assert event.data["rule"]["rule"] == timeout_rule.name
    assert event.data["rule"]["version"] == timeout_rule.version
    assert (event.data["from_queue"], event.data["to_queue"], event.data["level"]) == (
        "support",
        "supervisors",
        1,
    )
    assert SlaBreach.objects.filter(run=run).count() == 1
    # Missed again in the next queue: one more level.
    assert engine.sweep(now=now + timedelta(hours=2)).sla_breaches == 1
    assert fresh(run).escalation_level == 2


def test_without_a_next_sla_the_run_stays_breached_and_on_top(client, support_user):
    run = approval_run()
    due = timezone.now() - timedelta(minutes=1)
    Run.objects.filter(pk=run.pk).update(attention_due_at=due)
    assert engine.sweep().sla_breaches == 1
    assert engine.sweep(now=later(hours=50)).sla_breaches == 0
    run = fresh(run)
    assert run.attention_due_at == due and run.escalation_level == 1
    assert run.queue == "support"  # the default timeout rule escalates within the queue
    client.force_login(support_user)
    page = client.get("/console/").content.decode()
    assert page.count("SLA breached") == 1


def test_a_decided_approval_is_not_escalated(support_user):
    run = approval_run()
    approval = ApprovalRequest.objects.get(run=run)
    actions.decide_approval(approval.pk, support_user, "approved")
    assert engine.sweep(now=later(hours=5)).sla_breaches == 0
    assert not SlaBreach.objects.exists()


def test_a_taken_over_run_is_left_to_its_owner(support_user):
    run = approval_run()
    actions.take_over(run.pk, support_user)
    assert engine.sweep(now=later(hours=5)).sla_breaches == 0


def test_a_fail_rule_expires_the_approval_and_fails_the_run():
    EscalationRule.objects.create(position=1, name="Refund approvals expire",
                                  workflow="test.refund", failure_class="timeout",
                                  action="fail", queue="ops")  # fmt: skip
    run = approval_run()
    assert engine.sweep(now=later(hours=5)).sla_breaches == 1
    run = fresh(run)
    assert run.status == "failed"
    assert ApprovalRequest.objects.get(run=run).status == "expired"
    assert Wait.objects.get(run=run, kind="approval").status == "expired"
    step = Step.objects.get(run=run, name="approve")
    assert step.status == "failed" and step.error_class == "timeout"
    assert step.routing["rule"] == "Refund approvals expire"


def test_a_compensate_rule_undoes_the_run(sandbox):
    EscalationRule.objects.create(position=1, name="Refund approvals roll back",
                                  workflow="test.refund", failure_class="timeout",
                                  action="compensate", queue="ops")  # fmt: skip
    run = approval_run()
    assert engine.sweep(now=later(hours=5)).sla_breaches == 1
    # Nothing was committed before the approval: compensation has nothing to undo.
    assert fresh(run).status == "cancelled"


# --------------------------------------------------------------------------------------------
# Human-queue items: escalations and unknown outcomes get the routing rule's SLA too.


def test_an_escalated_failure_gets_the_rules_sla_and_escalates_past_it(
    sandbox, timeout_rule, client, support_user
):
    from tests.approvals.console_helpers import invalid_data_run

    rule = EscalationRule.objects.create(position=1, name="Bad ticket data: support, 30 min",
                                         workflow="test.reply", failure_class="invalid_input",
                                         action="escalate", queue="support",
                                         approval_sla_seconds=1800)  # fmt: skip
    before = timezone.now()
    run = invalid_data_run()
    assert (run.status, run.queue, run.escalation_level) == ("needs_human", "support", 1)
    assert before + timedelta(minutes=30) <= run.attention_due_at <= later(minutes=30)
    assert engine.sweep(now=later(minutes=20)).sla_breaches == 0
    now = later(minutes=31)
    assert engine.sweep(now=now).sla_breaches == 1
    run = fresh(run)
    assert run.status == "needs_human"  # a person still has to fix the data
    assert (run.queue, run.escalation_level) == ("supervisors", 2)
    assert run.attention_due_at == now + timedelta(hours=1)
    event = TimelineEvent.objects.get(run=run, verb="run.sla_breached")
    assert event.data["waiting_for"] == "person"
    # Editing the rule takes effect for the next escalation, without a restart.
    rule.approval_sla_seconds = 0
    rule.save()
    assert invalid_data_run().attention_due_at is None


def test_an_unknown_outcome_gets_an_sla_and_is_only_ever_escalated(sandbox, timeout_rule):
    from tests.approvals.console_helpers import unknown_outcome_run

    EscalationRule.objects.create(position=1, name="Unknown CRM outcomes fail past the SLA",
                                  failure_class="timeout", action="fail", queue="ops",
                                  workflow="test.lead")  # fmt: skip
    run = unknown_outcome_run(sandbox)
    assert run.status == "needs_human" and run.attention_due_at is not None
    level = run.escalation_level
    assert engine.sweep(now=later(hours=5)).sla_breaches == 1
    run = fresh(run)
    # Failing it would guess whether the CRM record exists: it is escalated instead.
    assert run.status == "needs_human" and run.escalation_level == level + 1
    assert Step.objects.get(run=run, status="unknown_outcome")

"""A local decision over a tool's metadata changes what the engine does: the escalation rule a
failure matches, the risk an approval records, whether an unknown outcome is sent again, and
whether a step may call the tool as a side effect."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from approvals import rules
from approvals.models import ApprovalRequest, ToolMetadataOverride
from runs import engine, tools
from runs.models import SideEffect, Snapshot, Step
from tests.approvals.console_helpers import fast_passwords  # noqa: F401  (autouse)
from tests.factories import EscalationRuleFactory

pytestmark = pytest.mark.django_db

REPLY = {"message": "Where is my refund?", "email": "ann@example.com", "ticket": "T-1"}


def decide(user, tool, **change):
    return ToolMetadataOverride.decide(tools.registered(tool), user, "decided here",
                                       confirmed=True, **change)  # fmt: skip


def run_of(workflow, input):
    run, _ = engine.start_run(workflow, input)
    return engine.run_until_quiet(run.pk)


def make_due(run):
    past = timezone.now() - timedelta(hours=1)
    Step.objects.filter(run=run, status__in=["retry_scheduled", "waiting"]).update(
        next_attempt_at=past
    )
    SideEffect.objects.filter(run=run).update(attempted_at=past)


def test_a_rule_for_high_risk_matches_a_tool_decided_high(sandbox, admin_user):
    EscalationRuleFactory(position=1, name="High risk goes to a person", risk="high",
                          failure_class="transient", action="escalate", queue="risky")  # fmt: skip
    sandbox.inject("mail", "429", action="send")
    before = run_of("test.reply", REPLY)  # mail.send is medium: the default retry
    assert Step.objects.get(run=before, name="send_reply").routing["rule"] == (
        "Retry transient errors"
    )

    decide(admin_user, "mail.send", risk="high")
    sandbox.inject("mail", "429", action="send")
    run = run_of("test.reply", {**REPLY, "ticket": "T-2"})
    step = Step.objects.get(run=run, name="send_reply")
    assert step.routing["rule"] == "High risk goes to a person"
    assert run.status == "needs_human" and run.queue == "risky"
    # The rule tester answers the same, from the tool's risk in force.
    verdict = rules.which_rule(tool="mail.send", failure_class="transient")
    assert verdict.risk == "high" and verdict.rule.name == "High risk goes to a person"


def test_an_approval_records_the_risk_in_force(sandbox, admin_user):
    decide(admin_user, "payments.refund", risk="medium")  # high in its code
    run = run_of("test.refund", {"amount": 150, "payment": "pay_1"})
    approval = ApprovalRequest.objects.get(run=run)
    assert (approval.tool, approval.risk) == ("payments.refund", "medium")


def test_a_tool_decided_not_to_dedupe_sends_an_unknown_outcome_to_a_person(sandbox, admin_user):
    # tickets.update dedupes by key in its code: an unknown outcome is simply sent again
    # (tests/runs/test_engine.py). Decided otherwise, a person is asked instead.
    decide(admin_user, "tickets.update", dedupes_by_key=False)
    sandbox.inject("tickets", "commit_then_500", action="update")
    run = run_of("test.reply", REPLY)
    make_due(run)
    run = engine.run_until_quiet(run.pk)
    assert run.status == "needs_human"
    step = Step.objects.get(run=run, name="close_ticket")
    assert step.status == "unknown_outcome"
    assert len(sandbox.ledger(system="tickets", run=str(run.pk))) == 1  # never sent again


def test_a_side_effect_step_refuses_a_tool_decided_to_be_a_read(sandbox, admin_user):
    # The confirmed loosening's documented effect on a workflow's own steps: nothing is sent
    # without a snapshot; the step fails as invalid input, for a person.
    decide(admin_user, "mail.send", side_effect=False)
    run = run_of("test.reply", REPLY)
    step = Step.objects.get(run=run, name="send_reply")
    assert step.error_class == "invalid_input"
    assert "mail.send is not a side-effect tool" in step.last_error
    assert not Snapshot.objects.filter(step=step).exists()
    assert sandbox.ledger(system="mail", run=str(run.pk)) == []


def test_a_read_step_refuses_a_tool_decided_to_be_a_side_effect(sandbox, admin_user):
    # The stricter decision's effect on a workflow's read step: it is not called unprotected.
    decide(admin_user, "crm.lookup", side_effect=True)
    run = run_of("test.reply", REPLY)
    step = Step.objects.get(run=run, name="customer")
    assert step.error_class == "invalid_input"
    assert "crm.lookup is a side-effect tool: a read step cannot call it" in step.last_error
    assert not Step.objects.filter(run=run, name="send_reply").exists()


def test_clearing_the_decision_gives_the_engine_the_tools_own_metadata(sandbox, admin_user):
    row, _ = decide(admin_user, "payments.refund", risk="medium")
    ToolMetadataOverride.decide(
        tools.registered("payments.refund"), admin_user, "back", expected=row.pk
    )  # a clear, back up to high: stricter, so no confirming
    run = run_of("test.refund", {"amount": 150, "payment": "pay_1"})
    assert ApprovalRequest.objects.get(run=run).risk == "high"

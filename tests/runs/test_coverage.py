"""Approval coverage proved from the timeline (runs.coverage): every committed call that was
behind approval names an approval whose own events show exactly its parameters approved by the
people it required. Planted effects — appended to the chain as a hostile writer with the
application's rights could — are named."""

from __future__ import annotations

import io
from decimal import Decimal

import pytest
from django.core.management import CommandError, call_command

from approvals import actions
from approvals.models import ApprovalRequest, EscalationRule
from runs import audit, engine
from runs.coverage import check_events
from runs.models import Run, SideEffect, TimelineEvent, digest
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def people(db):
    EscalationRule.objects.create(
        position=1, name="refunds above 1,000: two people", tool="payments.refund",
        action="escalate", queue="support", approvers_required=2, approvers_below=1,
        amount_param="amount", amount_above=Decimal("1000"),
    )  # fmt: skip
    return [UserFactory(username=n, groups=["support"]) for n in ("ann", "bob")]


def problems(run):
    return check_events(TimelineEvent.objects.filter(run=run).order_by("seq"))


def refund(sandbox, people, amount=2000):
    run, _ = engine.start_run("test.refund", {"amount": amount, "payment": "pay_1"})
    run = engine.run_until_quiet(run.pk)
    approval = ApprovalRequest.objects.get(run=run)
    for person in people[: approval.approvals_required]:
        actions.decide_approval(approval.pk, person, "approved")
    return engine.run_until_quiet(run.pk), approval


def plant(run, *, key, tool="payments.refund", approval=None):
    """A committed call appended to the chain with nothing behind it."""
    data = {"step": "refund", "snapshot": 0, "key": key, "tool": tool, "checksum": "0" * 64}
    if approval is not None:
        data["approval"] = approval
    TimelineEvent.append(run.pk, "snapshot.written", data)
    committed = {"key": key, "tool": tool, "from": "intended", "to": "committed"}
    return TimelineEvent.append(run.pk, "side_effect.committed", committed)


def test_a_two_person_refund_is_covered(sandbox, people):
    run, approval = refund(sandbox, people)
    assert SideEffect.objects.get(run=run).status == "committed"
    assert problems(run) == []


def test_a_call_committed_after_people_were_asked_without_approval_is_named(sandbox, people):
    run, _ = engine.start_run("test.refund", {"amount": 2000, "payment": "pay_1"})
    run = engine.run_until_quiet(run.pk)  # asked, not decided
    planted = plant(run, key="tp-planted")
    found = problems(run)
    assert len(found) == 1 and found[0][0] == planted.seq
    assert "committed without an approval" in found[0][1] and "tp-planted" in found[0][1]


def test_a_call_under_an_approval_of_other_parameters_is_named(sandbox, people):
    run, approval = refund(sandbox, people)
    named = {"id": approval.pk, "params_digest": digest({"amount": 99999}), "required": 2,
             "approvers": ["ann", "bob"]}  # fmt: skip
    planted = plant(run, key="tp-other", approval=named)
    [(seq, message)] = problems(run)
    assert seq == planted.seq and "approved other parameters" in message


def test_a_call_with_fewer_approvers_than_required_is_named(sandbox, people):
    run, approval = refund(sandbox, people, amount=500)  # one approver (ann)
    effect = SideEffect.objects.get(run=run, status="committed")
    named = {"id": approval.pk, "params_digest": digest(effect.snapshot.params), "required": 2,
             "approvers": ["ann", "bob"]}  # fmt: skip
    planted = plant(run, key="tp-fewer", approval=named)
    [(seq, message)] = problems(run)
    assert seq == planted.seq and "required 2 distinct approvers" in message and "(ann)" in message


def test_a_call_under_an_approval_that_was_never_decided_is_named(sandbox, people):
    run, _ = engine.start_run("test.refund", {"amount": 2000, "payment": "pay_1"})
    run = engine.run_until_quiet(run.pk)
    pending = ApprovalRequest.objects.get(run=run)
    named = {"id": pending.pk, "params_digest": "x", "required": 1, "approvers": ["ann"]}
    plant(run, key="tp-undecided", approval=named)
    assert "does not show approved" in problems(run)[0][1]


def test_verify_audit_names_the_planted_effect_in_the_database_and_in_an_export(
    sandbox, people, tmp_path
):
    covered, _ = refund(sandbox, people)
    asked, _ = engine.start_run("test.refund", {"amount": 2000, "payment": "pay_2"})
    asked = engine.run_until_quiet(asked.pk)
    planted = plant(asked, key="tp-planted")
    report = audit.verify_queryset_runs(Run.objects.filter(pk__in=[covered.pk, asked.pk]))
    [problem] = report.problems
    assert (problem.run_id, problem.seq) == (str(asked.pk), planted.seq)
    assert "committed without an approval" in problem.message
    export = tmp_path / "audit.jsonl"
    export.write_text(
        "".join(audit.export_jsonl(Run.objects.filter(pk__in=[covered.pk, asked.pk])))
    )
    out = io.StringIO()
    with pytest.raises(CommandError):
        call_command("verify_audit", "--file", str(export), stdout=out, stderr=io.StringIO())
    assert f"seq {planted.seq}" in out.getvalue() and "tp-planted" in out.getvalue()
    assert audit.verify_run(covered).ok

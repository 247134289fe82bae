"""The one gate in front of every side effect (runs.engine.gate): whatever path leads to a call,
it is made only when an approval in force covers exactly its parameters with the number of
distinct approvers the rules require for those parameters. Otherwise nothing is written or
sent, and people are asked about the call as it would be made. The sandbox's ledger counts what
the payment system received."""

from __future__ import annotations

from decimal import Decimal

import pytest

from approvals import actions
from approvals.models import ApprovalRequest, EscalationRule
from runs import audit, engine, tools, workflows
from runs.models import Run, SideEffect, Step, TimelineEvent, digest
from runs.tools import python_tool
from runs.workflows import Workflow, approval, side_effect
from tests.approvals.console_helpers import fast_passwords, fresh, start  # noqa: F401
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

BULK: list[dict] = []


def _bulk_update(params, ctx):
    BULK.append(params)
    return {"id": f"bulk_{len(BULK)}", "updated": len(params["ids"])}


tools.register(
    python_tool("test.gate_bulk_update", _bulk_update, side_effect=True, risk="medium",
                records_param="ids", target=lambda p: "contacts", external_id=lambda r: r["id"]),
    replace=True,
)  # fmt: skip

workflows.register(
    Workflow("test.gate_direct_refund", 1, [
        side_effect("refund", "payments.refund",
                    params=lambda ctx: {"payment_id": ctx.input["payment"],
                                        "amount": ctx.input["amount"],
                                        "currency": ctx.input.get("currency", "USD")}),
    ]),
    replace=True,
)  # fmt: skip

workflows.register(
    Workflow("test.gate_bulk", 1, [
        side_effect("update", "test.gate_bulk_update",
                    params=lambda ctx: {"ids": list(range(ctx.input["n"]))}),
    ]),
    replace=True,
)  # fmt: skip

workflows.register(
    Workflow("test.gate_twice", 1, [
        approval("approve", tool="payments.refund",
                 params=lambda ctx: {"payment_id": "pay_2x", "amount": 150}),
        side_effect("refund", "payments.refund",
                    params=lambda ctx: ctx.results["approve"]["params"]),
        side_effect("again", "payments.refund",
                    params=lambda ctx: ctx.results["approve"]["params"]),
    ]),
    replace=True,
)  # fmt: skip


@pytest.fixture
def people(db):
    return [UserFactory(username=n, groups=["support"]) for n in ("ann", "bob", "cat")]


@pytest.fixture
def two_above_1000(db):
    """The rule the attacks were made under: refunds above 1,000 need two approvers (one at
    or below), as a rule the workflow's approval step goes by."""
    return EscalationRule.objects.create(
        position=1, name="refunds above 1,000: two people", tool="payments.refund",
        action="escalate", queue="support", approvers_required=2, approvers_below=1,
        amount_param="amount", amount_above=Decimal("1000"),
    )  # fmt: skip


def refunds(sandbox) -> list:
    return [entry["request"]["amount"] for entry in sandbox.ledger(system="payments")]


def pending(run) -> ApprovalRequest:
    return ApprovalRequest.objects.get(run=run, status="pending")


def test_an_edited_retry_needs_the_approval_the_new_amount_requires(
    sandbox, people, two_above_1000
):
    ann, bob, cat = people
    # Approved at 300; the payment system refuses the call (invalid input: a bad payment id).
    run = start("test.refund", {"amount": 300, "payment": "p" * 101})
    actions.decide_approval(pending(run).pk, ann, "approved")
    run = engine.run_until_quiet(run.pk)
    step = Step.objects.get(run=run, name="refund")
    assert step.status == "needs_human" and step.error_class == "invalid_input"
    assert refunds(sandbox) == []

    # "Fix the data and retry" with another amount: no one approved 99,999.
    actions.retry_with_edits(run.pk, ann, {"payment_id": "pay_1", "amount": 99999})
    run = engine.run_until_quiet(run.pk)
    assert refunds(sandbox) == []
    assert run.status == "needs_human"
    asked = pending(run)
    assert asked.step_id == step.pk and asked.approvals_required == 2
    assert asked.proposed_params == {"payment_id": "pay_1", "amount": 99999}
    assert "amount 300 → 99999" in run.attention_reason
    with pytest.raises(actions.ActionRefused, match="approve or reject"):
        actions.retry_step(run.pk, ann)

    actions.decide_approval(asked.pk, bob, "approved")  # the first of two
    assert engine.run_until_quiet(run.pk).status == "needs_human"
    assert refunds(sandbox) == []
    actions.decide_approval(asked.pk, cat, "approved")
    run = engine.run_until_quiet(run.pk)
    assert refunds(sandbox) == [99999]
    effect = SideEffect.objects.get(run=run, status="committed")
    named = effect.snapshot.human_decision
    assert named["approval"] == asked.pk and named["approvers"] == ["bob", "cat"]
    assert named["required"] == 2 and named["params_digest"] == digest(effect.snapshot.params)
    assert audit.verify_run(run).ok  # the chain, the seals and the coverage


def test_an_edit_past_the_threshold_needs_a_second_person(sandbox, people, two_above_1000):
    ann, bob, cat = people
    run = start("test.refund", {"amount": 500, "payment": "pay_1"})
    asked = pending(run)
    assert asked.approvals_required == 1
    approved = actions.decide_approval(
        asked.pk, ann, "approved_with_edits", edited_params={"payment_id": "pay_1", "amount": 50000}
    )
    # Counted on the parameters approved: 50,000 needs two people.
    assert approved.status == "pending" and approved.approvals_required == 2
    assert approved.first_approved_by == ann
    assert engine.run_until_quiet(run.pk).status == "needs_human"
    assert refunds(sandbox) == []
    assert TimelineEvent.objects.filter(run=run, verb="approval.approvers_raised").count() == 1
    with pytest.raises(actions.ActionRefused, match="second approver"):
        actions.decide_approval(asked.pk, ann, "approved")
    actions.decide_approval(asked.pk, bob, "approved")
    engine.run_until_quiet(run.pk)
    assert refunds(sandbox) == [50000]
    assert audit.verify_run(run).ok


def test_a_call_no_workflow_step_asked_about_goes_to_people_by_rule(sandbox, people):
    # The shipped rule: above 10,000 USD, two people — whether or not the workflow asks.
    ann, bob, _ = people
    small = start("test.gate_direct_refund", {"amount": 9000, "payment": "pay_s"})
    assert small.status == "succeeded" and refunds(sandbox) == [9000]
    big = start("test.gate_direct_refund", {"amount": 20000, "payment": "pay_b"})
    assert big.status == "needs_human" and refunds(sandbox) == [9000]
    asked = pending(big)
    assert asked.approvals_required == 2
    assert "Large amounts: two people approve" in big.attention_reason
    assert not SideEffect.objects.filter(run=big).exists()  # nothing written before approval
    actions.decide_approval(asked.pk, ann, "approved")
    actions.decide_approval(asked.pk, bob, "approved")
    assert engine.run_until_quiet(big.pk).status == "succeeded"
    assert refunds(sandbox) == [9000, 20000]


def test_a_rejected_call_is_never_made(sandbox, people):
    run = start("test.gate_direct_refund", {"amount": 20000, "payment": "pay_r"})
    actions.decide_approval(pending(run).pk, people[0], "rejected", comment="no")
    run = engine.run_until_quiet(run.pk)
    assert run.status == "cancelled" and refunds(sandbox) == []


@pytest.mark.parametrize(
    ("amount", "currency", "approvers"),
    [
        (727, "USD", 1),
        (1232, "JPY", 1),  # about 8 USD
        (1500, "USD", 2),
        (300000, "JPY", 2),  # about 2,010 USD
        (1100, "EUR", 2),  # about 1,188 USD
        (900, "EUR", 1),
        (500, "XTS", 2),  # no rate: it cannot be told, so the careful side
    ],
)
def test_an_amount_threshold_knows_the_currency(settings, people, amount, currency, approvers):
    rates = {"USD": "1", "EUR": "1.08", "JPY": "0.0067"}
    settings.TASKPILOTS = {**settings.TASKPILOTS, "CURRENCY_RATES": rates}
    EscalationRule.objects.create(
        position=1, name="refunds: one person, two above 1,000 USD", tool="payments.refund",
        action="approve", approvers_required=2, approvers_below=1,
        amount_above=Decimal("1000"), amount_currency="USD",
    )  # fmt: skip
    run = start(
        "test.gate_direct_refund", {"amount": amount, "payment": "pay_c", "currency": currency}
    )
    assert pending(run).approvals_required == approvers


def test_writes_touching_many_records_go_to_a_person(people):
    BULK.clear()
    assert start("test.gate_bulk", {"n": 100}).status == "succeeded"
    run = start("test.gate_bulk", {"n": 101})
    assert run.status == "needs_human" and len(BULK) == 1
    asked = pending(run)
    assert asked.approvals_required == 1 and "more than 100 records" in run.attention_reason
    actions.decide_approval(asked.pk, people[0], "approved")
    assert engine.run_until_quiet(run.pk).status == "succeeded"
    assert [len(call["ids"]) for call in BULK] == [100, 101]


def test_an_approval_covers_one_call(sandbox, people):
    run = start("test.gate_twice", {})
    actions.decide_approval(pending(run).pk, people[0], "approved")
    run = engine.run_until_quiet(run.pk)
    # The second call with the same parameters is another refund: people are asked again.
    assert refunds(sandbox) == [150]
    assert run.status == "needs_human"
    assert pending(run).step.name == "again"


def test_a_rule_added_after_the_hot_path_read_the_rules_still_holds(sandbox, people):
    # The hot path clears a call by the rules this process read earlier, in the statement that
    # writes the intent; that statement checks they are still the rules in force.
    assert start("test.gate_direct_refund", {"amount": 50, "payment": "pay_w"}).status == (
        "succeeded"
    )
    EscalationRule.objects.create(
        position=1, name="every refund: a person", tool="payments.refund", action="approve",
        approvers_required=1,
    )  # fmt: skip
    run = start("test.gate_direct_refund", {"amount": 60, "payment": "pay_w2"})
    assert run.status == "needs_human" and refunds(sandbox) == [50]
    assert pending(run).approvals_required == 1


def test_a_workflow_that_found_no_approval_needed_is_gated_by_the_rules_only(sandbox, people):
    run = start("test.refund", {"amount": 50, "payment": "pay_1"})  # approve's `when`: no
    assert not ApprovalRequest.objects.filter(run=run).exists()
    assert fresh(run).status == "waiting" and refunds(sandbox) == [50]
    assert run.pk and Run.objects.get(pk=run.pk).status == "waiting"


# -- the rules' stamp: what the hot path's statements check the cached rules against ---------


def _stamp() -> str:
    from django.db import connection

    from approvals import gate

    with connection.cursor() as cursor:
        cursor.execute(gate.RULES_STAMP_SQL)
        return cursor.fetchone()[0]


class _Undone(Exception):
    pass


def test_the_rules_stamp_changes_with_every_change_by_any_path_and_is_never_reused(db):
    from django.db import connection, transaction

    from approvals.models import RulesStamp

    seen = [_stamp()]
    rule = EscalationRule.objects.create(
        position=1, name="stamp", tool="payments.refund", action="approve"
    )
    seen.append(_stamp())
    with connection.cursor() as cursor:  # plain SQL, and a change that changes nothing
        cursor.execute(
            "UPDATE approvals_escalationrule SET enabled = enabled WHERE id = %s", [rule.pk]
        )
    seen.append(_stamp())
    with pytest.raises(_Undone), transaction.atomic():
        EscalationRule.objects.filter(pk=rule.pk).update(enabled=False)
        assert _stamp() not in seen
        raise _Undone
    assert _stamp() == seen[-1]  # a change rolled back leaves the stamp as it was
    # The rules in force back as they were at the start (a digest of the enabled approve
    # rules would be the first one again).
    EscalationRule.objects.filter(pk=rule.pk).update(enabled=False)
    seen.append(_stamp())
    assert all(seen) and len(set(seen)) == len(seen)

    # Without its row the stamp reads '' (never NULL, which would let a guard pass), unlike
    # any stamp; the next change of rules writes it again.
    RulesStamp.objects.all().delete()
    assert _stamp() == ""
    EscalationRule.objects.create(name="again", action="approve")
    assert _stamp() not in ("", *seen)


def test_a_statement_cleared_by_rules_changed_since_is_refused_whatever_changed_them(sandbox):
    # The guard the hot path adds to its statement (runs.engine.ledger.batch_intent): rules a
    # worker cached are those in force, or nothing is written; here changed by plain SQL
    # between the worker's read and its statement.
    from django.db import connection

    from approvals import gate
    from runs.batch import Batch, Refused
    from taskpilots.evidence import bench_flows  # noqa: F401

    run, _ = engine.start_run("bench.five", {"n": 1})
    cached = gate.approve_rules()
    with connection.cursor() as cursor:
        cursor.execute("UPDATE approvals_escalationrule SET enabled = NOT enabled")
    batch = Batch(run.pk, (run.event_seq, run.event_hash))
    batch.event("run.note", {})
    check = f"({batch.shared(gate.RULES_STAMP_SQL)}) = %s"
    batch.check(check, [cached.stamp], "approval rules changed")
    with pytest.raises(Refused, match="approval rules changed"):
        batch.commit()
    assert not TimelineEvent.objects.filter(run=run, verb="run.note").exists()

    batch = Batch(run.pk, (run.event_seq, run.event_hash))
    batch.event("run.note", {})
    batch.check(check, [gate.approve_rules().stamp], "approval rules changed")
    batch.value(batch.shared(gate.RULES_STAMP_SQL), [])
    assert batch.commit() == [gate.approve_rules().stamp]


def test_each_read_of_the_pauses_and_rules_is_made_once_per_statement(sandbox):
    # The open pauses and the rules' stamp are read by several checks and values of one hot
    # path statement; each is read once (Batch.shared), and the call still runs once.
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as seen:
        run = start("test.gate_direct_refund", {"amount": 70, "payment": "pay_once"})
    assert run.status == "succeeded" and refunds(sandbox) == [70]
    statements = [q["sql"] for q in seen.captured_queries]
    hot = [sql for sql in statements if "approvals_rulesstamp" in sql]
    assert hot, statements
    for sql in hot:
        assert sql.count("FROM approvals_rulesstamp") == 1, sql
        assert sql.count("FROM approvals_toolpause") <= 1, sql
    assert not any("string_agg" in sql for sql in statements)

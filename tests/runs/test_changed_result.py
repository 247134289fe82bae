"""A recovered tool that reports a different result is not taken as it comes: when a lookup by
key (or a replayed answer) contradicts the snapshot, a person confirms before the run goes on."""

from __future__ import annotations

import pytest
from django.urls import reverse

from approvals.models import HumanDecision
from runs import engine, tools, workflows
from runs.engine import calls, ledger
from runs.models import SideEffect, Step, TimelineEvent
from runs.workflows import Workflow, compute, side_effect
from tests.approvals.console_helpers import fast_passwords  # noqa: F401  (autouse)
from tests.runs.test_engine import drive, later, make_due, start, verbs

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "run-main"}

REFUND = workflows.register(
    Workflow(
        "test.changed_refund",
        1,
        [
            side_effect(
                "refund",
                "payments.refund",
                params=lambda ctx: {
                    "payment_id": ctx.input["payment"],
                    "amount": ctx.input["amount"],
                },
                stage="refund",
            ),
            compute("done", lambda ctx: {"refunded": ctx.results["refund"]["amount"]}),
        ],
    ),
    replace=True,
)
INPUT = {"payment": "pay_9", "amount": 40.0}


@pytest.fixture(autouse=True)
def fast_tools(settings):
    settings.TASKPILOTS = {**settings.TASKPILOTS, "TOOL_TIMEOUT_SECONDS": 1.0}


def key_of(run) -> str:
    return f"tp-{run.pk}-refund"


def parked_on_a_changed_result(sandbox):
    """The refund lands but its answer is lost, the lookup cannot be answered at first; by the
    time it is, someone has changed the record under the key to another amount."""
    sandbox.inject("payments", "commit_then_500", action="refund")
    sandbox.inject("payments", "503", action="by-key")
    run = drive(start("test.changed_refund", INPUT))
    assert Step.objects.get(run=run, name="refund").status == "retry_scheduled"
    [record] = sandbox.ledger(system="payments", key=key_of(run))
    changed = {**record["response"], "amount": 400.0}
    assert sandbox.alter("payments", key_of(run), response=changed) == 1
    make_due(run)
    return drive(run), record["external_id"]


def test_a_lookup_that_finds_another_amount_waits_for_a_person(sandbox):
    run, external_id = parked_on_a_changed_result(sandbox)
    assert run.status == "needs_human"
    step = Step.objects.get(run=run, name="refund")
    assert step.status == "unknown_outcome"
    assert f"now reports amount 400.0 (the snapshot said 40.0) for key {key_of(run)}" in (
        step.last_error
    )
    effect = SideEffect.objects.get(step=step)
    # Not guessed either way: unknown, with what the tool reports kept for the person.
    assert effect.status == "unknown" and effect.committed_at is None
    assert effect.receipt["observed"]["external_id"] == external_id
    event = TimelineEvent.objects.get(run=run, verb="side_effect.result_changed")
    assert event.data["changes"] == {"amount": {"now": 400.0, "snapshot": 40.0}}
    assert event.data["now"]["digest"] == effect.receipt["observed"]["response_digest"]
    assert event.data["expected"]["params_digest"] == effect.params_checksum
    assert '"amount":40.0' in event.data["expected"]["shown"]
    assert len(sandbox.ledger(system="payments", key=key_of(run))) == 1


def test_the_person_sees_both_values_and_accepts_the_new_result(client, sandbox, support_user):
    run, external_id = parked_on_a_changed_result(sandbox)
    client.force_login(support_user)
    page = client.get(reverse("console:run-detail", args=[run.pk]))
    assert page.status_code == 200
    text = page.content.decode()
    assert "The tool reports a different result" in text
    compare = text[text.index('id="changed-result"') :]
    compare = compare[: compare.index("</section>")]
    assert "40.0" in compare and "400.0" in compare and external_id in compare

    step = Step.objects.get(run=run, name="refund")
    run.refresh_from_db()
    answer = client.post(
        reverse("console:run-action", args=[run.pk, "confirm_happened"]),
        {"step": step.pk, "proof": external_id, "expected_version": run.lock_version},
        **HTMX,
    )
    assert answer.status_code == 200, answer.content.decode()[:2000]
    effect = SideEffect.objects.get(step=step)
    assert effect.status == "committed" and effect.confirmed_by == "user:sam-support"
    assert effect.receipt["response"]["amount"] == 400.0
    decision = HumanDecision.objects.get(run=run)
    assert decision.verb == "confirm_happened" and decision.proof == external_id

    run = drive(run)
    assert run.status == "succeeded"
    assert Step.objects.get(run=run, name="done").result == {"refunded": 400.0}
    assert len(sandbox.ledger(system="payments", key=key_of(run))) == 1


def test_a_matching_lookup_still_settles_by_itself(sandbox):
    sandbox.inject("payments", "commit_then_500", action="refund")
    run = drive(start("test.changed_refund", INPUT))
    assert run.status == "succeeded"
    assert "side_effect.result_changed" not in verbs(run)
    assert SideEffect.objects.get(run=run).confirmed_by == "reconcile"


def test_a_crashed_attempt_finding_another_record_is_not_taken(sandbox, support_user):
    # Someone else's refund sits under the key (another amount) when the engine reconciles an
    # intent a dead worker left behind; and after "treat as not done", the deduping system
    # replays that record again: each time a person is asked, nothing is sent twice.
    run = start("test.changed_refund", INPUT)
    planted = sandbox.write(
        "payments", "refund", {"payment_id": "pay_9", "amount": 7.5}, key=key_of(run)
    )
    assert planted.status == 200
    claim = engine.claim_next(run.pk, worker="doomed")
    tool = tools.get("payments.refund")
    params = calls.build_params(claim, tool)
    ledger.write_intent(claim, tool, params, engine.idempotency_key_for(claim.step))
    Step.objects.filter(pk=claim.step.pk).update(lease_expires_at=later(seconds=-1))
    run = drive(run)
    step = Step.objects.get(run=run, name="refund")
    assert run.status == "needs_human" and step.status == "unknown_outcome"
    assert "amount 7.5 (the snapshot said 40.0)" in step.last_error

    from approvals import actions

    actions.confirm_outcome(step.pk, support_user, happened=False)
    run = drive(run)
    step.refresh_from_db()
    assert run.status == "needs_human" and step.status == "unknown_outcome"
    assert verbs(run).count("side_effect.result_changed") == 2
    assert SideEffect.objects.get(step=step).status == "unknown"
    assert len(sandbox.ledger(system="payments", key=key_of(run))) == 1

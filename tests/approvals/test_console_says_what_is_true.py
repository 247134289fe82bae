"""The console says what is true: a finished run says how it ended, an action on a taken-over run
says that the run stays taken over, a rejection with nothing done says there is nothing to undo,
and a failed step says why."""

from __future__ import annotations

import pytest
from django.urls import reverse

from approvals import actions
from approvals.models import ApprovalRequest
from runs import engine, workflows
from runs.models import Run, SideEffect, Step
from runs.workflows import Workflow, approval, read, side_effect
from tests.approvals.console_helpers import (  # noqa: F401  (fast_passwords is autouse)
    approval_run,
    fast_passwords,
    fresh,
    start,
    unknown_outcome_run,
    visible_text,
)

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "run-main"}

# Reads, then asks before mailing: rejecting it undoes nothing.
workflows.register(
    Workflow("test.read_then_ask", 1, [
        read("lookup", "crm.lookup", params=lambda ctx: {"email": ctx.input["email"]}),
        approval("approve", tool="mail.send", reason="A person checks the mail",
                 params=lambda ctx: {"to": ctx.input["email"], "subject": "Hi", "body": "Hi"}),
        side_effect("send", "mail.send", params=lambda ctx: ctx.results["approve"]["params"]),
    ]),
    replace=True,
)  # fmt: skip
# Refunds, then asks before mailing: rejecting it undoes the refund.
workflows.register(
    Workflow("test.refund_then_ask", 1, [
        side_effect("refund", "payments.refund",
                    params=lambda ctx: {"payment_id": ctx.input["payment"], "amount": 20.0}),
        approval("approve", tool="mail.send", reason="A person checks the mail",
                 params=lambda ctx: {"to": "a@example.com", "subject": "Hi", "body": "Hi"}),
    ]),
    replace=True,
)  # fmt: skip


def detail(run, **params):
    url = reverse("console:run-detail", args=[run.pk])
    return url + ("?" + "&".join(f"{k}={v}" for k, v in params.items()) if params else "")


def act(client, run, action, **data):
    run = fresh(run)
    body = {"expected_version": run.lock_version, **data}
    return client.post(reverse("console:run-action", args=[run.pk, action]), body, **HTMX)


def _approval(run) -> int:
    return ApprovalRequest.objects.get(run=run, status="pending").pk


# -- finished runs --------------------------------------------------------------------------


def test_a_succeeded_run_says_how_it_ended_not_that_taskpilots_is_handling_it(
    client, sandbox, support_user
):
    run = start("test.kb", {"q": "refund"})
    assert run.status == "succeeded"
    client.force_login(support_user)
    response = client.get(detail(run))
    text = visible_text(response)
    assert "TaskPilots is handling this run" not in text
    assert "Nothing left to do: the run succeeded at " in text
    assert "Nothing left to do: the run succeeded." in text  # the actions panel


def test_a_cancelled_run_names_who_cancelled_it_and_that_nothing_was_undone(
    client, sandbox, support_user
):
    run = approval_run()
    actions.cancel_run(run.pk, support_user, reason="customer withdrew")
    client.force_login(support_user)
    text = visible_text(client.get(detail(run)))
    assert "TaskPilots is handling this run" not in text
    assert "Nothing left to do: sam-support cancelled the run at " in text
    assert "(“customer withdrew”)" in text
    assert "Nothing had been done to other systems, so nothing was undone." in text
    assert "Nothing left to do: the run was cancelled." in text
    # The approval it was parked on is not "waiting for a person" any more.
    assert "Needs a person" not in text and "approve Approval payments.refund Not done" in text


def test_a_compensated_run_says_its_side_effects_were_undone(client, sandbox, support_user):
    run = start("test.refund", {"amount": 50, "payment": "pay_c"})  # refunded, awaits settlement
    actions.cancel_run(run.pk, support_user, reason="wrong customer")
    run = engine.run_until_quiet(run.pk)
    assert run.status == "compensated"
    client.force_login(support_user)
    text = visible_text(client.get(detail(run)))
    assert "Nothing left to do: the run was undone at " in text
    assert "(1 side effect compensated)" in text


def test_a_failed_run_says_why(client, sandbox, auditor_user):
    run = approval_run()
    fresh(run).fail("the payment provider closed the account")
    client.force_login(auditor_user)
    text = visible_text(client.get(detail(run)))
    assert "Nothing left to do: the run failed at " in text
    assert "the payment provider closed the account" in text
    assert "Nothing left to do: the run failed." in text  # the auditor's panel too


# -- taken-over runs ------------------------------------------------------------------------


def test_confirming_on_a_taken_over_run_says_it_stays_taken_over(client, sandbox, support_user):
    run = unknown_outcome_run(sandbox)
    actions.take_over(run.pk, support_user)
    client.force_login(support_user)
    step = Step.objects.get(run=run, status="unknown_outcome")
    response = act(client, run, "confirm_happened", step=step.pk, proof="crm_42")
    assert response.status_code == 200
    text = visible_text(response)
    assert "The run goes on" not in text
    assert (
        "Recorded as done, with your reference as proof. The run stays taken over by you: "
        "TaskPilots does nothing more with it until you release it."
    ) in text
    assert fresh(run).status == "taken_over"  # and it is true
    # The page then says what to do: release it.
    assert "nothing is waiting on you: release it and TaskPilots goes on with done." in text


def test_approving_a_taken_over_run_does_not_say_it_goes_on(client, sandbox, support_user):
    run = approval_run()
    actions.take_over(run.pk, support_user)
    client.force_login(support_user)
    response = act(client, run, "approve", approval=_approval(run))
    text = visible_text(response)
    assert "Approved. The run stays taken over by you" in text
    assert fresh(run).status == "taken_over"
    released = act(client, run, "release", needed_engineer="no")
    assert "Released. The run goes on." in visible_text(released)
    assert fresh(run).status == "running"


def test_the_owner_is_told_the_run_waits_for_their_release(client, sandbox, support_user):
    run = approval_run()
    actions.take_over(run.pk, support_user)
    client.force_login(support_user)
    text = visible_text(client.get(detail(run)))
    assert "Check the proposed payments.refund call below" in text
    assert "The run stays with you: TaskPilots goes on only after you release it." in text
    assert "until they act on it" not in text


def test_an_admin_acting_on_someone_elses_run_is_told_whose_it_stays(
    client, sandbox, support_user, admin_user
):
    run = approval_run()
    actions.take_over(run.pk, support_user)
    client.force_login(admin_user)
    response = act(client, run, "approve", approval=_approval(run))
    assert "The run stays taken over by sam-support" in visible_text(response)


# -- rejecting ------------------------------------------------------------------------------


def test_rejecting_a_run_that_only_read_says_there_is_nothing_to_undo(
    client, sandbox, support_user
):
    run = start("test.read_then_ask", {"email": "lee@example.com"})
    assert run.status == "needs_human"
    client.force_login(support_user)
    response = act(client, run, "reject", approval=_approval(run), comment="duplicate")
    text = visible_text(response)
    assert "being undone" not in text
    assert (
        "Rejected. The run is cancelled. Nothing had been done to other systems, so there is "
        "nothing to undo."
    ) in text
    assert fresh(run).status == "cancelled"
    assert not SideEffect.objects.filter(run=run).exists()
    # The step says why it failed.
    assert "Failed" in text
    assert "Rejected by sam-support at " in text and ": “duplicate”." in text


def test_rejecting_after_a_side_effect_says_what_is_undone(client, sandbox, support_user):
    run = start("test.refund_then_ask", {"payment": "pay_r"})
    assert run.status == "needs_human"
    client.force_login(support_user)
    page = visible_text(client.get(detail(run)))
    assert "rejecting undoes 1 earlier side effect)" in page
    response = act(client, run, "reject", approval=_approval(run), comment="not needed")
    text = visible_text(response)
    assert "Rejected. TaskPilots is undoing the 1 side effect already done, then the run ends." in (
        text
    )
    assert fresh(run).status == "compensating"


def test_cancelling_says_what_becomes_of_the_side_effects(client, sandbox, support_user):
    nothing_done = approval_run()
    refunded = start("test.refund", {"amount": 50, "payment": "pay_x"})
    client.force_login(support_user)
    text = visible_text(act(client, nothing_done, "cancel", comment="customer withdrew"))
    assert "The run is cancelled. Nothing had been done to other systems" in text
    assert "being undone" not in text
    text = visible_text(act(client, refunded, "cancel", comment="wrong customer"))
    assert "Cancelled. TaskPilots is undoing the 1 side effect already done" in text


def test_a_waiting_run_says_what_it_waits_for(client, sandbox, support_user):
    run = start("test.refund", {"amount": 50, "payment": "pay_w"})
    assert run.status == "waiting"
    client.force_login(support_user)
    text = visible_text(client.get(detail(run)))
    assert "The run waits for the event payment.settled (until " in text
    assert "will try again by itself" not in text
    assert Run.objects.get(pk=run.pk).status == "waiting"


# Mails, refunds, then asks: cancelling undoes the refund, and the sent mail cannot be undone.
workflows.register(
    Workflow("test.mail_refund_then_ask", 1, [
        side_effect("mail", "mail.send",
                    params=lambda ctx: {"to": "a@example.com", "subject": "Hi", "body": "Hi"}),
        side_effect("refund", "payments.refund",
                    params=lambda ctx: {"payment_id": ctx.input["payment"], "amount": 20.0}),
        approval("approve", tool="mail.send", reason="A person checks the mail",
                 params=lambda ctx: {"to": "a@example.com", "subject": "Bye", "body": "Bye"}),
    ]),
    replace=True,
)  # fmt: skip


def test_cancel_says_what_is_undone_and_what_a_person_must_undo(client, sandbox, support_user):
    """Issue 33 §4: the cancel panel promised the mail would be undone; it cannot be. Before:
    which effects TaskPilots undoes and which wait for a person. After: what waits, for whom,
    and cancelling again closes the run instead of asking a person about the same mail."""
    client.force_login(support_user)
    run = engine.run_until_quiet(start("test.mail_refund_then_ask", {"payment": "pay_1"}).pk)
    assert run.status == "needs_human"
    panel = visible_text(client.get(detail(run)))
    assert "TaskPilots will undo these, newest first: payments.refund" in panel
    assert "TaskPilots cannot undo these (their tools have no undo)" in panel
    assert "for a person to undo them by hand. mail.send" in panel
    assert "will be undone: mail.send" not in panel

    assert act(client, run, "cancel", comment="customer withdrew").status_code == 200
    run = engine.run_until_quiet(run.pk)
    assert run.status == "needs_human" and run.queue == "support"
    refund = SideEffect.objects.get(run=run, tool="payments.refund")
    mail = SideEffect.objects.get(run=run, tool="mail.send")
    assert refund.status == "compensated" and mail.status == "committed"
    after = visible_text(client.get(detail(run)))
    assert "No step is waiting; nothing to do." not in after
    assert "TaskPilots undid what it could, but it cannot undo mail.send" in after
    assert "waits in the support queue for a person" in after
    assert "Cancel once you have undone them by hand" in after

    mails = len(sandbox.ledger("mail"))
    payments = len(sandbox.ledger("payments"))
    assert act(client, run, "cancel", comment="mail apologised for by hand").status_code == 200
    run = engine.run_until_quiet(run.pk)
    assert run.status == "cancelled"
    assert SideEffect.objects.get(pk=mail.pk).status == "committed"  # still done, and says so
    # Closing it sent nothing: no second void, no mail.
    assert len(sandbox.ledger("mail")) == mails and len(sandbox.ledger("payments")) == payments


def test_an_unknown_outcome_counts_its_one_failed_call_once(client, sandbox, support_user):
    """Issue 33 §4: "FAILURES 2" on a run whose one call failed with an unknown outcome."""
    run = fresh(unknown_outcome_run(sandbox))
    assert run.status == "needs_human" and run.failure_count == 1
    client.force_login(support_user)
    text = visible_text(client.get(detail(run)))
    assert "Failures 1 " in text


def test_a_step_done_by_hand_says_so_and_keeps_the_reference(client, sandbox, support_user):
    """Issue 33 §4: a step done by hand showed "Done" beside its call's "Did not happen" and
    dropped the id the person entered."""
    from tests.approvals.bulk_helpers import outage_parked_runs

    run = outage_parked_runs(sandbox, 1)[0]
    client.force_login(support_user)
    result = '{"id": "msg_by_hand_7", "status": "sent"}'
    assert act(client, run, "complete", result=result, comment="sent from Gmail").status_code == 200
    text = visible_text(client.get(detail(engine.run_until_quiet(run.pk))))
    assert "Done by hand by sam-support at" in text
    assert '"id": "msg_by_hand_7"' in text
    assert "This call did not go through" in text and "Did not happen" not in text


def test_what_earlier_steps_found_is_shown_as_json_not_as_quoted_text(
    client, sandbox, support_user
):
    run = engine.run_until_quiet(start("test.read_then_ask", {"email": "a@example.com"}).pk)
    client.force_login(support_user)
    text = visible_text(client.get(detail(run)))
    found = text[text.index("What earlier steps found") :]
    assert '"lookup": {' in found and '\\"' not in found


def test_a_filtered_empty_inbox_does_not_say_nothing_is_waiting(client, sandbox, support_user):
    approval_run()
    client.force_login(support_user)
    text = visible_text(client.get(reverse("console:inbox"), {"reason": "outage"}))
    assert "Nothing is waiting for a person." not in text
    assert "No waiting run matches these filters. 1 run waits for a person in all." in text
    assert "Clear the filters" in text


def test_a_bulk_cancel_plan_says_what_is_undone_and_what_is_left(client, sandbox, admin_user):
    """Issue 33 §4: the bulk cancel preview said "committed side effects are compensated"."""
    from approvals import bulk

    engine.run_until_quiet(start("test.mail_refund_then_ask", {"payment": "pay_2"}).pk)
    job = bulk.preview(
        admin_user, "cancel", {"workflow": "test.mail_refund_then_ask"}, {"comment": "x"}
    )
    plans = list(job.items.values_list("plan", flat=True))
    assert plans == [
        "Cancel it and undo payments.refund; mail.send cannot be undone by TaskPilots and is "
        "left for a person."
    ]

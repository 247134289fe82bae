"""Every console action over HTTP: allowed for support (and admins), 403 for auditors, outsiders
and non-owners of a taken-over run, 404 for a missing run or action, 405 for GET, and 409 with
“who did what, when” for a stale page or a double submit."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse

from approvals import actions
from approvals.models import ApprovalRequest, HumanDecision
from runs import engine, workflows
from runs.models import Run, Step, TimelineEvent
from runs.workflows import Workflow, approval, compute
from tests.approvals.console_helpers import (  # noqa: F401  (fast_passwords is autouse)
    approval_run,
    fast_passwords,
    fresh,
    invalid_data_run,
    unknown_outcome_run,
    visible_text,
)
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "run-main"}


def url(run, action):
    return reverse("console:run-action", args=[run.pk, action])


def _approval(run):
    return {"approval": ApprovalRequest.objects.get(run=run, status="pending").pk}


def _parked_step(run):
    return {"step": Step.objects.get(run=run, status="unknown_outcome").pk}


# action → (kind of paused run, extra POST data, HumanDecision verb, run status afterwards)
CASES = {
    "approve": ("approval", _approval, "approve", "running"),
    "approve_edits": (
        "approval",
        lambda run: {**_approval(run), "param__payment_id": "pay_1", "param__amount": "120.5"},
        "approve_with_edits",
        "running",
    ),
    "reject": ("approval", lambda run: {**_approval(run), "comment": "duplicate"}, "reject",
               "cancelled"),
    "confirm_happened": ("unknown", lambda run: {**_parked_step(run), "proof": "crm_123"},
                         "confirm_happened", "running"),
    "confirm_not_happened": ("unknown", _parked_step, "confirm_not_happened", "running"),
    "retry": ("invalid", lambda run: {}, "retry", "running"),
    "retry_edits": ("invalid", lambda run: {"param__ticket_id": "T-1", "param__status": "solved"},
                    "approve_with_edits", "running"),
    "skip": ("invalid", lambda run: {"comment": "closed by phone"}, "skip", "running"),
    "complete": ("invalid", lambda run: {"result": '{"id": "T-1", "status": "solved"}'},
                 "complete_by_hand", "running"),
    "take_over": ("approval", lambda run: {}, "take_over", "taken_over"),
    "release": ("mine", lambda run: {"needed_engineer": "no"}, "release", "needs_human"),
    "cancel": ("approval", lambda run: {"comment": "customer withdrew"}, "cancel", "cancelled"),
}  # fmt: skip


@pytest.fixture
def paused(sandbox, support_user):
    def make(kind):
        if kind == "approval":
            return approval_run()
        if kind == "unknown":
            return unknown_outcome_run(sandbox)
        if kind == "invalid":
            return invalid_data_run()
        run = approval_run()
        actions.take_over(run.pk, support_user)
        return fresh(run)

    return make


def post(client, run, action, data, **headers):
    body = {"expected_version": run.lock_version, **data}
    return client.post(url(run, action), body, **headers)


@pytest.mark.parametrize("action", CASES)
def test_support_can_do_it_and_it_is_recorded(client, paused, support_user, action):
    kind, data, verb, status = CASES[action]
    run = paused(kind)
    client.force_login(support_user)
    events_before = TimelineEvent.objects.filter(run=run).count()
    response = post(client, run, action, data(run), **HTMX)
    assert response.status_code == 200, response.content.decode()[:2000]
    assert 'id="run-main"' in response.content.decode()
    decision = HumanDecision.objects.filter(run=run).latest("id")
    assert decision.verb == verb and decision.user == support_user
    assert TimelineEvent.objects.filter(run=run, actor="user:sam-support").exists()
    assert TimelineEvent.objects.filter(run=run).count() > events_before
    assert fresh(run).status == status


def test_without_htmx_a_success_redirects_to_the_run(client, paused, support_user):
    run = paused("approval")
    client.force_login(support_user)
    response = post(client, run, "approve", _approval(run))
    assert response.status_code == 302
    assert response["Location"] == reverse("console:run-detail", args=[run.pk])
    page = client.get(response["Location"])
    assert "Approved. The run goes on." in page.content.decode()


def test_approve_with_edits_stores_the_diff(client, paused, support_user):
    run = paused("approval")
    client.force_login(support_user)
    data = {**_approval(run), "param__payment_id": "pay_1", "param__amount": "99.5"}
    assert post(client, run, "approve_edits", data, **HTMX).status_code == 200
    decision = HumanDecision.objects.get(run=run)
    assert decision.after["diff"] == {"amount": [150, 99.5]}
    approval = ApprovalRequest.objects.get(run=run)
    assert approval.decision == "approved_with_edits"
    assert approval.edited_params == {"payment_id": "pay_1", "amount": 99.5}


def test_edits_are_validated_against_the_tool_schema(client, paused, support_user):
    run = paused("approval")
    client.force_login(support_user)
    data = {**_approval(run), "param__payment_id": "pay_1", "param__amount": "a lot"}
    response = post(client, run, "approve_edits", data, **HTMX)
    assert response.status_code == 422
    assert "Enter a number." in response.content.decode()
    assert not HumanDecision.objects.filter(run=run).exists()


def test_edits_name_no_parameter_the_tool_does_not_take(client, support_user):
    # A tool without a declared schema gets a JSON field: it may change values, not add names
    # the tool (or a model reading the decision) would then receive.
    workflows.register(
        Workflow("test.console_search", 1, [
            approval("approve", tool="kb.search", params=lambda ctx: {"q": ctx.input["q"]}),
            compute("done", lambda ctx: ctx.results["approve"]["params"]),
        ]),
        replace=True,
    )  # fmt: skip
    run, _ = engine.start_run("test.console_search", {"q": "refunds"})
    run = engine.run_until_quiet(run.pk)
    client.force_login(support_user)
    data = {**_approval(run), "params_json": json.dumps({"q": "returns", "bogus": 1})}
    response = post(client, run, "approve_edits", data, **HTMX)
    assert response.status_code == 422
    assert "bogus is not a parameter of kb.search" in response.content.decode()
    assert ApprovalRequest.objects.get(run=run).status == "pending"
    data = {**_approval(run), "params_json": json.dumps({"q": "returns"})}
    assert post(client, run, "approve_edits", data, **HTMX).status_code == 200
    assert engine.run_until_quiet(run.pk).result == {"q": "returns"}


@pytest.mark.parametrize(
    ("action", "data", "message"),
    [
        ("complete", {"result": "{not json"}, "This is not valid JSON"),
        ("skip", {"comment": ""}, "Say why."),
        ("cancel", {"comment": ""}, "Say why."),
    ],
)
def test_invalid_input_is_refused_with_a_clear_message(
    client, paused, support_user, action, data, message
):
    run = paused("invalid")
    client.force_login(support_user)
    response = post(client, run, action, data, **HTMX)
    assert response.status_code == 422
    assert message in response.content.decode()
    assert not HumanDecision.objects.filter(run=run).exists()


def test_confirming_it_happened_needs_the_reference(client, paused, support_user):
    run = paused("unknown")
    client.force_login(support_user)
    response = post(client, run, "confirm_happened", {**_parked_step(run), "proof": ""}, **HTMX)
    assert response.status_code == 422
    assert "Give the external reference" in response.content.decode()


def test_an_action_the_state_does_not_allow_is_refused(client, paused, support_user):
    run = paused("unknown")
    client.force_login(support_user)
    response = post(client, run, "skip", {"comment": "meh"}, **HTMX)
    assert response.status_code == 422
    assert "confirm whether it happened" in response.content.decode()


@pytest.mark.parametrize("kind", ["approval", "unknown", "invalid", "mine"])
def test_a_stale_page_gets_409_and_the_current_state(client, paused, support_user, kind):
    run = paused(kind)
    client.force_login(support_user)
    for action, (case_kind, data, _verb, _status) in CASES.items():
        if case_kind != kind:
            continue
        body = {**data(run), "expected_version": run.lock_version + 7}
        response = client.post(url(run, action), body, **HTMX)
        assert response.status_code == 409, action
        text = response.content.decode()
        assert "changed since you opened it" in text or "Someone else acted first" in text
    assert fresh(run).lock_version == run.lock_version
    assert HumanDecision.objects.filter(run=run).count() == (1 if kind == "mine" else 0)


def test_double_submit_and_a_second_decider_see_who_won(client, paused, support_user, admin_user):
    # The same form posted twice, then by someone else: exactly one decision wins.
    run = paused("approval")
    data = _approval(run)
    client.force_login(support_user)
    assert post(client, run, "approve", data, **HTMX).status_code == 200
    again = post(client, run, "approve", data, **HTMX)
    assert again.status_code == 409
    client.force_login(admin_user)
    other = post(client, run, "reject", {**data, "comment": "no"}, **HTMX)
    assert other.status_code == 409
    assert "Someone else acted first: sam-support approved at" in visible_text(other)
    assert HumanDecision.objects.filter(run=run).count() == 1
    assert fresh(run).status == "running"


@pytest.mark.parametrize("persona", ["auditor_user", "outsider"])
def test_auditors_and_outsiders_get_403(client, request, paused, persona, caplog):
    run = paused("approval")
    client.force_login(request.getfixturevalue(persona))
    for action in CASES:
        with caplog.at_level("WARNING", logger="taskpilots.console"):
            response = post(client, run, action, _approval(run))
        assert response.status_code == 403, action
    assert caplog.text.count("console permission denied") == len(CASES)
    assert not HumanDecision.objects.filter(run=run).exists()
    assert fresh(run).lock_version == run.lock_version


@pytest.mark.parametrize("action", ["approve", "cancel", "release", "take_over"])
def test_only_the_owner_or_an_admin_acts_on_a_taken_over_run(
    client, paused, support_user, admin_user, action
):
    run = paused("mine")  # taken over by sam-support
    other = UserFactory(username="other-support", groups=["support"])
    client.force_login(other)
    data = {**_approval(run), "comment": "mine now"}
    assert post(client, run, action, data, **HTMX).status_code == 403
    client.force_login(admin_user)
    response = post(client, run, "release", {"needed_engineer": "no"}, **HTMX)
    assert response.status_code == 200


def test_the_owner_decides_a_run_they_took_over(client, paused, support_user):
    run = paused("mine")
    client.force_login(support_user)
    response = post(client, run, "approve", _approval(run), **HTMX)
    assert response.status_code == 200
    assert ApprovalRequest.objects.get(run=run).decided_by == support_user


def test_anonymous_is_sent_to_log_in(client, paused):
    run = paused("approval")
    response = post(client, run, "approve", _approval(run))
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


def test_get_is_405(client, paused, support_user):
    run = paused("approval")
    client.force_login(support_user)
    for action in CASES:
        assert client.get(url(run, action)).status_code == 405, action


def test_missing_run_or_unknown_action_is_404(client, paused, support_user):
    import uuid

    run = paused("approval")
    client.force_login(support_user)
    missing = reverse("console:run-action", args=[uuid.uuid4(), "approve"])
    assert client.post(missing, {"expected_version": 0}).status_code == 404
    assert client.post(url(run, "explode"), {"expected_version": 0}).status_code == 404
    # An approval id from another run is not this run's approval.
    other = paused("approval")
    body = {"expected_version": run.lock_version, **_approval(other)}
    assert client.post(url(run, "approve"), body).status_code == 404


def test_csrf_is_enforced_on_actions(paused, support_user):
    from django.test import Client

    run = paused("approval")
    client = Client(enforce_csrf_checks=True)
    client.force_login(support_user)
    response = client.post(url(run, "approve"), {"expected_version": 0, **_approval(run)})
    assert response.status_code == 403
    assert not HumanDecision.objects.filter(run=run).exists()


def test_done_by_hand_stores_the_json_result(client, paused, support_user):
    run = paused("invalid")
    client.force_login(support_user)
    result = {"id": "T-1", "nested": {"ok": True}}
    post(client, run, "complete", {"result": json.dumps(result)}, **HTMX)
    step = Step.objects.get(run=run, name="close_ticket")
    assert step.status == "succeeded" and step.result == result


def test_runs_resume_to_the_end_after_the_console_acts(client, paused, support_user, sandbox):
    from runs import engine

    run = paused("unknown")
    client.force_login(support_user)
    post(client, run, "confirm_happened", {**_parked_step(run), "proof": "crm_77"}, **HTMX)
    run = engine.run_until_quiet(run.pk)
    assert run.status == Run.Status.SUCCEEDED
    assert Step.objects.get(run=run, name="create_contact").result["id"] == "crm_77"
    assert len(sandbox.ledger(system="crm")) == 1  # never sent twice

"""Issue 32's attacks, as they were made: through the console and the HTTP API, with a real
Celery worker executing the runs and the sandbox's ledger counting what the payment system
received. No amount is ever sent that no person approved at that amount, with the number of
distinct, authenticated approvers the rules require for it."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
from django.test import Client
from django.urls import reverse

from approvals.models import ApprovalRequest, EscalationRule
from runs import engine
from runs.api.models import ApiClient, ApiScope, PersonalToken
from runs.models import Run, Step
from tests.factories import UserFactory
from tests.worker import private_workers, wait_for

pytestmark = [
    pytest.mark.worker,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(180),
]


@pytest.fixture
def worker(transactional_db, sandbox):
    with private_workers() as pool:
        pool.start(concurrency=2)
        yield pool


@pytest.fixture
def people(transactional_db):
    EscalationRule.objects.create(
        position=1, name="refunds above 1,000: two people", tool="payments.refund",
        action="escalate", queue="support", approvers_required=2, approvers_below=1,
        amount_param="amount", amount_above=Decimal("1000"),
    )  # fmt: skip
    return {n: UserFactory(username=n, groups=["support"]) for n in ("ann", "bob", "cat")}


def refunds(sandbox) -> list:
    return [entry["request"]["amount"] for entry in sandbox.ledger(system="payments")]


def parked(run_id, *, step: str | None = None):
    """The run waits for a person (at `step`, when given), as the worker left it."""

    def check():
        run = Run.objects.get(pk=run_id)
        if run.status != Run.Status.NEEDS_HUMAN:
            return None
        current = Step.objects.filter(run=run, status="needs_human").first()
        return run if current and (step is None or current.name == step) else None

    return check


def console(user) -> Client:
    http = Client()
    http.force_login(user)
    return http


def act(user, run, action, data) -> int:
    run = Run.objects.get(pk=run.pk)
    url = reverse("console:run-action", args=[run.pk, action])
    response = console(user).post(url, {"expected_version": run.lock_version, **data})
    return response.status_code


def pending(run) -> ApprovalRequest:
    return ApprovalRequest.objects.get(run=run, status="pending")


def api(token: str, **headers):
    http = Client(headers={"Authorization": f"Bearer {token}", **headers})

    def post(path, body):
        response = http.post(f"/api/v1{path}", json.dumps(body), content_type="application/json")
        return response.status_code, response.json()

    return post


def token_of(user) -> str:
    return PersonalToken.issue(user, "scripts", ApiScope.values)[1].token


def test_an_edited_retry_in_the_console_sends_only_what_people_approved(worker, sandbox, people):
    ann, bob, cat = people["ann"], people["bob"], people["cat"]
    run, _ = engine.start_run("test.refund", {"amount": 300, "payment": "p" * 101})
    wait_for(parked(run.pk, step="approve"), timeout=60, what="the approval")
    assert act(ann, run, "approve", {"approval": pending(run).pk}) == 302
    # Approved at 300; the payment system refuses the call (its payment id is invalid).
    wait_for(parked(run.pk, step="refund"), timeout=60, what="the refused refund")
    assert refunds(sandbox) == []
    # "Fix the data and retry" with the amount nobody approved.
    edits = {"param__payment_id": "pay_1", "param__amount": "99999"}
    assert act(ann, run, "retry_edits", edits) == 302
    wait_for(lambda: ApprovalRequest.objects.filter(run=run, step__name="refund").exists(),
             timeout=60, what="the gate to ask people")  # fmt: skip
    asked = pending(run)
    assert asked.approvals_required == 2 and asked.proposed_params["amount"] == 99999
    assert refunds(sandbox) == []
    assert act(bob, run, "approve", {"approval": asked.pk}) == 302
    assert act(bob, run, "approve", {"approval": asked.pk}) in (409, 422)  # not twice
    assert refunds(sandbox) == []
    assert act(cat, run, "approve", {"approval": asked.pk}) == 302
    wait_for(lambda: refunds(sandbox), timeout=60, what="the approved refund")
    wait_for(lambda: Run.objects.get(pk=run.pk).status == "waiting", timeout=60, what="the run")
    assert refunds(sandbox) == [99999]


def test_an_edit_over_the_api_past_the_two_person_rule_waits_for_a_second_person(
    worker, sandbox, people
):
    run, _ = engine.start_run("test.refund", {"amount": 500, "payment": "pay_5"})
    wait_for(parked(run.pk, step="approve"), timeout=60, what="the approval")
    request = pending(run)
    assert request.approvals_required == 1
    body = {
        "decision": "approved_with_edits",
        "edited_params": {"payment_id": "pay_5", "amount": 50000},
    }
    status, data = api(token_of(people["ann"]))(f"/approvals/{request.pk}/decision", body)
    assert status == 200, data
    assert (data["status"], data["approvals_needed"], data["approved_by"]) == (
        "pending",
        1,
        ["ann"],
    )
    engine.sweep()  # whatever the worker might be hinted, the run waits for a second person
    assert Run.objects.get(pk=run.pk).status == "needs_human" and refunds(sandbox) == []
    status, data = api(token_of(people["bob"]))(
        f"/approvals/{request.pk}/decision", {"decision": "approved"}
    )
    assert status == 200 and data["status"] == "decided", data
    wait_for(lambda: refunds(sandbox), timeout=60, what="the approved refund")
    wait_for(lambda: Run.objects.get(pk=run.pk).status == "waiting", timeout=60, what="the run")
    assert refunds(sandbox) == [50000]


def test_one_credential_is_never_two_approvers(worker, sandbox, people):
    run, _ = engine.start_run("test.refund", {"amount": 5000, "payment": "pay_7"})
    wait_for(parked(run.pk, step="approve"), timeout=60, what="the approval")
    request = pending(run)
    assert request.approvals_required == 2
    url = f"/approvals/{request.pk}/decision"
    _, credentials = ApiClient.issue("approver-bot", ApiScope.values)
    bot = api(credentials.token)
    assert bot(url, {"user": "ann", "decision": "approved"})[0] == 403
    ann = api(token_of(people["ann"]))
    assert ann(url, {"decision": "approved"})[1]["status"] == "pending"
    assert ann(url, {"decision": "approved"})[0] == 409
    assert ann(url, {"user": "bob", "decision": "approved"})[0] == 403
    assert bot(url, {"user": "bob", "decision": "approved"})[0] == 403
    engine.sweep()
    assert Run.objects.get(pk=run.pk).status == "needs_human" and refunds(sandbox) == []
    assert api(token_of(people["bob"]))(url, {"decision": "approved"})[0] == 200
    wait_for(lambda: refunds(sandbox), timeout=60, what="the approved refund")
    wait_for(lambda: Run.objects.get(pk=run.pk).status == "waiting", timeout=60, what="the run")
    assert refunds(sandbox) == [5000]
    request.refresh_from_db()
    assert {request.first_approved_by.username, request.decided_by.username} == {"ann", "bob"}

"""Approvals with conditions: an approver allows a call only if its parameters meet them
(`amount <= 50`, `currency in EUR, USD`); the engine checks them right before the call, and a
call that breaks one is not made — the run goes to a person, with the condition named."""

from __future__ import annotations

import json
import re
from html import unescape

import pytest
from django.test import Client
from django.urls import reverse

from approvals.models import ApprovalRequest, HumanDecision
from runs import conditions, engine, tools, workflows
from runs.api.models import ApiScope, PersonalToken
from runs.models import Run, SideEffect, Step, TimelineEvent
from runs.tools import python_tool
from runs.workflows import Workflow, approval, compute, side_effect
from tests.approvals.console_helpers import fast_passwords  # noqa: F401  (autouse)

pytestmark = pytest.mark.django_db

PAID: list[dict] = []


def _pay(params, ctx):
    PAID.append(params)
    return {"id": f"pay_{len(PAID)}"}


tools.register(
    python_tool("test.inputs_pay", _pay, side_effect=True, target=lambda p: "account:1",
                external_id=lambda r: r["id"]),
    replace=True,
)  # fmt: skip

workflows.register(
    Workflow(
        "test.inputs_pay",
        1,
        [
            approval("approve", tool="test.inputs_pay", queue="support",
                     params=lambda ctx: {"amount": ctx.input["amount"], "currency": "EUR"}),
            # A later step computes what is actually paid (e.g. with a surcharge).
            compute("price", lambda ctx: {"amount": ctx.input["amount"]
                                          + ctx.input.get("surcharge", 0)}),
            side_effect("pay", "test.inputs_pay",
                        params=lambda ctx: {"amount": ctx.results["price"]["amount"],
                                            "currency": "EUR"}),
        ],
    ),
    replace=True,
)  # fmt: skip


@pytest.fixture(autouse=True)
def _clear():
    PAID.clear()


def waiting(amount=40, surcharge=0) -> Run:
    run, _ = engine.start_run("test.inputs_pay", {"amount": amount, "surcharge": surcharge})
    run = engine.run_until_quiet(run.pk)
    assert run.status == Run.Status.NEEDS_HUMAN
    return run


@pytest.fixture
def console(support_user):
    http = Client()
    http.force_login(support_user)
    return http


def approve(console, run, text, **extra):
    run.refresh_from_db()
    request = ApprovalRequest.objects.get(run=run, status="pending")
    url = reverse("console:run-action", args=[run.pk, "approve"])
    body = {"expected_version": run.lock_version, "approval": request.pk, "conditions": text}
    return console.post(url, {**body, **extra})


class TestConsole:
    def test_a_call_that_meets_the_condition_is_made_once(self, console):
        run = waiting(amount=40)
        response = approve(console, run, "amount <= 50")
        assert response.status_code == 302
        run = engine.run_until_quiet(run.pk)
        assert run.status == Run.Status.SUCCEEDED
        assert PAID == [{"amount": 40, "currency": "EUR"}]
        request = ApprovalRequest.objects.get(run=run)
        expected = [{"param": "amount", "op": "<=", "value": 50}]
        assert request.conditions == expected
        decision = HumanDecision.objects.get(run=run, verb="approve")
        assert decision.conditions == expected
        event = TimelineEvent.objects.get(run=run, verb="approval.approved")
        assert event.data["conditions"] == expected
        url = reverse("console:run-detail", args=[run.pk])
        page = console.get(f"{url}?tab=decisions").content.decode()
        assert "Only if" in page and "amount &lt;= 50" in page

    def test_a_call_that_differs_from_the_approval_is_not_made_and_goes_to_a_person(self, console):
        # The approver saw 40 (and allowed up to 50); the workflow would pay 80. The gate
        # (runs.engine.gate) finds no approval of exactly these parameters: nothing is written
        # to the ledger, nothing is sent, and people are asked about the call as it would be.
        run = waiting(amount=40, surcharge=40)
        assert approve(console, run, "amount <= 50\ncurrency in EUR, USD").status_code == 302
        run = engine.run_until_quiet(run.pk)
        assert PAID == []
        assert run.status == Run.Status.NEEDS_HUMAN
        assert "amount 40 → 80" in run.attention_reason
        step = Step.objects.get(run=run, name="pay")
        assert step.status == Step.Status.NEEDS_HUMAN
        assert not SideEffect.objects.filter(run=run).exists()
        asked = ApprovalRequest.objects.get(run=run, step=step, status="pending")
        assert asked.proposed_params["amount"] == 80
        page = console.get(reverse("console:run-detail", args=[run.pk])).content.decode()
        assert "amount 40 → 80" in page

    @pytest.mark.parametrize(
        ("text", "says"),
        [
            ("amount <= fifty", "needs a number"),
            ("amount ~ 50", "is not a condition"),
            ("total <= 50", "no parameter 'total'"),
            ("currency <= 5", "not a number"),
            ("amount <= 30", "already break"),
            ("amount in 40, forty", "is a number"),
        ],
    )
    def test_an_invalid_condition_is_a_form_error_and_writes_nothing(self, console, text, says):
        run = waiting(amount=40)
        events = TimelineEvent.objects.filter(run=run).count()
        response = approve(console, run, text)
        assert response.status_code == 422
        html = response.content.decode()
        errors = re.findall(r'<p class="field-error" role="alert">(.*?)</p>', html)
        assert any(says in unescape(e) for e in errors), errors
        assert ApprovalRequest.objects.get(run=run).status == "pending"
        assert not HumanDecision.objects.filter(run=run).exists()
        assert TimelineEvent.objects.filter(run=run).count() == events
        assert PAID == []

    def test_the_form_has_the_conditions_field(self, console):
        run = waiting()
        page = console.get(reverse("console:run-detail", args=[run.pk])).content.decode()
        forms = re.findall(r'<form [^>]*data-action="(\w+)".*?</form>', page, re.S)
        assert {"approve", "approve_edits"} <= set(forms)
        for action in ("approve", "approve_edits"):
            form = re.search(rf'data-action="{action}".*?</form>', page, re.S).group(0)
            assert 'name="conditions"' in form, action

    def edit(self, console, run, amount, text):
        run.refresh_from_db()
        request = ApprovalRequest.objects.get(run=run, status="pending")
        url = reverse("console:run-action", args=[run.pk, "approve_edits"])
        body = {"expected_version": run.lock_version, "approval": request.pk,
                "params_json": json.dumps({"amount": amount, "currency": "EUR"}),
                "conditions": text}  # fmt: skip
        return console.post(url, body)

    def test_approve_with_edits_takes_conditions_checked_against_the_edits(self, console):
        run = waiting(amount=40)
        response = self.edit(console, run, 45, "amount <= 50")
        assert response.status_code == 302
        decision = HumanDecision.objects.get(run=run)
        assert decision.verb == "approve_with_edits"
        assert decision.conditions == [{"param": "amount", "op": "<=", "value": 50}]
        assert ApprovalRequest.objects.get(run=run).edited_params["amount"] == 45
        # The conditions hold against the edited parameters, not the proposed ones.
        response = self.edit(console, waiting(amount=40), 60, "amount <= 50")
        assert response.status_code == 422
        assert "already break" in unescape(response.content.decode())


class TestApi:
    @pytest.fixture
    def api(self, support_user):
        # The support person's own token: a decision is a person's.
        _, issued = PersonalToken.issue(support_user, "scripts", ApiScope.values)
        headers = {"Authorization": f"Bearer {issued.token}"}
        http = Client()

        def post(path, body):
            response = http.post(f"/api/v1{path}", json.dumps(body),
                                 content_type="application/json", headers=headers)  # fmt: skip
            return response.status_code, response.json()

        return post

    def decide(self, api, run, user, **body):
        request = ApprovalRequest.objects.get(run=run, status="pending")
        body = {"user": user.get_username(), "decision": "approved", **body}
        return api(f"/approvals/{request.pk}/decision", body)

    def test_approve_with_conditions_over_the_api(self, api, support_user):
        run = waiting(amount=40, surcharge=40)
        status, data = self.decide(
            api, run, support_user, conditions=[{"param": "amount", "op": "<=", "value": 50}]
        )
        assert status == 200, data
        assert data["conditions"] == [{"param": "amount", "op": "<=", "value": 50}]
        run = engine.run_until_quiet(run.pk)
        assert PAID == [] and run.status == Run.Status.NEEDS_HUMAN

    @pytest.mark.parametrize(
        ("condition", "field"),
        [
            ({"param": "amount", "op": "<=", "value": "50"}, "conditions[0]"),
            ({"param": "nope", "op": "<=", "value": 50}, "conditions[0]"),
            ({"param": "amount", "op": "!=", "value": 50}, "conditions[0].op"),
            ({"param": "currency", "op": "in", "value": []}, "conditions[0].value"),
        ],
    )
    def test_an_invalid_condition_is_422_and_writes_nothing(
        self, api, support_user, condition, field
    ):
        run = waiting(amount=40)
        status, data = self.decide(api, run, support_user, conditions=[condition])
        assert status == 422, data
        assert data["error"]["field"].startswith(field), data
        assert ApprovalRequest.objects.get(run=run).status == "pending"
        assert not HumanDecision.objects.filter(run=run).exists()


class TestRules:
    def test_parse_types_values_by_the_proposed_params(self):
        parsed = conditions.parse_text("amount < 50.5; currency in EUR, 'USD'", {
            "amount": 10, "currency": "EUR"})  # fmt: skip
        assert parsed == [
            {"param": "amount", "op": "<", "value": 50.5},
            {"param": "currency", "op": "in", "value": ["EUR", "USD"]},
        ]

    def test_broken_names_the_condition(self):
        cap = [{"param": "amount", "op": "<=", "value": 50}]
        assert conditions.broken(cap, {"amount": 50}) == []
        assert conditions.broken(cap, {"amount": 50.01}) == ["amount <= 50"]
        assert conditions.broken(cap, {"amount": "40"}) == ["amount <= 50"]  # a string is not
        assert conditions.broken(cap, {}) == ["amount <= 50"]
        assert conditions.broken(cap, {"amount": True}) == ["amount <= 50"]

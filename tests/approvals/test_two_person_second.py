"""Two-person approval for the second person (issue 33 §3): the inbox shows "1 of 2 approvals"
and filters the runs waiting for a second approver, the queue's channel hears that one is
needed, the first approver is no longer offered Approve, and the run page says which rule asked
for two people and why."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from approvals import notifications
from approvals.models import (
    ApprovalRequest,
    EscalationRule,
    NotificationChannel,
    NotificationDelivery,
)
from runs import engine
from runs.models import Run
from tests.approvals.console_helpers import visible_text
from tests.approvals.test_two_person import PAID, approve, login, waiting
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _setup(db):
    PAID.clear()
    EscalationRule.objects.create(
        position=1, name="two for high risk", risk="high", action="escalate", queue="support",
        approvers_required=2,
    )  # fmt: skip


@pytest.fixture
def people(db):
    return [UserFactory(username=n, groups=["support"]) for n in ("ann", "bob", "cat")]


def inbox(http, **filters) -> str:
    return visible_text(http.get(reverse("console:inbox"), filters))


def detail(http, run) -> str:
    return visible_text(http.get(reverse("console:run-detail", args=[run.pk])))


def test_the_inbox_counts_approvals_and_filters_the_second(people):
    ann, bob, _ = people
    first, _other = waiting(amount=40), waiting(amount=41)
    http = login(bob)
    page = inbox(http)
    assert page.count("0 of 2 approvals") == 2 and "1 of 2 approvals" not in page
    approve(login(ann), first)
    page = inbox(http)
    assert page.count("1 of 2 approvals") == 1 and page.count("0 of 2 approvals") == 1
    waiting_second = inbox(http, reason="second_approval")
    assert waiting_second.count("1 of 2 approvals") == 1 and "0 of 2" not in waiting_second
    assert "Waiting for a second approver" in inbox(http)  # the filter's option


def test_the_inbox_costs_the_same_queries_with_two_person_rows(people):
    ann, bob, _ = people
    for amount in (1, 2):
        approve(login(ann), waiting(amount=amount))
    http = login(bob)
    http.get(reverse("console:inbox"))  # warm the session and the registries
    with CaptureQueriesContext(connection) as few:
        http.get(reverse("console:inbox"))
    for amount in (3, 4, 5):
        approve(login(ann), waiting(amount=amount))
    with CaptureQueriesContext(connection) as more:
        http.get(reverse("console:inbox"))
    assert len(more) == len(few)


def test_the_first_approver_is_not_offered_approve_again(people):
    ann, bob, _ = people
    run = waiting()
    before = detail(login(ann), run)
    assert "Your approval is the first of two" in before
    approve(login(ann), run)
    page = detail(login(ann), run)
    assert "You approved this call" in page and "It waits for a second approver" in page
    assert "wait for a second person to approve it" in page
    assert "TaskPilots will call" not in page
    assert "Approve as the second approver" not in page and "Approve with changes" not in page
    assert "Reject" in page  # they may still change their mind
    second = detail(login(bob), run)
    assert "Approve as the second approver" in second
    assert "ann approved first" in second
    assert "approve it as it is (the second of two approvals)" in second
    assert "Approve with changes" not in second  # the second approves ann's parameters as-is
    assert approve(login(bob), run).status_code == 302
    assert engine.run_until_quiet(run.pk).status == Run.Status.SUCCEEDED and len(PAID) == 1


def test_the_starter_is_told_why_they_cannot_approve(people):
    ann = people[0]
    run = waiting(principal="user:ann")
    page = detail(login(ann), run)
    assert "needs two people other than you" in page
    assert "Approve as the second approver" not in page


def test_the_page_names_the_rule_that_asks_for_two(people):
    EscalationRule.objects.filter(name="two for high risk").update(
        amount_param="amount", amount_above=1000, approvers_below=1, version=3
    )
    run = waiting(amount=5000)
    request = ApprovalRequest.objects.get(run=run)
    assert request.approvers_because[0]["rule"] == "two for high risk"
    page = detail(login(people[1]), run)
    assert "0 of 2 approvals" in page
    assert "Rule “two for high risk” (v3) asks for 2 different approvers" in page
    assert "when amount is above 1,000 " in page


def test_an_approve_rule_says_its_threshold_in_its_currency(people):
    EscalationRule.objects.create(
        position=2, name="big refunds", action="approve", tool="test.twoperson_pay",
        approvers_required=2, approvers_below=0, amount_param="amount", amount_above=10000,
        amount_currency="USD", queue="support",
    )  # fmt: skip
    EscalationRule.objects.filter(name="two for high risk").update(approvers_required=1)
    run = waiting(amount=20000)
    page = detail(login(people[1]), run)
    assert "Rule “big refunds” (v1) asks for 2 different approvers" in page
    assert "when amount is above 10,000 USD" in page


def test_the_queue_hears_a_second_approver_is_needed(people):
    ann = people[0]
    channel = NotificationChannel.objects.create(
        queue="support", kind="email", target="support@example.com"
    )
    run = waiting()
    approve(login(ann), run)
    notifications.scan_timeline()
    sent = NotificationDelivery.objects.filter(channel=channel, event="second_approver")
    assert sent.count() == 1
    text = sent.get().payload["text"]
    assert "ann approved the approve call" in text and "a second person, not ann" in text
    notifications.scan_timeline()  # the sweep reads it again: still one
    assert sent.count() == 1

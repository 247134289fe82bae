"""Two-person approval in a real browser: ann approves, the page says it waits for a second
approver and the run does not move; bob approves and the run goes on."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from approvals.models import EscalationRule
from runs import engine
from runs.models import Run
from tests.approvals import test_two_person  # noqa: F401  (registers test.twoperson)
from tests.browser.conftest import log_in
from tests.factories import UserFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_second_person_releases_a_two_person_approval(page):
    EscalationRule.objects.create(
        position=1, name="two for high risk", risk="high", action="escalate", queue="support",
        approvers_required=2,
    )  # fmt: skip
    for name in ("ann", "bob"):
        UserFactory(username=name, groups=["support"])
    run, _ = engine.start_run("test.twoperson", {"amount": 40})
    run = engine.run_until_quiet(run.pk)
    assert run.status == Run.Status.NEEDS_HUMAN

    log_in(page, "ann")
    page.goto(f"/console/runs/{run.pk}/")
    expect(page.locator(".two-person")).to_contain_text("Needs two different people")
    page.get_by_role("button", name="Approve", exact=True).click()
    expect(page.locator("#flash")).to_contain_text("waits for a second approver")
    expect(page.locator(".two-person")).to_contain_text("Approved by ann")
    expect(page.locator(".two-person")).to_contain_text("waiting for a second approver")
    assert engine.run_until_quiet(run.pk).status == Run.Status.NEEDS_HUMAN

    page.context.clear_cookies()
    log_in(page, "bob")
    page.goto(f"/console/runs/{run.pk}/")
    expect(page.locator(".two-person")).to_contain_text("Approved by ann")
    page.get_by_role("button", name="Approve", exact=True).click()
    expect(page.locator("#flash")).to_contain_text("Approved")
    assert engine.run_until_quiet(run.pk).status == Run.Status.SUCCEEDED
    expect(page.locator(".run-head .status")).to_contain_text("Succeeded", timeout=8_000)
    assert test_two_person.PAID[-1] == {"amount": 40}

"""Two-person approval in a real browser: ann approves, the page says it waits for a second
approver and the run does not move (ann is no longer offered Approve; the inbox says "1 of 2
approvals" and filters such runs); bob approves and the run goes on.

With TASKPILOTS_SCREENSHOTS=1 it saves docs/screenshots/two-person-*.png (docs/console.md).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from playwright.sync_api import expect

from approvals.models import EscalationRule
from runs import engine
from runs.models import Run
from tests.approvals import test_two_person  # noqa: F401  (registers test.twoperson)
from tests.browser.conftest import log_in
from tests.factories import UserFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

OUT = Path(__file__).resolve().parents[2] / "docs" / "screenshots"


def shoot(page, name: str) -> None:
    if os.environ.get("TASKPILOTS_SCREENSHOTS"):
        page.screenshot(path=OUT / f"{name}.png", full_page=False)


def fits(page) -> bool:
    return page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")


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
    # ann is not offered Approve again, and is told why.
    page.reload()
    expect(page.locator(".two-person-note")).to_contain_text("You approved this call")
    expect(page.get_by_role("button", name="Approve", exact=True)).to_have_count(0)
    page.goto("/console/?reason=second_approval")
    expect(page.locator(".badge--two-person")).to_have_text("1 of 2 approvals")

    page.context.clear_cookies()
    log_in(page, "bob")
    page.goto("/console/")
    expect(page.locator(".badge--two-person")).to_have_text("1 of 2 approvals")
    shoot(page, "two-person-inbox")
    page.goto(f"/console/runs/{run.pk}/")
    expect(page.locator(".two-person")).to_contain_text("Approved by ann")
    expect(page.locator(".action--primary h3")).to_have_text("Approve as the second approver")
    expect(page.locator(".action--primary .help")).to_contain_text("ann approved first")
    shoot(page, "two-person-second")
    page.set_viewport_size({"width": 390, "height": 844})
    assert fits(page), "the second approver's page scrolls sideways on a phone"
    shoot(page, "two-person-second-phone")
    page.set_viewport_size({"width": 1440, "height": 1000})
    page.get_by_role("button", name="Approve", exact=True).click()
    expect(page.locator("#flash")).to_contain_text("Approved")
    assert engine.run_until_quiet(run.pk).status == Run.Status.SUCCEEDED
    expect(page.locator(".run-head .status")).to_contain_text("Succeeded", timeout=8_000)
    assert test_two_person.PAID[-1] == {"amount": 40}

"""The approval gate and people's tokens in a real browser, at a phone's, a laptop's and a wide
screen's width, in English and Chinese: a call nobody approved as it is shows what differs and
how many people it needs, and two people release it; a person makes a token, sees it once and
revokes it."""

from __future__ import annotations

import os
from decimal import Decimal
from pathlib import Path

import pytest
from playwright.sync_api import expect

from approvals import actions
from approvals.models import ApprovalRequest, EscalationRule
from runs import engine
from runs.api.models import PersonalToken
from runs.models import Run
from tests.browser.conftest import log_in
from tests.factories import UserFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WIDTHS = (390, 1024, 1440)
# Where to keep the screenshots for a person to look at (unset: not kept).
SHOTS = os.environ.get("TASKPILOTS_SHOTS_DIR")


# The elements wider than the window, for the failure message.
TOO_WIDE = """[...document.querySelectorAll('body *')]
  .filter(e => e.getBoundingClientRect().right > window.innerWidth + 1)
  .slice(0, 5).map(e => e.outerHTML.slice(0, 120))"""


def fits(page) -> bool:
    """The page does not scroll sideways (content may scroll inside its own box)."""
    if page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1"):
        return True
    print("too wide:", page.evaluate(TOO_WIDE))
    return False


def shoot(page, name: str) -> None:
    if SHOTS:
        page.screenshot(path=str(Path(SHOTS) / f"{name}.png"))


def switch_to_chinese(page) -> None:
    page.locator("button.lang[value=zh-hans]").click()
    page.wait_for_load_state()


def test_a_call_nobody_approved_as_it_is_waits_for_the_people_it_needs(page, sandbox):
    EscalationRule.objects.create(
        position=1, name="refunds above 1,000: two people", tool="payments.refund",
        action="escalate", queue="support", approvers_required=2, approvers_below=1,
        amount_param="amount", amount_above=Decimal("1000"),
    )  # fmt: skip
    ann, bob, cat = (UserFactory(username=n, groups=["support"]) for n in ("ann", "bob", "cat"))
    run, _ = engine.start_run("test.refund", {"amount": 300, "payment": "p" * 101})
    run = engine.run_until_quiet(run.pk)
    actions.decide_approval(ApprovalRequest.objects.get(run=run).pk, ann, "approved")
    engine.run_until_quiet(run.pk)
    actions.retry_with_edits(run.pk, ann, {"payment_id": "pay_1", "amount": 99999})
    run = engine.run_until_quiet(run.pk)
    assert run.status == Run.Status.NEEDS_HUMAN

    log_in(page, "bob")
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(f"/console/runs/{run.pk}/")
        expect(page.locator("body")).to_contain_text("amount 300 → 99999")
        expect(page.locator(".two-person")).to_contain_text("Needs two different people")
        assert fits(page), f"the run page scrolls sideways at {width} px"
        shoot(page, f"gate-approval-{width}")
    switch_to_chinese(page)
    expect(page.locator(".two-person")).to_contain_text("两位")
    assert fits(page)
    shoot(page, "gate-approval-1440-zh")
    page.locator("button.lang[value=en]").click()
    page.get_by_role("button", name="Approve", exact=True).click()
    expect(page.locator("#flash")).to_contain_text("waits for a second approver")
    assert sandbox.ledger(system="payments") == []

    page.context.clear_cookies()
    log_in(page, "cat")
    page.goto(f"/console/runs/{run.pk}/")
    page.get_by_role("button", name="Approve", exact=True).click()
    expect(page.locator("#flash")).to_contain_text("Approved")
    engine.run_until_quiet(run.pk)
    assert [e["request"]["amount"] for e in sandbox.ledger(system="payments")] == [99999]
    assert cat.pk


def test_a_person_makes_a_token_sees_it_once_and_revokes_it(page):
    UserFactory(username="sam", groups=["support"])
    log_in(page, "sam")
    page.locator("a.who").click()
    expect(page.locator("h1")).to_have_text("Your API tokens")
    page.fill("input[name=name]", "approvals from my scripts")
    page.check("input[name=scopes][value='approvals:write']")
    page.get_by_role("button", name="Create the token").click()
    secret = page.locator(".token-secret").inner_text().strip()
    token = PersonalToken.objects.get(user__username="sam")
    assert secret.startswith(token.token_id + ".") and token.check_secret(secret.split(".", 1)[1])
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        assert fits(page), f"the tokens page scrolls sideways at {width} px"
        shoot(page, f"tokens-{width}")
    page.goto("/console/tokens/")
    expect(page.locator(".token-secret")).to_have_count(0)  # shown once
    switch_to_chinese(page)
    expect(page.locator("h1")).to_have_text("您的 API 令牌")
    shoot(page, "tokens-zh")
    page.locator("button.lang[value=en]").click()
    page.get_by_role("button", name="Revoke").click()
    expect(page.locator("tbody")).to_contain_text("revoked")
    token.refresh_from_db()
    assert token.revoked_at is not None

"""The main path in a real browser: a support agent opens a paused run from the inbox, approves
it, watches it go on, and agent-supplied markup stays inert text."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from approvals.models import HumanDecision
from runs import engine
from runs.models import Run
from tests.approvals.console_helpers import start
from tests.browser.conftest import log_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

XSS = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">'


def test_support_approves_a_paused_run_and_sees_it_continue(page, sandbox, support_user):
    run = start("test.refund", {"amount": 150, "payment": "pay_1", "note": XSS})
    assert run.status == "needs_human"
    log_in(page, support_user.username)

    row = page.locator("table.runs tbody tr").first
    expect(row).to_contain_text("test.refund")
    expect(row).to_contain_text("Approval")
    row.get_by_role("link", name="Open").click()
    page.wait_for_url(f"**/console/runs/{run.pk}/")
    expect(page.locator(".run-head")).to_contain_text("Needs a person")
    expect(page.locator(".suggestion")).to_contain_text("payments.refund")

    page.get_by_role("button", name="Approve", exact=True).click()
    expect(page.locator("#flash")).to_contain_text("Approved")
    decision = HumanDecision.objects.get(run=run)
    assert decision.verb == "approve" and decision.user == support_user

    # A worker would pick the run up now; here the engine runs in-process and the page, which
    # polls while the run moves, shows where it went.
    assert Run.objects.get(pk=run.pk).status == "running"
    engine.run_until_quiet(run.pk)
    expect(page.locator(".run-head .status")).to_contain_text("Waiting", timeout=8_000)
    expect(page.locator(".tl--done")).to_have_count(3)
    expect(page.locator(".receipt--committed")).to_have_count(1)
    assert page.evaluate("window.__pwned") is None
    assert not [e for e in page.console_errors if "Content Security Policy" in e]


def test_injected_markup_stays_inert_text(page, sandbox, support_user):
    run = start(
        "test.refund",
        {"amount": 150, "payment": f'pay_1"><a href="javascript:alert(1)" hx-get="/x">{XSS}'},
    )
    log_in(page, support_user.username)
    page.goto(f"/console/runs/{run.pk}/")
    params = page.locator(".pending pre.json").first
    expect(params).to_contain_text("<script>window.__pwned=1</script>")
    expect(params).to_contain_text("<img src=x onerror=")
    assert page.locator("img[src=x]").count() == 0
    assert page.locator("a[href^='javascript:']").count() == 0
    assert page.locator("main script").count() == 0
    assert page.evaluate("window.__pwned") is None

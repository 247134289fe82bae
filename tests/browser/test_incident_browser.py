"""The incident desk in a real browser, at a desktop's and a phone's width: the inbox groups
the runs one mail outage stopped, its "Preview retry" opens the bulk form with that group's
filters, and a Reason chosen in place (htmx) is what the "Bulk action…" link carries into the
preview — only the outage's runs, not every cause's.

With TASKPILOTS_SCREENSHOTS=1 it also saves docs/screenshots/incident-view.png."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.approvals.bulk_helpers import outage_parked_runs
from tests.approvals.console_helpers import approval_run, invalid_data_run
from tests.browser.conftest import log_in

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(180),
]

OUT = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
RUNS = 12


def fits(page) -> bool:
    return page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")


@pytest.fixture
def incident(sandbox):
    runs = outage_parked_runs(sandbox, RUNS)
    approval_run()
    invalid_data_run()
    invalid_data_run()
    return runs


@pytest.mark.parametrize("width", [1440, 390])
def test_the_inbox_groups_an_outage_and_previews_its_retry(page, support_user, incident, width):
    page.set_viewport_size({"width": width, "height": 1000})
    log_in(page, support_user.username)
    group = page.locator(".incident").first
    expect(group).to_contain_text(f"{RUNS} runs stopped:")
    expect(group).to_contain_text("mail.send")
    expect(group).to_contain_text("System outage")
    assert fits(page)
    if os.environ.get("TASKPILOTS_SCREENSHOTS"):
        name = "incident-view.png" if width == 1440 else "incident-view-390.png"
        page.screenshot(path=OUT / name, full_page=False)

    group.get_by_role("link", name="Preview retry").click()
    expect(page.locator("#bulk-reason")).to_have_value("outage")
    expect(page.locator("#bulk-tool")).to_have_value("mail.send")
    expect(page.locator("#bulk-status")).to_have_value("inbox")
    expect(page.locator("#bulk-action")).to_have_value("retry")
    assert fits(page)
    page.get_by_role("button", name="Preview").click()
    expect(page.locator(".bulk-summary")).to_contain_text(
        f"{RUNS} runs will be acted on; 0 skipped"
    )
    assert fits(page)
    assert page.console_errors == []


@pytest.mark.parametrize("width", [1440, 390])
def test_the_bulk_link_carries_a_reason_chosen_in_place(page, support_user, incident, width):
    page.set_viewport_size({"width": width, "height": 1000})
    log_in(page, support_user.username)
    expect(page.locator(".counter-n").first).to_have_text(str(RUNS + 3))
    page.select_option("#id_reason", "outage")  # htmx: the list is swapped, not the page
    page.wait_for_url("**/console/?*reason=outage*")
    expect(page.locator(".counter-n").first).to_have_text(str(RUNS + 3))
    expect(page.locator("#inbox-live tbody tr")).to_have_count(RUNS)
    link = page.get_by_role("link", name="Bulk action…")
    expect(link).to_have_attribute("href", "/console/bulk/new/?status=inbox&reason=outage")
    assert fits(page)
    link.click()
    expect(page.locator("#bulk-reason")).to_have_value("outage")
    page.select_option("#bulk-action", "retry")
    page.get_by_role("button", name="Preview").click()
    expect(page.locator(".bulk-summary")).to_contain_text(
        f"{RUNS} runs will be acted on; 0 skipped"
    )
    assert fits(page)
    assert page.console_errors == []

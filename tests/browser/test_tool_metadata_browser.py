"""An admin decides a tool's risk on the tools page in a real browser: the form posts with htmx,
the tool's entry stays open with the outcome, a less careful change asks for confirmation, and
nothing the page does trips the Content Security Policy."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from approvals import local_metadata
from approvals.models import ToolMetadataOverride
from approvals.tool_metadata import anchor_of
from runs import tools
from tests.browser.conftest import log_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def fresh_local_metadata():
    # The live server's threads share this process's copy of the decisions; the flush after
    # the test removes the rows but not the copy.
    local_metadata.CACHE.reset()
    yield
    local_metadata.CACHE.reset()


def test_an_admin_raises_a_tools_risk_and_confirms_lowering_it(page, admin_user):
    log_in(page, admin_user.username)
    page.goto("/console/rules/tools/")
    entry = page.locator(f"#{anchor_of('mail.send')}")
    entry.locator("summary").click()
    entry.get_by_label("Risk").select_option("high")
    entry.get_by_label("Why").fill("bounces cost us <b>money</b>")
    entry.get_by_role("button", name="Save the decision").click()

    entry = page.locator(f"#{anchor_of('mail.send')}")  # swapped in by htmx
    expect(entry.locator(".flash--success")).to_contain_text("The decision over mail.send")
    expect(entry).to_have_attribute("open", "")
    expect(entry.locator("summary")).to_contain_text("local decision")
    expect(entry.locator("summary .badge")).to_have_text("High")
    expect(entry.locator(".decisions")).to_contain_text("bounces cost us <b>money</b>")
    assert page.url.endswith("/console/rules/tools/")  # no navigation: the part was swapped
    assert tools.get("mail.send").risk == "high"

    entry.get_by_label("Risk").select_option("low")
    entry.get_by_label("Why").fill("the storm is over")
    entry.get_by_role("button", name="Save the decision").click()
    entry = page.locator(f"#{anchor_of('mail.send')}")
    expect(entry.locator(".flash--warning")).to_contain_text("would go down from High to Low")
    assert ToolMetadataOverride.objects.count() == 1
    entry.get_by_label("I understand").check()
    entry.get_by_role("button", name="Save the decision").click()
    entry = page.locator(f"#{anchor_of('mail.send')}")
    expect(entry.locator(".flash--success")).to_be_visible()
    expect(entry.locator("summary .badge")).to_have_text("Low")
    assert ToolMetadataOverride.in_force("mail.send").loosened == ["risk"]
    assert page.locator("main b").count() == 0
    assert not [e for e in page.console_errors if "Content Security Policy" in e]

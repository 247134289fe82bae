"""A mail's Approve link in a real browser at a desk's, a laptop's and a phone's width: the
confirmation page fits without sideways scrolling, has no script error, and its button approves
through the console's action (tests/approvals/test_mail_decisions.py covers the refusals)."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import expect

from approvals import notifications
from approvals.models import ApprovalRequest, NotificationChannel
from tests.approvals.console_helpers import approval_run
from tests.browser.conftest import log_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.mark.parametrize("width", [1440, 1024, 390])
def test_the_confirmation_page_fits_and_approves(page, support_user, mailoutbox, width):
    NotificationChannel.objects.create(queue="support", kind="email", target=support_user.email)
    run = approval_run()
    notifications.sweep()
    (message,) = mailoutbox
    approve = urlsplit(re.search(r"^Approve: (\S+)$", message.body, re.M)[1]).path
    page.set_viewport_size({"width": width, "height": 844})
    log_in(page, support_user.username)
    page.goto(approve)
    expect(page.get_by_role("heading", name="Approve this call?")).to_be_visible()
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
    page.get_by_role("button", name="Yes, approve").click()
    page.wait_for_url(f"**/console/runs/{run.pk}/")
    expect(page.locator(".messages")).to_contain_text("Approved.")
    assert ApprovalRequest.objects.get(run=run).decided_by == support_user
    assert page.console_errors == []

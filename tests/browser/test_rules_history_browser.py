"""An admin edits a rule, previews it against the last 7 days of failures in a real browser
(htmx posts the form's current values), and nothing is saved until Save."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from approvals.models import EscalationRule
from tests.approvals.test_rules_history import failing_run
from tests.browser.conftest import log_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_an_admin_sees_a_change_on_history_before_saving_it(page, admin_user):
    rule = EscalationRule.objects.create(
        name="Flaky writes: retry", position=1, workflow="test.flaky", action="retry",
        queue="ops", max_attempts=5, version=1,
    )  # fmt: skip
    runs = [failing_run(2) for _ in range(3)]
    assert {run.status for run in runs} == {"succeeded"}
    log_in(page, admin_user.username)
    page.goto(f"/console/rules/{rule.pk}/")
    page.select_option("select[name=action]", "escalate")

    page.get_by_role("button", name="last 7 days").click()
    preview = page.locator("#history-preview")
    person = preview.locator("tr.preview-person")
    expect(person.locator("[data-side=current]")).to_have_text("0")
    expect(person.locator("[data-side=proposed]")).to_have_text("3")
    expect(preview.locator(".preview-changed")).to_contain_text("3 failing steps take another")
    expect(preview.locator(".preview-changes a")).to_have_count(3)
    rule.refresh_from_db()
    assert rule.action == "retry" and rule.version == 1  # only previewed

    page.get_by_role("button", name="Save as a new version").click()
    page.wait_for_url("**/console/rules/")
    rule.refresh_from_db()
    assert rule.action == "escalate" and rule.version == 2
    assert not [e for e in page.console_errors if "Content Security Policy" in e]

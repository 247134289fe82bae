"""The metrics dashboard in a real browser (Debian's Chromium): an auditor reads a week of
figures served from stored rows, reads a definition from its popover, switches to the last
24 hours, and the page raises no CSP or script errors."""

from __future__ import annotations

import pytest
from django.utils import timezone

from tests.browser.conftest import log_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_an_auditor_reads_a_week_of_recovery_figures(page):
    from approvals.metrics.dashboard import compute
    from approvals.metrics.store import rollup
    from approvals.metrics.window import parse_window
    from approvals.models import MetricsDay
    from taskpilots.evidence.loadgen import load_fake_runs
    from tests.factories import UserFactory

    now = timezone.now()
    load_fake_runs(300, days=7, batch_size=300, seed=5, now=now)
    rollup(now=now, full=True)
    assert MetricsDay.objects.exists()  # the week's past days come from day rows
    expected = compute(parse_window({"window": "7d"}, now=now), now=now)
    success = {f.key: f for f in expected.figures}["execution_success_rate"]
    UserFactory(username="ada.auditor", groups=["auditor"])

    log_in(page, "ada.auditor")
    page.goto("/console/metrics/?window=7d")
    card = page.locator("#m-execution_success_rate")
    assert card.locator(".metric-value").inner_text() == f"{success.value * 100:.1f} %"
    # Every figure has its trend line: one point per day that had runs.
    assert page.locator("svg.spark").count() >= 15
    points = card.locator("svg.spark polyline").first.get_attribute("points").split()
    assert len(points) >= 7
    # The definition opens on keyboard focus (CSS only: the CSP allows no inline script).
    help_pop = card.locator(".help-pop")
    assert not help_pop.is_visible()
    card.locator(".metric-help").focus()
    assert help_pop.is_visible()
    assert help_pop.inner_text().startswith("Runs started in the window that ended succeeded")
    page.get_by_role("link", name="24 hours").click()
    page.wait_for_url("**/console/metrics/?window=24h")
    assert page.locator('.window-pick a[aria-current="page"]').inner_text() == "24 hours"
    assert page.locator("#m-tool_failure_rate .metric-value").inner_text() != "—"
    assert page.console_errors == []

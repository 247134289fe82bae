"""An auditor in a real browser (Debian's Chromium): finds a run on the audit page, reads its
timeline with the lane chart, and the page raises no CSP or script errors.

With TASKPILOTS_SCREENSHOTS=1 it also saves docs/screenshots/timeline.png.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from tests.browser.conftest import log_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

OUT = Path(__file__).resolve().parents[2] / "docs" / "screenshots"


class Clock:
    """Drives time for the engine, so the run has the pauses a real one has (hours waiting for
    a person, minutes of retry backoff) without the test waiting for them."""

    def __init__(self, start):
        self.now = start

    def __call__(self):
        self.now += timedelta(milliseconds=150)
        return self.now

    def advance(self, **delta):
        self.now += timedelta(**delta)


def _story(sandbox, monkeypatch):
    from approvals import actions
    from approvals.models import ApprovalRequest
    from runs import engine
    from runs.models import SideEffect, Step
    from tests.factories import UserFactory
    from tests.runs.test_audit_events import _ensure_default_rules

    _ensure_default_rules()
    support = UserFactory(username="mei.support", groups=["support"])
    clock = Clock(timezone.now() - timedelta(hours=6))
    monkeypatch.setattr(timezone, "now", clock)
    run, _ = engine.start_run("test.refund", {"amount": 240, "payment": "pay_7Hq2"})
    run = engine.run_until_quiet(run.pk)
    clock.advance(hours=2, minutes=10)  # nobody looked for two hours
    actions.take_over(run.pk, support)
    clock.advance(minutes=25)
    approval = ApprovalRequest.objects.get(run=run)
    actions.decide_approval(approval.pk, support, "approved_with_edits",
                            edited_params={"payment_id": "pay_7Hq2", "amount": 200},
                            comment="Partial refund, as agreed by phone")  # fmt: skip
    clock.advance(minutes=2)
    actions.release(run.pk, support, needed_engineer=False)
    sandbox.inject("payments", "429", action="refund", count=2)
    run = engine.run_until_quiet(run.pk)
    for minutes in (3, 6):
        clock.advance(minutes=minutes)
        Step.objects.filter(run=run, status="retry_scheduled").update(next_attempt_at=clock.now)
        run = engine.run_until_quiet(run.pk)
    clock.advance(minutes=50)
    refund = SideEffect.objects.get(run=run, tool="payments.refund")
    engine.deliver_event("evt-settle-1", "payment.settled", refund.external_id, {"ok": True})
    run = engine.run_until_quiet(run.pk)
    monkeypatch.undo()
    return run


def test_an_auditor_finds_a_run_and_reads_its_timeline(page, sandbox, monkeypatch):
    from tests.factories import UserFactory

    run = _story(sandbox, monkeypatch)
    assert run.status == "succeeded", run.status
    UserFactory(username="ada.auditor", groups=["auditor"])
    log_in(page, "ada.auditor")
    page.click("nav.mainnav >> text=Audit")
    page.select_option("select[name=workflow]", "test.refund")
    page.click("#audit-results a.mono")
    page.wait_for_url(f"**/console/runs/{run.pk}/timeline/")
    assert page.locator(".chain--ok").is_visible()
    assert page.locator("svg.lanes .bar--human").count() >= 1
    # The two 429s: two markers, or one standing for both where they fall on the same spot.
    failures = page.locator("svg.lanes .marker--failure")
    titles = " ".join(failures.locator("title").all_text_contents())
    assert failures.count() >= 2 or (failures.count() == 1 and "(and 1 more here)" in titles)
    assert page.locator("svg.lanes .marker--decision").count() >= 2
    page.click(".kind-filter >> text=Approval")
    page.wait_for_url("**?kind=approval")
    assert page.locator(".audit-event").count() >= 2
    assert page.console_errors == []
    if os.environ.get("TASKPILOTS_SCREENSHOTS"):
        page.goto(f"/console/runs/{run.pk}/timeline/")
        page.set_viewport_size({"width": 1440, "height": 1300})
        page.screenshot(path=OUT / "timeline.png", full_page=False)


def test_an_auditor_pages_to_the_oldest_runs_and_back_with_htmx(page):
    # The keyset pager swaps only the results and pushes each page's URL; Last then Previous
    # reach the oldest runs and the ones just newer, with no script or CSP error.
    from runs.models import Run
    from tests.factories import RunFactory, UserFactory

    start = timezone.now() - timedelta(days=2)
    for minutes in range(60):
        at = start - timedelta(minutes=minutes)
        RunFactory(created_at=at, updated_at=at)
    oldest = list(Run.objects.order_by("created_at", "id").values_list("pk", flat=True))
    UserFactory(username="ada.auditor", groups=["auditor"])
    log_in(page, "ada.auditor")
    page.goto("/console/audit/?outcome=open")
    page.click("#audit-results nav.pager >> text=Last")
    page.wait_for_url("**last=1")
    shown = page.locator("#audit-results tbody a.mono").evaluate_all(
        "links => links.map(a => a.getAttribute('href'))"
    )
    assert shown[-1].endswith(f"/console/runs/{oldest[0]}/timeline/")
    assert len(shown) == 25
    page.click("#audit-results nav.pager >> text=Previous")
    page.wait_for_url("**before=*")
    assert page.locator("#audit-results tbody tr").count() == 25
    assert page.locator("#audit-results nav.pager >> text=Next").is_visible()
    page.click("#audit-results nav.pager >> text=First")
    page.wait_for_url("**/console/audit/?outcome=open")
    assert not page.locator("#audit-results nav.pager >> text=Previous").count()
    assert page.console_errors == []

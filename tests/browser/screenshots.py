"""Screenshots of the console for docs/screenshots/, from a live server with realistic runs.

Not part of the suite (the file name does not match test_*.py); run it explicitly:

    pytest tests/browser/screenshots.py -p no:randomly

It drives the demo workflows against the sandbox so every paused run is a real one: a refund
waiting for approval, a CRM write whose outcome is unknown, a mail outage that outlasted its
wait window, a lead with invalid data, and a run someone took over.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from django.db.models import F
from django.utils import timezone

import taskpilots.demo.workflows  # noqa: F401  (registers the demo workflows)
from approvals import actions
from approvals.models import ApprovalRequest
from runs import engine
from runs.models import Run, Step, Wait
from tests.approvals.console_helpers import start
from tests.browser.conftest import log_in
from tests.factories import UserFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

OUT = Path(__file__).resolve().parents[2] / "docs" / "screenshots"


def _outage_run(sandbox, n):
    sandbox.inject("mail", "outage", seconds=600)
    message = "Where is my package? Order 88412"
    run = start(
        "support.reply", {"message": message, "email": f"mia{n}@example.com", "ticket_id": "T-1"}
    )
    Wait.objects.filter(run=run, status="pending").update(
        due_at=timezone.now() - timedelta(seconds=1)
    )
    engine.sweep(now=timezone.now() + timedelta(seconds=61))
    run = engine.run_until_quiet(run.pk)
    sandbox.clear_faults()
    return run


def _age(run, *, hours, due_in_hours=None):
    """Move the run back in time, with its steps and approval, so the page does not show it
    started five hours before the approval it asked for at the same moment. (Timeline events
    and snapshots are append-only and keep their times.)"""
    shift = timedelta(hours=hours)
    updates = {"created_at": F("created_at") - shift}
    if due_in_hours is not None:
        due = timezone.now() + timedelta(hours=due_in_hours)
        updates["attention_due_at"] = due
        Wait.objects.filter(run=run, status="pending").update(due_at=due)
        ApprovalRequest.objects.filter(run=run).update(due_at=due)
    Run.objects.filter(pk=run.pk).update(**updates)
    Step.objects.filter(run=run).update(
        created_at=F("created_at") - shift,
        started_at=F("started_at") - shift,
        finished_at=F("finished_at") - shift,
    )
    ApprovalRequest.objects.filter(run=run).update(created_at=F("created_at") - shift)


def test_take_screenshots(page, sandbox):
    support = UserFactory(username="mei.support", groups=["support"])
    other = UserFactory(username="jonas.ops", groups=["support"])
    OUT.mkdir(parents=True, exist_ok=True)

    refund = start("refund.approval", {"payment_id": "pay_7Hq2", "amount": 240.0,
                                       "reason": "Charged twice for order 88412"},
                   business_key="order-88412/refund")  # fmt: skip
    _age(refund, hours=5, due_in_hours=-1.2)
    start(
        "refund.approval",
        {"payment_id": "pay_9Kd1", "amount": 129.5},
        business_key="order-90311/refund",
    )
    sandbox.inject("crm", "commit_then_500", action="create")
    unknown = start("crm.lead_sync", {"email": "lena.kraus@example.com", "name": "Lena Kraus",
                                      "company": "Kraus GmbH", "employees": 800})  # fmt: skip
    _age(unknown, hours=2, due_in_hours=0.5)
    outage = _outage_run(sandbox, 1)
    _age(outage, hours=1, due_in_hours=3)
    invalid = start("crm.lead_sync", {"email": "not-an-address", "name": "Unknown lead"})
    _age(invalid, hours=26)
    taken = start("refund.approval", {"payment_id": "pay_3Zx8", "amount": 1200.0})
    actions.take_over(taken.pk, other)
    for n in range(4):
        message = "How do I reset my password?"
        start(
            "support.reply", {"message": message, "email": f"u{n}@example.com", "ticket_id": "T-2"}
        )
    assert Run.objects.filter(status__in=Run.HUMAN).count() >= 6

    log_in(page, support.username)
    page.goto("/console/")
    page.screenshot(path=OUT / "inbox.png", full_page=True)
    page.goto(f"/console/runs/{refund.pk}/")
    page.screenshot(path=OUT / "run-detail-approval.png", full_page=True)
    page.goto(f"/console/runs/{unknown.pk}/")
    page.screenshot(path=OUT / "run-detail-unknown-outcome.png", full_page=True)
    page.goto(f"/console/runs/{outage.pk}/")
    page.screenshot(path=OUT / "run-detail-outage.png", full_page=True)
    page.goto(f"/console/runs/{invalid.pk}/")
    page.screenshot(path=OUT / "run-detail-invalid-data.png", full_page=True)
    page.goto("/console/runs/")
    page.screenshot(path=OUT / "all-runs.png", full_page=True)
    page.locator(".lang-switch button[value=zh-hans]").click()
    page.goto("/console/")
    page.screenshot(path=OUT / "inbox-zh-hans.png", full_page=True)
    page.goto(f"/console/runs/{refund.pk}/")
    page.screenshot(path=OUT / "run-detail-approval-zh-hans.png", full_page=True)


def test_take_incident_screenshots(page, admin_user):
    """Two-person approval waiting for its second approver, and a rule change previewed
    against the last 7 days of failures before it is saved."""
    from approvals.models import EscalationRule
    from tests.approvals import test_two_person  # noqa: F401  (registers test.twoperson)
    from tests.approvals.test_rules_history import failing_run

    OUT.mkdir(parents=True, exist_ok=True)
    EscalationRule.objects.create(
        position=1, name="Two approvers for high risk", risk="high", action="escalate",
        queue="support", approvers_required=2,
    )  # fmt: skip
    ann = UserFactory(username="ann.support", groups=["support"])
    run, _ = engine.start_run("test.twoperson", {"amount": 480})
    engine.run_until_quiet(run.pk)
    log_in(page, ann.username)
    page.goto(f"/console/runs/{run.pk}/")
    page.get_by_role("button", name="Approve", exact=True).click()
    page.locator(".two-person").filter(has_text="waiting for a second approver").wait_for()
    page.screenshot(path=OUT / "run-detail-two-person.png", full_page=True)

    rule = EscalationRule.objects.create(
        name="Flaky writes: retry", position=2, workflow="test.flaky", action="retry",
        queue="ops", max_attempts=5, version=1,
    )  # fmt: skip
    for _ in range(3):
        failing_run(2)
    page.context.clear_cookies()
    log_in(page, admin_user.username)
    page.goto(f"/console/rules/{rule.pk}/")
    page.select_option("select[name=action]", "escalate")
    page.get_by_role("button", name="last 7 days").click()
    page.locator("#history-preview .preview-changed").wait_for()
    page.screenshot(path=OUT / "rule-history-preview.png", full_page=True)


def test_take_operations_screenshots(page, chromium, live_server, sandbox):
    """A bulk retry previewed, under way (its progress bar) and done; two people on one run,
    one of them handling it (the live bar)."""
    from approvals import bulk
    from approvals.models.bulk import BulkAction
    from tests.approvals.bulk_helpers import outage_parked_runs
    from tests.approvals.console_helpers import approval_run
    from tests.runs import flows  # noqa: F401  (registers test.reply)

    OUT.mkdir(parents=True, exist_ok=True)
    ann = UserFactory(username="ann.support", groups=["support"])
    UserFactory(username="bob.support", groups=["support"])
    outage_parked_runs(sandbox, 12)
    log_in(page, ann.username)
    page.goto("/console/?reason=outage")
    page.get_by_role("link", name="Bulk action…").click()
    page.select_option("#bulk-action", "retry")
    page.fill("#bulk-comment", "Mail provider is back (incident 4711)")
    page.get_by_role("button", name="Preview").click()
    page.locator(".bulk-summary").wait_for()
    page.screenshot(path=OUT / "bulk-preview.png", full_page=True)

    # No worker here (DISPATCH=none): the job is carried out step by step in-process, so the
    # progress bar can be caught half way.
    page.get_by_role("button", name="Do it for 12 runs").click()
    page.locator("#bulk-progress progress").wait_for()
    job = BulkAction.objects.get()
    for _ in range(5):
        bulk.execute_next(job)
    page.reload()
    page.locator(".bulk-counts").filter(has_text="5 of 12").wait_for()
    page.screenshot(path=OUT / "bulk-progress.png", full_page=True)
    bulk.execute(job.pk)
    page.reload()
    page.locator(".bulk-counts").filter(has_text="12 done").wait_for()
    page.screenshot(path=OUT / "bulk-result.png", full_page=True)

    run = approval_run()
    other = chromium.new_context(
        base_url=live_server.url, locale="en-US", viewport={"width": 1440, "height": 1000}
    ).new_page()
    log_in(other, "bob.support")
    other.goto(f"/console/runs/{run.pk}/")
    other.get_by_role("button", name="I'll handle it").click()
    other.locator("#live .claim").filter(has_text="You are handling this").wait_for()
    page.goto(f"/console/runs/{run.pk}/")
    page.locator("#live .presence").filter(has_text="Also viewing: bob.support").wait_for()
    page.locator("#live .claim").filter(has_text="bob.support is handling this").wait_for()
    page.screenshot(path=OUT / "run-detail-live.png", full_page=False)
    other.context.close()


def test_take_phone_and_keyboard_screenshots(chromium, live_server, sandbox):
    """The inbox and a run waiting for approval at 390, 1024 and 1440 px wide, in English and
    Chinese, and the keyboard shortcuts' help (docs/console.md, "Phone and keyboard")."""
    from tests.approvals.console_helpers import approval_run, invalid_data_run

    OUT.mkdir(parents=True, exist_ok=True)
    support = UserFactory(username="mei.support", groups=["support"])
    run = approval_run(note="Charged twice for order 88412")
    invalid_data_run()
    for n in range(3):
        approval_run(payment=f"pay_{n}")
    shots = [
        (390, 844, "en-US", "/console/", "phone-inbox.png"),
        (390, 844, "en-US", f"/console/runs/{run.pk}/", "phone-run-approval.png"),
        (390, 844, "zh-Hans", f"/console/runs/{run.pk}/", "phone-run-approval-zh-hans.png"),
        (1024, 768, "en-US", "/console/", "laptop-inbox-1024.png"),
        (1440, 900, "en-US", "/console/", "desk-inbox-1440.png"),
        (1440, 900, "zh-Hans", "/console/", "desk-inbox-1440-zh-hans.png"),
    ]
    for width, height, locale, url, name in shots:
        context = chromium.new_context(
            base_url=live_server.url, locale=locale, viewport={"width": width, "height": height}
        )
        page = context.new_page()
        log_in(page, support.username)
        page.goto(url)
        page.screenshot(path=OUT / name, full_page=False)
        if name == "desk-inbox-1440.png":
            page.keyboard.press("j")
            page.keyboard.press("?")
            page.locator("#shortcut-help").wait_for()
            page.screenshot(path=OUT / "keyboard-shortcuts.png", full_page=False)
        context.close()

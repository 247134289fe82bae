"""Bulk jobs in a real browser, at a desktop's and a phone's width: runs picked with the
inbox's checkboxes (kept across its live refresh) become a preview of exactly those runs; the
job runs, its page shows each run's status now; the jobs page lists it with its progress. No
page scrolls sideways.

With TASKPILOTS_SCREENSHOTS=1 it also saves docs/screenshots/bulk-jobs.png."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from playwright.sync_api import expect

from approvals import bulk
from approvals.models.bulk import BulkAction
from tests.approvals.bulk_helpers import outage_parked_runs
from tests.browser.conftest import log_in

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(180),
]

OUT = Path(__file__).resolve().parents[2] / "docs" / "screenshots"


def fits(page) -> bool:
    return page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")


@pytest.mark.parametrize("width", [1440, 390])
def test_pick_runs_in_the_inbox_run_the_job_and_find_it_on_the_jobs_page(
    page, sandbox, support_user, width
):
    runs = outage_parked_runs(sandbox, 6)
    page.set_viewport_size({"width": width, "height": 1000})
    log_in(page, support_user.username)
    assert fits(page)
    boxes = page.locator("#inbox-live input[name=runs]")
    expect(boxes).to_have_count(6)
    boxes.nth(0).check()
    boxes.nth(2).check()
    expect(page.locator("[data-pick-count]")).to_have_text("2")
    # A live refresh (forced here: a filter applied and cleared in place) keeps the picks.
    page.select_option("#id_owner", "unassigned")
    page.wait_for_url("**owner=unassigned*")
    expect(page.locator("#inbox-live input[name=runs]:checked")).to_have_count(2)
    picked = page.locator("#inbox-live input[name=runs]:checked").evaluate_all(
        "boxes => boxes.map(b => b.value)"
    )
    page.get_by_role("button", name="Bulk action on the runs picked below").click()
    expect(page.locator(".picked-runs")).to_contain_text("2 runs picked in the list")
    page.select_option("#bulk-action", "retry")
    page.get_by_role("button", name="Preview").click()
    expect(page.locator(".bulk-summary")).to_contain_text("2 runs will be acted on; 0 skipped")
    expect(page.locator(".tool-health")).to_contain_text("mail.send answers again.")
    assert fits(page)
    job = BulkAction.objects.get()
    assert sorted(str(i.run_id) for i in job.items.all()) == sorted(picked)

    page.get_by_role("button", name="Do it for 2 runs").click()
    bulk.execute(job.pk)  # what a worker does (tests/approvals/test_bulk_worker.py has one)
    page.reload()
    expect(page.locator(".bulk-results tbody tr")).to_have_count(2)
    expect(page.locator(".bulk-results")).to_contain_text("Action applied")
    assert fits(page)

    # Another job, left previewed, so the list shows both states.
    bulk.preview(support_user, "retry", {"status": "inbox", "reason": "outage"}, {})
    page.goto("/console/bulk/")
    rows = page.locator(".bulk-jobs tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.nth(1)).to_contain_text("2 of 2: 2 done, 0 skipped, 0 failed")
    expect(rows.nth(0)).to_contain_text("previewed, not started")
    assert fits(page)
    if os.environ.get("TASKPILOTS_SCREENSHOTS"):
        name = "bulk-jobs.png" if width == 1440 else "bulk-jobs-390.png"
        page.screenshot(path=OUT / name, full_page=False)
    assert page.console_errors == []
    assert len(runs) == 6


@pytest.mark.parametrize("width", [1440, 390])
def test_pause_resume_and_stop_a_running_job_from_its_page(page, sandbox, support_user, width):
    outage_parked_runs(sandbox, 3)
    job = bulk.preview(support_user, "retry", {"status": "inbox", "reason": "outage"}, {})
    bulk.start(job, support_user)  # no worker here: the job stays running until told
    page.set_viewport_size({"width": width, "height": 1000})
    log_in(page, support_user.username)
    page.goto(f"/console/bulk/{job.pk}/")
    page.get_by_role("button", name="Pause").click()
    expect(page.locator(".bulk-status")).to_have_text("paused")
    assert bulk.execute(job.pk) == 0  # a worker now acts on no run
    assert fits(page)
    page.get_by_role("button", name="Resume").click()
    expect(page.locator(".bulk-status")).to_have_text("running")
    page.get_by_role("button", name="Stop").click()
    expect(page.locator(".bulk-status")).to_have_text("stopped")
    expect(page.get_by_role("button", name="Resume")).to_have_count(0)
    assert BulkAction.objects.get(pk=job.pk).status == "stopped"
    assert job.counts()["pending"] == 3
    assert fits(page)
    assert page.console_errors == []

"""Bulk retry in a real browser: a support user filters the inbox to the runs a mail outage
parked, previews a retry of all 200, starts it, watches the progress bar (also across a reload)
and reads the result; a real worker carries the job and the runs out, and the sandbox's ledger
has each retried mail exactly once."""

from __future__ import annotations

import time

import pytest
from django.conf import settings
from playwright.sync_api import expect

from approvals.models import HumanDecision
from approvals.models.bulk import BulkAction
from runs import engine
from runs.models import Run, TimelineEvent
from tests.approvals.bulk_helpers import outage_parked_runs
from tests.browser.conftest import log_in
from tests.worker import private_workers, wait_for

pytestmark = [
    pytest.mark.browser,
    pytest.mark.worker,
    pytest.mark.django_db(transaction=True),
    # Parking the runs with the engine in-process is most of it (~0.1 s a run).
    pytest.mark.timeout(300),
]

RUNS = 200


@pytest.fixture
def workers(transactional_db, sandbox):
    with private_workers(dispatch=False) as pool:
        yield pool


def test_support_retries_200_outage_parked_runs_in_one_bulk_action(
    page, sandbox, support_user, workers
):
    runs = outage_parked_runs(sandbox, RUNS)
    settings.TASKPILOTS["DISPATCH"] = "celery"
    workers.start(concurrency=4)
    log_in(page, support_user.username)

    page.goto("/console/?reason=outage")
    page.get_by_role("link", name="Bulk action…").click()
    expect(page.locator("#bulk-reason")).to_have_value("outage")
    page.select_option("#bulk-action", "retry")
    page.fill("#bulk-comment", "mail provider is back")
    page.get_by_role("button", name="Preview").click()
    expect(page.locator(".bulk-summary")).to_contain_text("200 runs will be acted on; 0 skipped")
    expect(page.locator(".bulk-sample tbody tr")).to_have_count(20)
    expect(page.locator(".bulk-sample").first).to_contain_text("Retry send_reply (mail.send) now")

    page.get_by_role("button", name="Do it for 200 runs").click()
    progress = page.locator("#bulk-progress progress")
    expect(progress).to_be_visible()
    page.reload()  # the progress comes from the database, not from the page
    expect(page.locator("#bulk-progress progress")).to_have_attribute("max", str(RUNS))
    expect(page.locator(".bulk-counts")).to_contain_text(
        "200 of 200 runs handled: 200 done, 0 skipped, 0 failed", timeout=90_000
    )
    expect(page.locator(".bulk-results tbody tr.bulk-item--done")).to_have_count(RUNS)
    job = BulkAction.objects.get()
    assert job.status == "done"

    ids = [r.pk for r in runs]

    def all_succeeded():
        engine.sweep()
        return Run.objects.filter(pk__in=ids, status="succeeded").count() == RUNS or time.sleep(0.3)

    wait_for(all_succeeded, timeout=120, what="every retried run to finish")
    ledger = sandbox.ledger(system="mail")
    per_run = {str(r): 0 for r in ids}
    for entry in ledger:
        per_run[entry["run"]] = per_run.get(entry["run"], 0) + 1
    assert set(per_run.values()) == {1}, [k for k, v in per_run.items() if v != 1][:5]
    assert HumanDecision.objects.filter(bulk_action=job).count() == RUNS
    assert TimelineEvent.objects.filter(verb="bulk_action.applied", run__in=ids).count() == RUNS

"""Bulk jobs as first-class things: the preview names business keys, groups skipped runs by
reason and says whether the tool it offers to retry is down; runs can be picked one by one;
a job can be paused, resumed and stopped between runs; its page shows where each run stands
now, and the runs that failed or went back to a person can be previewed again as a new job."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from approvals import actions, bulk
from approvals.models.bulk import BulkAction, BulkActionItem
from runs import engine
from runs.models import Run, Wait
from tests.approvals.bulk_helpers import outage_parked_runs
from tests.approvals.console_helpers import (  # noqa: F401  (fast_passwords is autouse)
    approval_run,
    fast_passwords,
    fresh,
    visible_text,
)

pytestmark = pytest.mark.django_db

JOBS = "/console/bulk/"


def detail(job) -> str:
    return f"/console/bulk/{job.pk}/"


# -- the preview -----------------------------------------------------------------------------


def test_the_preview_shows_business_keys_and_groups_skipped_runs(
    client, sandbox, support_user, admin_user
):
    runs = outage_parked_runs(sandbox, 5)
    Run.objects.filter(pk=runs[0].pk).update(business_key="order-88412")
    for run in runs[3:]:
        actions.take_over(run.pk, admin_user)
    for _ in range(3):
        approval_run()
    job = bulk.preview(support_user, "retry", {"status": "inbox"}, {})
    client.force_login(support_user)
    response = client.get(detail(job))
    text = visible_text(response)
    assert "order-88412" in text
    groups = response.context["skipped_groups"]
    assert sorted(g["n"] for g in groups) == [2, 3]
    approval = next(g for g in groups if "approval" in g["reason"])
    assert approval["n"] == 3 and len(approval["runs"]) == 3
    # One line per reason, not one per run.
    assert response.content.decode().count('<li><span class="count">') == 2


def test_the_retry_preview_says_the_tool_is_still_down(client, sandbox, support_user):
    outage_parked_runs(sandbox, 2)
    sandbox.inject("mail", "outage", seconds=120)
    job = bulk.preview(support_user, "retry", {"status": "inbox", "reason": "outage"}, {})
    assert job.tool_health["mail.send"]["state"] == "down"
    client.force_login(support_user)
    text = visible_text(client.get(detail(job)))
    assert "mail.send is still down: retrying now will most likely park these runs again" in text

    sandbox.clear_faults()
    job = bulk.preview(support_user, "retry", {"status": "inbox", "reason": "outage"}, {})
    assert job.tool_health["mail.send"]["state"] == "up"
    assert "mail.send answers again." in visible_text(client.get(detail(job)))


# -- picking runs ----------------------------------------------------------------------------


def test_runs_picked_in_the_list_are_the_only_ones_previewed(client, sandbox, support_user):
    runs = outage_parked_runs(sandbox, 4)
    picked = [str(runs[1].pk), str(runs[3].pk)]
    client.force_login(support_user)
    form = client.get("/console/bulk/new/", {"status": "inbox", "runs": picked})
    assert "2 runs picked in the list" in visible_text(form)
    response = client.post(
        "/console/bulk/preview/", {"status": "inbox", "runs": ",".join(picked), "action": "retry"}
    )
    assert response.status_code == 302
    job = BulkAction.objects.get()
    assert sorted(str(i.run_id) for i in job.items.all()) == sorted(picked)


def test_a_bad_picked_id_is_refused_and_writes_nothing(client, support_user):
    client.force_login(support_user)
    response = client.post(
        "/console/bulk/preview/", {"runs": "not-a-run", "action": "retry", "status": "inbox"}
    )
    assert response.status_code == 422
    assert "not-a-run is not a run id" in visible_text(response)
    assert not BulkAction.objects.exists()


# -- pause, resume, stop ---------------------------------------------------------------------


def test_a_paused_job_acts_on_no_run_until_resumed(sandbox, support_user):
    outage_parked_runs(sandbox, 3)
    job = bulk.preview(support_user, "retry", {"reason": "outage"}, {})
    bulk.start(job, support_user)
    assert bulk.execute_next(job)  # one run handled, as by a worker
    bulk.control(job, support_user, "pause")
    assert bulk.execute(job.pk) == 0  # the worker finds it paused: nothing more
    assert job.counts()["done"] == 1 and BulkAction.objects.get(pk=job.pk).status == "paused"
    bulk.control(job, support_user, "resume")
    assert bulk.execute(job.pk) == 2
    assert BulkAction.objects.get(pk=job.pk).status == "done"


def test_a_stopped_job_leaves_the_rest_alone_for_good(sandbox, support_user, admin_user):
    outage_parked_runs(sandbox, 3)
    job = bulk.preview(support_user, "retry", {"reason": "outage"}, {})
    bulk.start(job, support_user)
    bulk.execute_next(job)
    bulk.control(job, admin_user, "stop")  # an admin may stop someone's job
    assert bulk.execute(job.pk) == 0
    job.refresh_from_db()
    assert job.status == "stopped" and job.control_by == admin_user and job.finished_at
    assert job.counts()["pending"] == 2
    with pytest.raises(actions.DecisionConflict):
        bulk.control(job, support_user, "resume")
    assert bulk.resume_stale() == []  # the sweep leaves a stopped job alone


def test_only_the_owner_or_an_admin_controls_a_job(client, sandbox, support_user):
    from tests.factories import UserFactory

    outage_parked_runs(sandbox, 1)
    job = bulk.preview(support_user, "retry", {"reason": "outage"}, {})
    bulk.start(job, support_user)
    other = UserFactory(username="olga", groups=["support"])
    client.force_login(other)
    assert client.post(f"/console/bulk/{job.pk}/pause/").status_code == 403
    assert BulkAction.objects.get(pk=job.pk).status == "running"
    assert client.get(f"/console/bulk/{job.pk}/pause/").status_code == 405
    assert client.post("/console/bulk/999999/pause/").status_code == 404
    client.force_login(support_user)
    assert client.post(f"/console/bulk/{job.pk}/pause/").status_code == 302
    assert BulkAction.objects.get(pk=job.pk).status == "paused"
    response = client.post(f"/console/bulk/{job.pk}/pause/", follow=True)  # again: no change
    assert "cannot be paused, resumed or stopped now" in visible_text(response)


# -- current status, retry the ones that failed ----------------------------------------------


def reparked(sandbox, run):
    """The retried send meets the outage again and waits it out: back to a person."""
    sandbox.inject("mail", "outage", seconds=600)
    engine.run_until_quiet(run.pk)
    Wait.objects.filter(run=run, status="pending").update(due_at=timezone.now())
    engine.sweep(now=timezone.now() + timedelta(seconds=61))
    engine.run_until_quiet(run.pk)
    sandbox.clear_faults()
    assert fresh(run).status == "needs_human"


def test_the_result_shows_each_run_now_and_retries_the_reparked(client, sandbox, support_user):
    runs = outage_parked_runs(sandbox, 3)
    job = bulk.preview(support_user, "retry", {"reason": "outage"}, {"comment": "back"})
    bulk.start(job, support_user)
    bulk.execute(job.pk)
    engine.run_until_quiet(runs[0].pk)  # succeeds
    reparked(sandbox, runs[1])
    client.force_login(support_user)
    response = client.get(detail(job))
    now = {str(i.run_id): i.now[0] for i in response.context["results"]}
    assert now[str(runs[0].pk)] == "succeeded"
    assert now[str(runs[1].pk)] == "parked", fresh(runs[1]).status
    assert now[str(runs[2].pk)] == "running"
    text = visible_text(response)
    assert "Action applied" in text and "Succeeded" in text

    response = client.post(f"/console/bulk/{job.pk}/retry-failed/")
    retry = BulkAction.objects.exclude(pk=job.pk).get()
    assert response.status_code == 302 and response["Location"] == detail(retry)
    assert retry.retry_of == job and retry.action == "retry"
    assert [i.run_id for i in retry.items.all()] == [runs[1].pk]


def test_retrying_a_job_with_nothing_failed_says_so(client, sandbox, support_user):
    outage_parked_runs(sandbox, 1)
    job = bulk.preview(support_user, "retry", {"reason": "outage"}, {})
    bulk.start(job, support_user)
    bulk.execute(job.pk)
    client.force_login(support_user)
    response = client.post(f"/console/bulk/{job.pk}/retry-failed/", follow=True)
    assert "No run of this bulk action failed or went back to a person" in visible_text(response)
    assert BulkAction.objects.count() == 1


# -- the jobs page ---------------------------------------------------------------------------


def test_the_jobs_page_lists_who_when_what_and_progress(client, sandbox, support_user):
    outage_parked_runs(sandbox, 2)
    first = bulk.preview(support_user, "retry", {"reason": "outage"}, {})
    bulk.start(first, support_user)
    bulk.execute(first.pk)
    client.force_login(support_user)
    client.get(JOBS)
    with CaptureQueriesContext(connection) as few:
        client.get(JOBS)
    for _ in range(5):
        bulk.preview(support_user, "retry", {"reason": "outage"}, {})
    with CaptureQueriesContext(connection) as many:
        response = client.get(JOBS)
    assert len(many) == len(few)
    text = visible_text(response)
    assert f"#{first.pk}" in text and "sam-support" in text and "Retry now" in text
    assert "2 of 2: 2 done, 0 skipped, 0 failed" in text
    assert "previewed, not started" in text


def test_the_jobs_page_is_for_people_who_act(client, auditor_user, outsider):
    for user in (auditor_user, outsider):
        client.force_login(user)
        assert client.get(JOBS).status_code == 403
    assert BulkActionItem.objects.count() == 0


# -- the API: the same verbs ---------------------------------------------------------------


def test_the_api_picks_runs_pauses_stops_and_retries_the_failed(sandbox, support_user):
    from tests.approvals.test_bulk import as_person

    runs = outage_parked_runs(sandbox, 3)
    api = as_person(support_user)
    picked = [str(runs[0].pk), str(runs[2].pk)]
    status, body = api.post(
        "/bulk-actions/preview",
        {"action": "retry", "filters": {"runs": picked, "owner": "unclaimed"}},
    )
    assert status == 200, body
    assert sorted(i["run_id"] for i in body["items"]) == sorted(picked)
    assert body["tool_health"]["mail.send"]["state"] == "up" and body["retry_of"] is None
    job_id = body["id"]
    assert api.post(f"/bulk-actions/{job_id}/execute", {})[0] == 200
    status, body = api.post(f"/bulk-actions/{job_id}/control", {"move": "pause"})
    assert status == 200 and body["status"] == "paused"
    assert api.post(f"/bulk-actions/{job_id}/control", {"move": "pause"})[0] == 409
    assert api.post(f"/bulk-actions/{job_id}/control", {"move": "explode"})[0] == 422
    status, body = api.post(f"/bulk-actions/{job_id}/control", {"move": "stop"})
    assert status == 200 and body["status"] == "stopped"
    # Nothing was acted on, so nothing failed: a retry has nothing to cover.
    status, body = api.post(f"/bulk-actions/{job_id}/retry-failed", {})
    assert status == 409 and "No run of this bulk action" in body["error"]["message"], body
    assert api.post("/bulk-actions/999999/control", {"move": "stop"})[0] == 404


def test_the_api_refuses_a_bad_picked_id_and_writes_nothing(support_user):
    from tests.approvals.test_bulk import as_person

    api = as_person(support_user)
    status, _ = api.post("/bulk-actions/preview", {"action": "retry", "filters": {"runs": ["x"]}})
    assert status == 422
    assert not BulkAction.objects.exists()


def test_the_filters_read_in_the_readers_language(client, sandbox, support_user):
    """Issue 33 §5: the bulk page printed its filters raw ("reason = outage")."""
    outage_parked_runs(sandbox, 1)
    job = bulk.preview(support_user, "retry", {"reason": "outage"}, {"comment": "back"})
    client.force_login(support_user)
    url = reverse("console:bulk-detail", args=[job.pk])
    assert "Failure class: System outage" in visible_text(client.get(url))
    chinese = visible_text(client.get(url, HTTP_ACCEPT_LANGUAGE="zh-Hans"))
    assert "reason = outage" not in chinese and "outage" not in chinese

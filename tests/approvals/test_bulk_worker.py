"""A bulk action is itself recoverable: its worker SIGKILLed midway, another worker finishes the
job (the broker hands the unacknowledged task on, or the sweep enqueues it again), and no run
is acted on twice — each run has one decision and one `bulk_action.applied` event, and the
sandbox's ledger one mail."""

from __future__ import annotations

import time

import pytest
from django.conf import settings

from approvals import bulk
from approvals.models import HumanDecision
from approvals.models.bulk import BulkAction, BulkActionItem
from runs import engine
from runs.models import Run, TimelineEvent
from tests.approvals.bulk_helpers import outage_parked_runs
from tests.worker import private_workers, wait_for

pytestmark = [
    pytest.mark.worker,
    pytest.mark.django_db(transaction=True),
    # Parking the runs with the engine in-process is most of it (~0.1 s a run).
    pytest.mark.timeout(240),
]

RUNS = 60


@pytest.fixture
def workers(transactional_db, sandbox):
    with private_workers(dispatch=False) as pool:
        yield pool


def finished(job) -> int:
    return BulkActionItem.objects.filter(bulk_action=job).exclude(status="pending").count()


def job_done(job):
    """RabbitMQ hands the dead worker's unacknowledged task to the new worker at once; the
    filesystem broker of a fresh machine cannot (a message read is gone), so there the job
    waits for what beat does: `resume_stale` enqueues it again once its heartbeat is
    STALE_SECONDS old. Either way the job finishes and no run is acted on twice."""

    def check():
        bulk.resume_stale()
        done = BulkAction.objects.get(pk=job.pk).status == "done"
        return done or time.sleep(0.5)

    return check


def all_succeeded(run_ids):
    def check():
        engine.sweep()  # what beat does: leases of the dead worker taken back, hints re-sent
        done = Run.objects.filter(pk__in=run_ids, status="succeeded").count()
        return done == len(run_ids) or time.sleep(0.3)

    return check


def test_a_worker_killed_midway_through_a_bulk_retry(workers, sandbox, support_user):
    runs = outage_parked_runs(sandbox, RUNS)  # the engine in-process, before any worker
    settings.TASKPILOTS["DISPATCH"] = "celery"
    job = bulk.preview(support_user, "retry", {"reason": "outage"}, {"comment": "mail is back"})
    assert job.counts()["pending"] == RUNS

    first = workers.start(concurrency=4)
    bulk.start(job, support_user)
    wait_for(lambda: finished(job) >= 5, what="the job to be under way", interval=0.005)
    first.kill()
    left = RUNS - finished(job)
    assert left > 0, "the job finished before the kill: nothing was tested"
    assert BulkAction.objects.get(pk=job.pk).status == "running"

    workers.start(concurrency=4)
    wait_for(job_done(job), timeout=120, what="a second worker to finish the job")
    ids = [r.pk for r in runs]
    wait_for(all_succeeded(ids), timeout=120, what="every retried run to finish")

    assert job.counts() == {**job.counts(), "done": RUNS, "pending": 0, "skipped": 0}
    for run in runs:
        assert HumanDecision.objects.filter(run=run, bulk_action=job).count() == 1
        assert HumanDecision.objects.filter(run=run).count() == 1
        events = TimelineEvent.objects.filter(run=run, verb="bulk_action.applied")
        assert events.count() == 1
        assert len(sandbox.ledger(system="mail", run=str(run.pk))) == 1


def test_a_job_paused_midway_by_a_person_stops_between_runs_and_resumes(
    workers, sandbox, support_user
):
    # The executor is a Celery task: pausing is a flag in PostgreSQL it reads before every run,
    # so the worker acts on at most the run in hand after the pause, and a resume hands the
    # job to a worker again; each run is still acted on (and its mail sent) exactly once.
    runs = outage_parked_runs(sandbox, RUNS)
    settings.TASKPILOTS["DISPATCH"] = "celery"
    job = bulk.preview(support_user, "retry", {"reason": "outage"}, {"comment": "mail is back"})
    workers.start(concurrency=2)
    bulk.start(job, support_user)
    wait_for(lambda: finished(job) >= 5, what="the job to be under way", interval=0.005)
    bulk.control(BulkAction.objects.get(pk=job.pk), support_user, "pause")
    at_pause = finished(job)
    time.sleep(2)  # a worker still going would handle dozens of runs in this time
    held = finished(job)
    assert held <= at_pause + 2, (at_pause, held)  # at most the runs in hand (concurrency 2)
    assert held < RUNS, "the job finished before the pause: nothing was tested"
    assert BulkAction.objects.get(pk=job.pk).status == "paused"

    bulk.control(BulkAction.objects.get(pk=job.pk), support_user, "resume")
    wait_for(job_done(job), timeout=120, what="the resumed job to finish")
    ids = [r.pk for r in runs]
    wait_for(all_succeeded(ids), timeout=120, what="every retried run to finish")
    assert job.counts()["done"] == RUNS
    for run in runs:
        assert HumanDecision.objects.filter(run=run, bulk_action=job).count() == 1
        assert len(sandbox.ledger(system="mail", run=str(run.pk))) == 1


def test_a_job_stopped_midway_leaves_the_rest_alone_under_a_real_worker(
    workers, sandbox, support_user
):
    runs = outage_parked_runs(sandbox, RUNS)
    settings.TASKPILOTS["DISPATCH"] = "celery"
    job = bulk.preview(support_user, "retry", {"reason": "outage"}, {"comment": "mail is back"})
    workers.start(concurrency=2)
    bulk.start(job, support_user)
    wait_for(lambda: finished(job) >= 5, what="the job to be under way", interval=0.005)
    bulk.control(BulkAction.objects.get(pk=job.pk), support_user, "stop")
    at_stop = finished(job)
    time.sleep(2)
    held = finished(job)
    assert held <= at_stop + 1, (at_stop, held)  # at most the run in hand
    assert held < RUNS, "the job finished before the stop: nothing was tested"
    bulk.resume_stale()  # the sweep does not hand a stopped job on
    time.sleep(1)
    assert finished(job) == held and BulkAction.objects.get(pk=job.pk).status == "stopped"

    acted = set(
        BulkActionItem.objects.filter(bulk_action=job, status="done").values_list(
            "run_id", flat=True
        )
    )
    ids = list(acted)
    wait_for(all_succeeded(ids), timeout=120, what="the runs acted on to finish")
    for run in runs:
        sent = len(sandbox.ledger(system="mail", run=str(run.pk)))
        assert sent == (1 if run.pk in acted else 0), (run.pk, sent)
        assert Run.objects.get(pk=run.pk).status == (
            "succeeded" if run.pk in acted else "needs_human"
        )

"""Execution and recovery with real Celery worker processes on the real broker.

The receiving side (the sandbox's ledger) counts what actually happened; each test asserts that
every side effect landed exactly once, or that the run waits for a person with the evidence.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from runs import engine
from runs.models import Run, SideEffect, Step, TimelineEvent
from tests.worker import private_workers, wait_for

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

REPLY_INPUT = {"message": "Where is my refund?", "email": "ann@example.com", "ticket": "T-1"}


@pytest.fixture
def workers(transactional_db, sandbox):
    with private_workers() as pool:
        yield pool


def settled(run_id):
    def check():
        run = Run.objects.get(pk=run_id)
        return run if run.status in (Run.TERMINAL | Run.HUMAN) else None

    return check


def expire_leases(run):
    """Drive time: the crashed worker's lease has run out."""
    Step.objects.filter(run=run, status="running").update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    # ... and so has the window in which the target system could still commit the lost call.
    SideEffect.objects.filter(run=run).update(attempted_at=timezone.now() - timedelta(hours=1))


def in_flight(run_id, tool):
    return lambda: SideEffect.objects.filter(run_id=run_id, tool=tool, status="intended").exists()


def call_received(sandbox, system):
    """The simulated system has taken the injected fault: the call reached it. (The intent row
    is committed just before the call is sent; a kill in between would crash before the call.)"""
    return lambda: not [f for f in sandbox.faults() if f["system"] == system]


def test_a_run_goes_through_a_real_worker(workers, sandbox):
    workers.start()
    run, _ = engine.start_run("test.reply", REPLY_INPUT)
    run = wait_for(settled(run.pk), what="run to finish")
    assert run.status == "succeeded"
    assert len(sandbox.ledger(system="mail", run=str(run.pk))) == 1


@pytest.mark.parametrize(
    ("fault", "expected_mail"),
    [("latency", 1), ("timeout_before_commit", 1)],
    ids=["committed-before-crash", "not-committed-before-crash"],
)
def test_it_does_not_send_twice_after_worker_crash(workers, sandbox, fault, expected_mail):
    # The worker dies mid-call. Whether the mail system committed or not, the next worker finds
    # the `intended` ledger row, asks the mail system by key, and sends at most once more.
    first = workers.start()
    sandbox.inject("mail", fault, action="send", latency_ms=1500, seconds=1.5)
    run, _ = engine.start_run("test.reply", REPLY_INPUT)
    wait_for(in_flight(run.pk, "mail.send"), what="mail call in flight")
    wait_for(call_received(sandbox, "mail"), what="mail call received")
    first.kill()
    if fault == "latency":
        wait_for(lambda: sandbox.ledger(system="mail", run=str(run.pk)), what="late commit")
    expire_leases(run)
    workers.start()
    engine.sweep()
    run = wait_for(settled(run.pk), what="run to finish")
    assert run.status == "succeeded", run.attention_reason
    assert len(sandbox.ledger(system="mail", run=str(run.pk))) == expected_mail
    assert len(sandbox.ledger(system="tickets", run=str(run.pk))) == 1
    verbs = list(TimelineEvent.objects.filter(run=run).values_list("verb", flat=True))
    assert "step.lease_reclaimed" in verbs


def test_a_crash_on_a_system_that_cannot_be_asked_goes_to_a_person(workers, sandbox):
    first = workers.start()
    sandbox.inject("crm", "latency", action="create", latency_ms=1500)
    run, _ = engine.start_run("test.lead", {"email": "lee@example.com", "name": "Lee"})
    wait_for(in_flight(run.pk, "crm.create"), what="crm call in flight")
    wait_for(call_received(sandbox, "crm"), what="crm call received")
    first.kill()
    wait_for(lambda: sandbox.ledger(system="crm", run=str(run.pk)), what="late commit")
    expire_leases(run)
    workers.start()
    engine.sweep()
    run = wait_for(settled(run.pk), what="run to park")
    assert run.status == "needs_human"
    assert Step.objects.get(run=run, name="create_contact").status == "unknown_outcome"
    assert len(sandbox.ledger(system="crm", run=str(run.pk))) == 1  # never twice


def test_the_same_message_delivered_twice_concurrently_executes_once(workers, sandbox):
    from runs.tasks import advance_run

    workers.start()
    workers.start()
    sandbox.inject("mail", "latency", action="send", latency_ms=800)
    settings.TASKPILOTS["DISPATCH"] = "none"
    run, _ = engine.start_run("test.reply", REPLY_INPUT)  # no message sent
    settings.TASKPILOTS["DISPATCH"] = "celery"
    advance_run.delay(str(run.pk))
    advance_run.delay(str(run.pk))
    run = wait_for(settled(run.pk), what="run to finish")
    assert run.status == "succeeded"
    assert len(sandbox.ledger(system="mail", run=str(run.pk))) == 1
    assert len(sandbox.ledger(system="tickets", run=str(run.pk))) == 1
    started = TimelineEvent.objects.filter(run=run, verb="step.started")
    assert [e.data["step"] for e in started].count("send_reply") == 1


def test_a_lost_message_only_delays_the_run(workers, sandbox):
    workers.start()
    settings.TASKPILOTS["DISPATCH"] = "none"
    run, _ = engine.start_run("test.reply", REPLY_INPUT)  # the message is "lost"
    settings.TASKPILOTS["DISPATCH"] = "celery"
    stale = settings.TASKPILOTS["STALE_RUN_SECONDS"] + 1
    report = engine.sweep(now=timezone.now() + timedelta(seconds=stale))
    assert report.stale_runs == 1
    run = wait_for(settled(run.pk), what="run to finish")
    assert run.status == "succeeded"
    assert len(sandbox.ledger(system="mail", run=str(run.pk))) == 1


def test_replay_through_a_worker_sends_nothing_again(workers, sandbox):
    workers.start()
    run, _ = engine.start_run("test.reply", REPLY_INPUT)
    wait_for(settled(run.pk), what="run to finish")
    Step.objects.filter(run=run, name__in=["send_reply", "close_ticket"]).update(status="pending")
    Run.objects.filter(pk=run.pk).update(status="running", finished_at=None)
    engine.sweep(now=timezone.now() + timedelta(seconds=60))
    wait_for(lambda: Run.objects.get(pk=run.pk).status == "succeeded", what="replay to finish")
    assert len(sandbox.ledger(system="mail", run=str(run.pk))) == 1
    assert len(sandbox.ledger(system="tickets", run=str(run.pk))) == 1


def test_a_batch_of_runs_whose_worker_dies_sends_each_mail_once(workers, sandbox):
    # Three runs started together leave as one message (runs.engine.dispatch.hint_soon). The
    # worker's task hands the two behind the first on as its mail call starts waiting, its
    # other threads take them, and the worker dies with all three calls in the mail system's
    # hands: each run finishes on the next worker, and each reply was sent once.
    linger = settings.TASKPILOTS["HINT_LINGER_MS"]
    settings.TASKPILOTS["HINT_LINGER_MS"] = 500.0
    try:
        first = workers.start()
        sandbox.inject("mail", "latency", action="send", latency_ms=1500, count=3)
        runs = [
            engine.start_run("test.reply", {**REPLY_INPUT, "ticket": f"T-{n}"})[0] for n in range(3)
        ]
    finally:
        settings.TASKPILOTS["HINT_LINGER_MS"] = linger
    for run in runs:
        wait_for(in_flight(run.pk, "mail.send"), what="mail call in flight")
    wait_for(call_received(sandbox, "mail"), what="all three mail calls received")
    first.kill()
    for run in runs:
        wait_for(lambda r=run: sandbox.ledger(system="mail", run=str(r.pk)), what="late commit")
        expire_leases(run)
    workers.start()
    engine.sweep()
    for run in runs:
        run = wait_for(settled(run.pk), what="run to finish")
        assert run.status == "succeeded", run.attention_reason
        assert len(sandbox.ledger(system="mail", run=str(run.pk))) == 1
        assert len(sandbox.ledger(system="tickets", run=str(run.pk))) == 1

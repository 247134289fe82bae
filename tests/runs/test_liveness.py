"""Dead workers are noticed in seconds, slow ones are never doubled (runs/engine/liveness.py).

In-process: the heartbeat's takeover of a stale worker's leases, the restart that takes back its
own previous incarnation's, and the fence that keeps a worker which was only paused from sending
anything after its claim was taken back. With real workers: a SIGKILLed worker's step is taken
back long before its lease would run out, and a SIGSTOPped one stands down when it wakes; the
receiving side counts exactly one effect each time.
"""

from __future__ import annotations

import importlib
import os
import signal
import time
from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from runs import engine, tools
from runs.engine import ledger
from runs.engine.liveness import ClaimLost, Heartbeat, fence
from runs.models import Run, SideEffect, Step, TimelineEvent, Worker
from tests.runs import flows
from tests.worker import private_workers, wait_for

REPLY_INPUT = {"message": "Where is my refund?", "email": "ann@example.com", "ticket": "T-1"}


def _worker_row(worker_id: str, node: str, beat_ago: float) -> Worker:
    now = timezone.now()
    return Worker.objects.create(
        id=worker_id,
        node=node,
        host="test",
        pid=1,
        started_at=now - timedelta(minutes=5),
        beat_at=now - timedelta(seconds=beat_ago),
    )


def _steady(heartbeat: Heartbeat) -> Heartbeat:
    """A detector that has been beating without a gap for long enough to judge others."""
    heartbeat.last_beat = time.monotonic()
    heartbeat.steady_since = heartbeat.last_beat - heartbeat.dead_after - 1
    return heartbeat


def _claimed_by(worker: str, workflow="test.lead", input=None):
    run, _ = engine.start_run(workflow, input or {"email": "lee@example.com", "name": "Lee"})
    claim = engine.claim_next(run.pk, worker=worker)
    assert claim is not None
    return run, claim


# The heartbeat uses a connection of its own: what it judges must be committed.
@pytest.mark.django_db(transaction=True)
class TestTakingBackLeases:
    def test_a_worker_whose_heartbeat_stopped_loses_its_leases(self):
        _worker_row("w-dead", "dead@host", beat_ago=60)
        run, claim = _claimed_by("w-dead")
        _worker_row("w-live", "live@host", beat_ago=0)
        _steady(Heartbeat("live@host", worker="w-live"))._beat()
        step = Step.objects.get(pk=claim.step.pk)
        assert step.lease_expires_at <= timezone.now()  # taken back: claimable now
        assert Worker.objects.get(pk="w-dead").found_dead_by == "w-live"
        again = engine.claim_next(run.pk, worker="w-live")
        assert again is not None and again.step.attempts == 2 and again.reclaimed
        reclaimed = TimelineEvent.objects.get(run=run, verb="step.lease_reclaimed")
        assert reclaimed.data["previous_worker"] == "w-dead"
        assert "stopped beating" in reclaimed.data["why"]

    def test_a_worker_that_beats_keeps_its_leases(self):
        _worker_row("w-busy", "busy@host", beat_ago=0.5)
        run, claim = _claimed_by("w-busy")
        _worker_row("w-live", "live@host", beat_ago=0)
        _steady(Heartbeat("live@host", worker="w-live"))._beat()
        assert Step.objects.get(pk=claim.step.pk).lease_expires_at > timezone.now()
        assert engine.claim_next(run.pk, worker="w-live") is None  # still someone's

    def test_a_worker_that_was_away_itself_judges_no_one(self):
        # After a PostgreSQL restart everyone's heartbeat stopped at once: the first worker
        # back must not find all the others dead before they had a chance to beat again.
        _worker_row("w-other", "other@host", beat_ago=60)
        run, claim = _claimed_by("w-other")
        _worker_row("w-back", "back@host", beat_ago=0)
        Heartbeat("back@host", worker="w-back")._beat()  # its first beat after the outage
        assert Step.objects.get(pk=claim.step.pk).lease_expires_at > timezone.now()
        assert Worker.objects.get(pk="w-other").dead_at is None

    def test_a_restarted_worker_takes_back_its_previous_incarnations_leases_at_once(self):
        _worker_row("w-before", "w1@host", beat_ago=0.2)  # died a moment ago: not stale yet
        run, claim = _claimed_by("w-before")
        Heartbeat("w1@host", worker="w-after")._register()
        assert Step.objects.get(pk=claim.step.pk).lease_expires_at <= timezone.now()
        before = Worker.objects.get(pk="w-before")
        assert before.dead_at is not None and before.found_dead_by == "w-after"
        assert engine.claim_next(run.pk, worker="w-after").reclaimed


@pytest.mark.django_db
class TestAPausedWorkerIsFenced:
    def _take_back(self, run, claim):
        """While the first worker was paused: its lease ran out and another worker claimed."""
        Step.objects.filter(pk=claim.step.pk).update(
            lease_expires_at=timezone.now() - timedelta(seconds=1)
        )
        return engine.claim_next(run.pk, worker="w-new")

    def test_a_young_claim_of_a_live_worker_costs_no_query(self, django_assert_num_queries):
        run, claim = _claimed_by("w-a")
        with django_assert_num_queries(0):
            fence(claim)

    def test_it_sends_nothing_after_its_claim_was_taken_back(self, sandbox):
        flows.CALLS.clear()
        run, _ = engine.start_run("test.flaky", {})
        claim = engine.claim_next(run.pk, worker="w-old")
        claim.claimed_at -= settings.TASKPILOTS["LEASE_SECONDS"]  # it slept past its lease
        assert self._take_back(run, claim) is not None
        assert engine.advance(run.pk, worker="w-old-again") == 0  # the new claim holds it
        with pytest.raises(ClaimLost):
            engine.execute(claim)
        assert flows.CALLS.get("flaky", 0) == 0  # nothing was called

    def test_it_writes_no_intent_after_its_claim_was_taken_back(self, sandbox):
        run, claim = _claimed_by("w-old")
        tool = tools.get("crm.create")
        params = {"email": "lee@example.com", "name": "Lee"}
        self._take_back(run, claim)
        with pytest.raises(ClaimLost):
            ledger.write_intent(claim, tool, params, ledger.idempotency_key_for(claim.step))
        assert not SideEffect.objects.filter(run=run).exists()

    def test_a_claim_made_before_a_gap_in_the_beats_is_asked_about(self):
        # Woken from a pause, the heartbeat thread may beat before the worker's own thread
        # checks its claim: the beats are fresh again, but not for a claim made before the gap.
        run, claim = _claimed_by("w-paused")
        heartbeat = Heartbeat("paused@host", worker="w-paused")
        heartbeat.last_beat = time.monotonic()
        heartbeat.steady_since = claim.claimed_at - 1  # beating without a gap since before
        previous, Heartbeat.current = Heartbeat.current, heartbeat
        try:
            fence(claim)  # vouched for: no query (the test above counts them)
            self._take_back(run, claim)
            heartbeat.steady_since = time.monotonic()  # its first beat back after the pause
            with pytest.raises(ClaimLost):
                fence(claim)
        finally:
            Heartbeat.current = previous

    def test_a_worker_that_wakes_up_stands_down_and_says_so(self, sandbox):
        run, _ = engine.start_run("test.flaky", {})
        claim = engine.claim_next(run.pk, worker="w-old")
        claim.claimed_at -= settings.TASKPILOTS["LEASE_SECONDS"]
        new = self._take_back(run, claim)
        # The paused worker's loop resumes with its old claim.
        execute_module = importlib.import_module("runs.engine.execute")
        real_claim_next = execute_module.claim_next
        execute_module.claim_next = lambda run_id, worker=None: claim
        try:
            assert engine.advance(run.pk, worker="w-old") == 0
        finally:
            execute_module.claim_next = real_claim_next
        discarded = TimelineEvent.objects.get(run=run, verb="step.outcome_discarded")
        assert discarded.data["worker"] == "w-old" and "nothing was sent" in discarded.data["why"]
        engine.record_outcome(new, engine.execute(new))  # the new owner finishes the step
        assert engine.run_until_quiet(run.pk).status == "succeeded"
        assert flows.CALLS.get("flaky", 0) >= 1

    def test_a_late_receipt_answers_the_unknown_outcome_it_left_behind(self, sandbox):
        # The first worker's call landed, but it was away before recording it: the new owner
        # found an intent no one can look up (the CRM cannot be asked by key, does not dedupe)
        # and parked the run for a person. Then the first worker's receipt arrives: it is the
        # answer. The run leaves the inbox and its replay takes the receipt from the ledger.
        run, claim = _claimed_by("w-old")
        landed = engine.execute(claim)  # the intent, the call, its receipt (not yet recorded)
        new = self._take_back(run, claim)
        engine.record_outcome(new, engine.execute(new))
        assert Run.objects.get(pk=run.pk).status == Run.Status.NEEDS_HUMAN
        assert Step.objects.get(pk=claim.step.pk).status == Step.Status.UNKNOWN_OUTCOME
        assert engine.record_outcome(claim, landed) is False  # its claim is gone
        committed = TimelineEvent.objects.get(run=run, verb="side_effect.committed")
        assert committed.data["from"] == "unknown"  # where the row really came from
        assert Run.objects.get(pk=run.pk).status == Run.Status.RUNNING
        assert engine.run_until_quiet(run.pk).status == Run.Status.SUCCEEDED
        assert len(sandbox.ledger(system="crm", run=str(run.pk))) == 1  # called once
        effect = SideEffect.objects.get(run=run)
        assert effect.status == SideEffect.Status.COMMITTED and effect.confirmed_by == "tool"

    def test_a_late_receipt_on_a_taken_over_run_is_what_the_person_confirms(
        self, sandbox, support_user
    ):
        # The same, but a person had taken the run over: it stays theirs. The receipt in the
        # ledger is the answer they confirm (no proof to type); "it did not happen" is refused.
        from approvals import actions

        run, claim = _claimed_by("w-old")
        landed = engine.execute(claim)
        new = self._take_back(run, claim)
        engine.record_outcome(new, engine.execute(new))
        actions.take_over(run.pk, support_user)
        engine.record_outcome(claim, landed)
        assert Run.objects.get(pk=run.pk).status == Run.Status.TAKEN_OVER
        effect = SideEffect.objects.get(run=run)
        assert effect.status == SideEffect.Status.COMMITTED
        with pytest.raises(actions.DecisionConflict, match="receipt .* came in meanwhile"):
            actions.confirm_outcome(claim.step.pk, support_user, happened=False)
        step = actions.confirm_outcome(claim.step.pk, support_user, happened=True)
        assert step.status == Step.Status.SUCCEEDED
        assert step.result == effect.receipt["response"]
        actions.release(run.pk, support_user, needed_engineer=False)
        assert engine.run_until_quiet(run.pk).status == Run.Status.SUCCEEDED
        assert len(sandbox.ledger(system="crm", run=str(run.pk))) == 1


# ------------------------------------------------------------------------------------------
# Real workers, the default lease (60 s): the heartbeat, not the lease, notices.


@pytest.fixture
def workers(transactional_db, sandbox):
    with private_workers(
        {
            "TASKPILOTS_LEASE_SECONDS": "60",
            # A settle window of 5 s: a lookup that finds nothing is trusted after that.
            "TASKPILOTS_TOOL_TIMEOUT_SECONDS": "2",
        }
    ) as pool:
        yield pool


def _settled(run_id):
    def check():
        run = Run.objects.get(pk=run_id)
        return run if run.status in (Run.TERMINAL | Run.HUMAN) else None

    return check


def _swept_until_settled(run_id):
    """Settled, driving the sweeper meanwhile (no Celery beat here): a recheck of a call that
    may still be in flight is due once the tool's settle window has passed."""
    check = _settled(run_id)
    return lambda: (engine.sweep(), check())[1]


def _reclaimed(run_id):
    return lambda: TimelineEvent.objects.filter(run_id=run_id, verb="step.lease_reclaimed").first()


def _finished_by_another_worker(workers, stopped, run) -> Run:
    """While `stopped` is stopped: another worker takes the step back and finishes the run;
    then `stopped` is continued. The run as it ended."""
    try:
        workers.start()
        wait_for(_reclaimed(run.pk), timeout=40, what="the step taken back")
        return wait_for(_swept_until_settled(run.pk), timeout=60, what="the run to finish")
    finally:
        os.killpg(stopped.process.pid, signal.SIGCONT)


@pytest.mark.worker
def test_a_killed_workers_step_is_taken_back_long_before_its_lease_runs_out(workers, sandbox):
    workers.start()
    workers.start()
    sandbox.inject("mail", "latency", action="send", latency_ms=1500)
    run, _ = engine.start_run("test.reply", REPLY_INPUT)
    wait_for(
        lambda: SideEffect.objects.filter(run=run, tool="mail.send", status="intended").exists(),
        what="the mail call in flight",
    )
    holder = Worker.objects.get(pk=Step.objects.get(run=run, status="running").lease_owner)
    victim = next(w for w in workers.alive if holder.node.startswith(f"{w.name}@"))
    victim.kill()
    killed = time.monotonic()
    reclaimed = wait_for(_reclaimed(run.pk), timeout=40, what="the step taken back")
    took = time.monotonic() - killed
    assert took < 30, took  # the heartbeat noticed; the lease (60 s) did not have to run out
    assert "stopped beating" in reclaimed.data["why"]
    run = wait_for(_swept_until_settled(run.pk), timeout=60, what="the run to finish")
    assert run.status == "succeeded", run.attention_reason
    assert len(sandbox.ledger(system="mail", run=str(run.pk))) == 1
    assert len(sandbox.ledger(system="tickets", run=str(run.pk))) == 1


@pytest.mark.worker
def test_a_worker_stopped_past_its_heartbeat_stands_down_when_it_wakes(workers, sandbox):
    # SIGSTOP mid-call (a GC pause, a frozen VM) while its request waits at the mail system:
    # another worker takes the step back and finishes the run, finding the first request's
    # effect by key; the stopped one, continued, records nothing over it and sends nothing.
    # (Stopped before its request left: the test after this one.)
    first = workers.start()
    sandbox.inject("mail", "latency", action="send", latency_ms=1500)
    run, _ = engine.start_run("test.reply", REPLY_INPUT)
    wait_for(lambda: not sandbox.faults(), what="the mail request to arrive and wait")
    os.killpg(first.process.pid, signal.SIGSTOP)
    run = _finished_by_another_worker(workers, first, run)
    assert run.status == "succeeded", run.attention_reason
    time.sleep(3)  # the woken worker gets its answer and tries to record it
    assert len(sandbox.ledger(system="mail", run=str(run.pk))) == 1
    assert len(sandbox.ledger(system="tickets", run=str(run.pk))) == 1
    send = Step.objects.get(run=run, name="send_reply")
    assert send.status == "succeeded" and send.attempts == 2
    verbs = list(TimelineEvent.objects.filter(run=run).values_list("verb", flat=True))
    assert verbs.count("step.succeeded") == 4  # each step once, whoever woke up late


@pytest.mark.worker
def test_a_worker_paused_just_before_its_request_left_sends_nothing_when_it_wakes(
    workers, sandbox, tmp_path
):
    # Deterministic: the first worker stops itself (SIGSTOP) after its claim was checked and its
    # intent written, as the request is being built (tests.runs.flows._pausing_mail_url). The
    # second worker takes the step back, finds nothing by key once the settle window passed and
    # sends; the first, woken, must find its claim gone as its request is about to leave.
    pause = tmp_path / "pause"
    pause.touch()
    first = workers.start(TASKPILOTS_TEST_PAUSE_FILE=str(pause))
    run, _ = engine.start_run("test.pausing_mail", {"to": "ann@example.com"})
    wait_for(lambda: not pause.exists(), timeout=30, what="the first worker to stop itself")
    run = _finished_by_another_worker(workers, first, run)
    assert run.status == "succeeded", run.attention_reason
    discarded = wait_for(
        lambda: TimelineEvent.objects.filter(run=run, verb="step.outcome_discarded").first(),
        timeout=30,
        what="the woken worker to stand down",
    )
    assert "nothing was sent" in discarded.data["why"]
    assert len(sandbox.ledger(system="mail", run=str(run.pk))) == 1
    send = Step.objects.get(run=run, name="send")
    # The second worker asks by key about 5 s after the intent (the first one found dead), as
    # the settle window (2 × the tool's timeout + 1 s) ends: just after it, "not there" proves
    # nothing was sent and its attempt (2) sends; just before, the request could still be in
    # flight, so it asks again later (a recheck) and attempt 3 sends. Either way, once.
    verbs = list(TimelineEvent.objects.filter(run=run).values_list("verb", flat=True))
    assert send.status == "succeeded"
    assert send.attempts == 2 + verbs.count("side_effect.recheck_scheduled"), verbs
    assert verbs.count("side_effect.recheck_scheduled") <= 1, verbs

"""Stored metrics rows against the real engine and console actions.

Runs are driven through the engine's routes (retries, unknown outcomes settled by a person,
approvals, rejection, takeover, invalid data fixed by hand, timers), and the rollup stores rows
between every move, as the beat task would. A stored row is used only while its run's timeline
head is unchanged, so if any write the dashboard depends on came without a timeline event, a
row would be used after its run had moved on and the figures would differ from a dashboard
computed purely live. They must be identical.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from approvals import actions
from approvals.metrics.store import rollup
from approvals.models import ApprovalRequest, MetricsDay, RunMetrics
from runs import engine
from runs.models import SideEffect, Step
from tests.approvals.console_helpers import fast_passwords, start  # noqa: F401
from tests.approvals.test_metrics_rollup import WINDOWS, board, same
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

REPLY = {"message": "Where is my refund?", "email": "ann@example.com", "ticket": "T-1"}
LEAD = {"email": "lee@example.com", "name": "Lee"}


def _release_needing_no_engineer(run_id, person):
    return actions.release(run_id, person, needed_engineer=False)


def test_rows_stored_between_every_move_give_the_live_figures(sandbox):
    person = UserFactory(username="metrics-support", groups=["support"])
    stored = []

    def roll():
        # As if the runs had been still for a while: everything without a current row is stored.
        stored.append(rollup(now=timezone.now() + timedelta(minutes=2)))

    def drive(run):
        roll()
        run = engine.run_until_quiet(run.pk)
        roll()
        return run

    def make_due(run):
        past = timezone.now() - timedelta(hours=1)
        Step.objects.filter(run=run, status__in=["retry_scheduled", "waiting"]).update(
            next_attempt_at=past
        )
        SideEffect.objects.filter(run=run).update(attempted_at=past)

    def approval_of(run):
        return ApprovalRequest.objects.get(run=run, status="pending")

    start("test.reply", REPLY)
    roll()
    # a transient failure, retried
    sandbox.inject("mail", "429", action="send", count=1)
    run = start("test.reply", REPLY)
    roll()
    make_due(run)
    drive(run)
    # a half-success settled by lookup; a lost request resent with the same key
    sandbox.inject("mail", "commit_then_500", action="send")
    start("test.reply", REPLY)
    sandbox.inject("mail", "timeout_before_commit", action="send", seconds=3)
    run = start("test.reply", REPLY)
    roll()
    make_due(run)
    drive(run)
    # unknown outcomes settled by a person, both ways
    for happened in (True, False):
        sandbox.inject("crm", "commit_then_500" if happened else "timeout_before_commit",
                       action="create", seconds=3)  # fmt: skip
        run = start("test.lead", LEAD)
        roll()
        step = Step.objects.get(run=run, status="unknown_outcome")
        actions.confirm_outcome(step.pk, person, happened=happened, proof="crm_1")
        drive(run)
    # approvals: approve, reject; takeover, release, takeover again, cancel
    run = start("test.refund", {"amount": 150, "payment": "pay_1"})
    roll()
    actions.decide_approval(approval_of(run).pk, person, "approved")
    drive(run)
    run = start("test.refund", {"amount": 150, "payment": "pay_2"})
    roll()
    actions.decide_approval(approval_of(run).pk, person, "rejected", comment="no")
    roll()
    run = start("test.refund", {"amount": 150, "payment": "pay_3"})
    for act in (actions.take_over, _release_needing_no_engineer, actions.take_over):
        roll()
        act(run.pk, person)
    roll()
    actions.cancel_run(run.pk, person, reason="customer withdrew")
    # invalid data fixed by a person
    run = start("test.reply", {**REPLY, "ticket": ""})
    roll()
    actions.retry_with_edits(run.pk, person, {"ticket_id": "T-1", "status": "solved"})
    drive(run)
    # a timer
    run = start("test.timer", {})
    roll()
    engine.sweep(now=timezone.now() + timedelta(minutes=6))
    drive(run)
    # one left open, waiting for a person
    start("test.refund", {"amount": 10, "payment": "pay_4"})

    now = timezone.now()
    mixed = {key: board(now, key) for key in WINDOWS}
    assert sum(stored) > 20 and RunMetrics.objects.filter(finished=1).exists()
    RunMetrics.objects.all().delete()
    MetricsDay.objects.all().delete()
    live = {key: board(now, key) for key in WINDOWS}
    for key in WINDOWS:
        same(mixed[key], live[key], key)
    # The drive produced the figures it is meant to test.
    figures = live["24h"]["figures"]
    assert figures["execution_success_rate"]["counts"][1] >= 10
    assert figures["tool_failure_rate"]["counts"][0] >= 3
    assert figures["human_takeover_rate"]["counts"][0] >= 3
    assert figures["approval_handling_median"]["counts"][0] >= 2
    # And stored again from scratch, the same.
    rollup(now=now + timedelta(minutes=2))
    for key in WINDOWS:
        same(board(now, key), live[key], key)

"""prune_payloads: runs finished before the cutoff lose their payloads (event data, snapshot
parameters and prior results) but keep digests, hashes and checksums, so every chain still
verifies; younger or unfinished runs are untouched; the trigger still refuses other changes."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from runs import audit
from runs.models import Run, Snapshot, TimelineEvent
from tests.approvals.console_helpers import approval_run, start

pytestmark = pytest.mark.django_db

REPLY = {"message": "refund?", "email": "a@example.com", "ticket": "T-1"}


def _finished_days_ago(run, days):
    Run.objects.filter(pk=run.pk).update(finished_at=timezone.now() - timedelta(days=days))


@pytest.fixture
def old_and_new(sandbox):
    old = start("test.reply", REPLY)
    recent = start("test.reply", REPLY)
    open_run = approval_run()  # not finished: never pruned, whatever its age
    _finished_days_ago(old, 400)
    _finished_days_ago(recent, 10)
    Run.objects.filter(pk=open_run.pk).update(created_at=timezone.now() - timedelta(days=900))
    return old, recent, open_run


def prune(*args) -> str:
    out = io.StringIO()
    call_command("prune_payloads", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def test_it_prunes_old_finished_runs_and_the_chains_still_verify(old_and_new):
    old, recent, open_run = old_and_new
    digests = dict(TimelineEvent.objects.filter(run=old).values_list("seq", "data_digest"))
    hashes = dict(TimelineEvent.objects.filter(run=old).values_list("seq", "hash"))
    checksums = dict(Snapshot.objects.filter(run=old).values_list("pk", "checksum"))
    out = prune()  # default: TASKPILOTS_RETENTION_DAYS (365)
    assert f"pruned {len(digests)} events and {len(checksums)} snapshots" in out
    for event in TimelineEvent.objects.filter(run=old):
        assert event.pruned and event.data == {"pruned": True}
        assert event.data_digest == digests[event.seq] and event.hash == hashes[event.seq]
    for snapshot in Snapshot.objects.filter(run=old):
        assert snapshot.pruned and snapshot.params == {} and snapshot.prior_results_summary == {}
        assert snapshot.checksum == checksums[snapshot.pk]
    for run in (recent, open_run):
        assert not TimelineEvent.objects.filter(run=run, pruned=True).exists()
        assert not Snapshot.objects.filter(run=run, pruned=True).exists()
    report = audit.verify_queryset_runs(Run.objects.all())
    assert report.ok, report.problems
    assert report.pruned_events == len(digests)
    # A second pass has nothing left to do.
    assert "pruned 0 events and 0 snapshots" in prune()


def test_older_than_and_dry_run(old_and_new):
    old, recent, _open = old_and_new
    out = prune("--older-than", "5", "--dry-run")
    total = TimelineEvent.objects.filter(run__in=[old, recent]).count()
    assert f"would prune {total} events" in out
    assert not TimelineEvent.objects.filter(pruned=True).exists()
    prune("--older-than", "5", "--batch-size", "1")
    assert TimelineEvent.objects.filter(pruned=True).count() == total
    assert audit.verify_queryset_runs(Run.objects.all()).ok


def test_the_trigger_still_refuses_other_changes_after_pruning(old_and_new):
    old = old_and_new[0]
    prune()
    with (
        pytest.raises(DatabaseError, match="append-only"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute("UPDATE runs_timelineevent SET actor = 'x' WHERE run_id = %s", [old.pk])


def test_retention_reads_the_setting_then_the_environment_default(settings, monkeypatch):
    from taskpilots.env import env_int

    monkeypatch.delenv("TASKPILOTS_RETENTION_DAYS", raising=False)
    assert env_int("TASKPILOTS_RETENTION_DAYS", 365, minimum=1) == 365
    settings.TASKPILOTS = {k: v for k, v in settings.TASKPILOTS.items() if k != "RETENTION_DAYS"}
    assert audit.retention_days() == audit.RETENTION_DAYS
    settings.TASKPILOTS = {**settings.TASKPILOTS, "RETENTION_DAYS": 30}
    assert audit.retention_days() == 30

"""Pruning of the payloads of runs that finished before the retention cutoff."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connection, transaction
from django.utils import timezone

from runs import seal
from runs.audit.common import PRUNED_DATA, RUN_BATCH, retention_days
from runs.models import Run, Snapshot, TimelineEvent
from runs.signals import payloads_pruning

# --------------------------------------------------------------------------------------------
# Retention


@dataclass
class PruneReport:
    cutoff: datetime
    dry_run: bool
    runs: int = 0
    events: int = 0
    snapshots: int = 0

    def summary(self) -> str:
        verb = "would prune" if self.dry_run else "pruned"
        return (
            f"{verb} {self.events} events and {self.snapshots} snapshots; {self.runs} runs "
            f"finished before {self.cutoff.isoformat()}"
        )


def prune_payloads(
    older_than_days: int | None = None,
    *,
    now: datetime | None = None,
    dry_run: bool = False,
    batch_size: int = RUN_BATCH,
    progress: Callable[[PruneReport], None] | None = None,
) -> PruneReport:
    """Drop the payloads of runs that finished before the cutoff.

    1. Walk finished runs with finished_at < now - days, by id, `batch_size` at a time.
    2. Per batch, in one transaction that sets `taskpilots.prune`: events not yet pruned get
       data {"pruned": true} and pruned=true, except seals (`record.sealed`: a row's id and
       digests, no payload, and what checking the row needs); snapshots get params and prior
       results {} and pruned=true. data_digest, hashes and checksums are left alone (the chain
       still proves what the payload was).
    3. With dry_run, only count what would change.
    """
    days = retention_days() if older_than_days is None else older_than_days
    cutoff = (now or timezone.now()) - timedelta(days=days)
    if not dry_run:
        # Whatever reads the payloads must keep what it needs first (the metrics rollup stores
        # every ended run's figures, so pruning never changes a figure).
        payloads_pruning.send(sender=Run, now=now)
    report = PruneReport(cutoff=cutoff, dry_run=dry_run)
    finished = Run.objects.filter(status__in=Run.TERMINAL, finished_at__lt=cutoff)
    last = None
    while True:
        page = finished.order_by("pk")
        if last is not None:
            page = page.filter(pk__gt=last)
        ids = list(page.values_list("pk", flat=True)[:batch_size])
        if not ids:
            break
        last = ids[-1]
        if dry_run:
            events = (
                TimelineEvent.objects.filter(run_id__in=ids, pruned=False)
                .exclude(verb=seal.SEALED)
                .count()
            )
            snapshots = Snapshot.objects.filter(run_id__in=ids, pruned=False).count()
        else:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SET LOCAL taskpilots.prune = 'on'")
                cursor.execute(
                    "UPDATE runs_timelineevent SET data = %s::jsonb, pruned = true "
                    "WHERE run_id = ANY(%s) AND NOT pruned AND verb <> %s",
                    [json.dumps(PRUNED_DATA), ids, seal.SEALED],
                )
                events = cursor.rowcount
                cursor.execute(
                    "UPDATE runs_snapshot SET params = '{}'::jsonb, "
                    "prior_results_summary = '{}'::jsonb, verification_baseline = '{}'::jsonb, "
                    "pruned = true "
                    "WHERE run_id = ANY(%s) AND NOT pruned",
                    [ids],
                )
                snapshots = cursor.rowcount
                # SET LOCAL lasts to the end of the whole transaction: when called inside an
                # outer one, switch it off so nothing else there slips past the trigger.
                cursor.execute("SET LOCAL taskpilots.prune = 'off'")
        report.events += events
        report.snapshots += snapshots
        report.runs += len(ids)
        if progress:
            progress(report)
    return report

"""The sweeper: re-derives all due work from the database (Celery beat runs it every few
seconds), so a lost, late or duplicated message only ever delays a run."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from runs.engine.dispatch import conf, enqueue, queued_hints
from runs.engine.waits import wake
from runs.models import Run, Step, Wait
from runs.people import people

# How much longer a run must be idle to be hinted again while hints wait in the broker.
BACKLOG_PATIENCE = 10


@dataclass
class SweepReport:
    expired_leases: int = 0
    due_retries: int = 0
    tool_probes: int = 0
    timers_fired: int = 0
    waits_timed_out: int = 0
    sla_breaches: int = 0
    notifications_due: int = 0
    stale_runs: int = 0
    queued_hints: int = 0
    enqueued: set = field(default_factory=set)

    def as_dict(self) -> dict:
        data = {k: v for k, v in self.__dict__.items() if k != "enqueued"}
        data["enqueued"] = len(self.enqueued)
        return data


def sweep(now: datetime | None = None) -> SweepReport:
    """One pass: wake what is due and re-enqueue what is stuck. Safe to run concurrently and
    repeatedly; it only enqueues hints and makes conditional state changes.

    1. Steps whose worker died (lease expired): the next claim takes them back.
    2. Retries whose backoff is over.
    3. Steps waiting for a tool to recover whose probe is due: the run resumes to probe it.
    4. Timers that are due, and event waits past their deadline.
    5. The people's side: runs past a person's SLA, notifications due (runs.people).
    6. Runnable runs nobody is working on (a lost message).
    """
    now = now or timezone.now()
    batch = conf("SWEEP_BATCH")
    report = SweepReport()
    expires = max(conf("STALE_RUN_SECONDS"), 5)

    def hint(run_id):
        if run_id not in report.enqueued:
            report.enqueued.add(run_id)
            with transaction.atomic():
                enqueue(run_id, expires=expires)

    due = Step.objects.values_list("run_id", flat=True)
    for run_id in due.filter(status=Step.Status.RUNNING, lease_expires_at__lt=now)[:batch]:
        report.expired_leases += 1
        hint(run_id)
    for run_id in due.filter(status=Step.Status.RETRY_SCHEDULED, next_attempt_at__lte=now)[:batch]:
        report.due_retries += 1
        hint(run_id)
    report.tool_probes = _probe_tools(now, batch, hint)
    _wake_waits(now, batch, report, hint)
    people_side = people().sweep(now, batch, hint)
    report.sla_breaches = people_side.get("sla_breaches", 0)
    report.notifications_due = people_side.get("notifications_due", 0)
    # Hints waiting in the broker are not lost: while there is a backlog, only runs idle far
    # longer than that are hinted again (a backlog answered with more hints only grows).
    backlog = queued_hints()
    report.queued_hints = backlog
    idle = conf("STALE_RUN_SECONDS") * (BACKLOG_PATIENCE if backlog else 1)
    for run_id in _stale_runs(now, batch, idle):
        if run_id not in report.enqueued:
            report.stale_runs += 1
        hint(run_id)
    return report


def _probe_tools(now: datetime, batch: int, hint) -> int:
    probes = Step.objects.filter(status=Step.Status.WAITING, next_attempt_at__lte=now)
    count = 0
    for step in probes[:batch]:
        with transaction.atomic():
            run = Run.objects.select_for_update().get(pk=step.run_id)
            if run.status == Run.Status.WAITING:
                run.resume(reason=f"probing {step.tool}")
        count += 1
        hint(step.run_id)
    return count


def _wake_waits(now: datetime, batch: int, report: SweepReport, hint) -> None:
    for wait in Wait.objects.filter(
        status=Wait.Status.PENDING, due_at__lte=now, kind__in=[Wait.Kind.TIMER, Wait.Kind.EVENT]
    )[:batch]:
        if wake(wait, now):
            if wait.kind == Wait.Kind.TIMER:
                report.timers_fired += 1
            else:
                report.waits_timed_out += 1
            hint(wait.run_id)


def _stale_runs(now: datetime, batch: int, idle_seconds: float) -> list:
    """Runnable runs with nothing live and nothing scheduled, idle past `idle_seconds`."""
    stale_before = now - timedelta(seconds=idle_seconds)
    busy = Step.objects.filter(run=OuterRef("pk")).filter(
        Q(status=Step.Status.RUNNING, lease_expires_at__gt=now)
        | Q(status=Step.Status.RETRY_SCHEDULED, next_attempt_at__gt=now)
    )
    return list(
        Run.objects.filter(status__in=Run.RUNNABLE, updated_at__lt=stale_before)
        .exclude(Exists(busy))
        .values_list("pk", flat=True)[:batch]
    )

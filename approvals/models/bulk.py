"""Bulk actions: one action applied to many runs at once (approvals/bulk.py).

A preview freezes the set: one BulkActionItem per matched run, with the run's `lock_version`
as it was shown and what will happen to it (or why it is skipped). Executing carries the
pending items out one transaction each; an item is marked in the same transaction as the action
on its run, so a worker killed midway leaves every run either acted on and marked, or neither.

Both are sealed (runs/seal.py): the job on the records chain when it is created, when its items
are written (its seal then covers the frozen set: each item's run, step, version, plan and
evidence), when it starts and when it is done; an item on its run's timeline when it is handled.
"""

from __future__ import annotations

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models, transaction
from django.db.models import Count, Q
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from runs.models import Run, Step
from runs.seal import SealedModel, seal, seal_rows

# How many runs one bulk action may cover (the preview says so when more match).
MAX_RUNS = 1000


class BulkVerb(models.TextChoices):
    RETRY = "retry", _("Retry now")
    CONFIRM_HAPPENED = "confirm_happened", _("Confirm it happened")
    CONFIRM_NOT_HAPPENED = "confirm_not_happened", _("Confirm it did not happen")
    RELEASE = "release", _("Release")
    REASSIGN = "reassign", _("Reassign")
    CANCEL = "cancel", _("Cancel run")


class BulkStatus(models.TextChoices):
    PREVIEWED = "previewed", _("Previewed")
    RUNNING = "running", _("Running")
    # A person paused it: the worker stops after the item in hand; resuming goes on.
    PAUSED = "paused", _("Paused")
    # A person stopped it: the items not yet handled stay pending and are never acted on.
    STOPPED = "stopped", _("Stopped")
    DONE = "done", _("Done")


class BulkItemStatus(models.TextChoices):
    PENDING = "pending", _("Pending")
    DONE = "done", _("Done")
    SKIPPED = "skipped", _("Skipped")
    FAILED = "failed", _("Failed")


class BulkAction(SealedModel):
    Verb = BulkVerb
    Status = BulkStatus

    action = models.CharField(max_length=30, choices=BulkVerb.choices)
    status = models.CharField(max_length=20, choices=BulkStatus.choices, default="previewed")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    # The filters the set was selected with, as given (shown on the result page).
    filters = models.JSONField(default=dict, blank=True, encoder=DjangoJSONEncoder)
    # What the action needs: comment, reason, needed_engineer, to (a username).
    params = models.JSONField(default=dict, blank=True, encoder=DjangoJSONEncoder)
    matched = models.PositiveIntegerField(default=0)  # before the cap
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Moved by the worker after every item: a running job whose heartbeat is old is re-enqueued
    # by the sweep (approvals/bulk.py `resume_stale`).
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    # What the preview found of the tools a retry calls: {tool: {state, detail}} (approvals/
    # incidents.py check_tool), so the page says whether a tool was still down when offered.
    tool_health = models.JSONField(default=dict, blank=True, encoder=DjangoJSONEncoder)
    # The job whose failed or skipped runs this one retries ("retry the ones that failed").
    retry_of = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="retries"
    )
    # Who paused, resumed or stopped it last, and when (the seal records each move).
    control_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    control_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(
                fields=["heartbeat_at"], name="bulk_running_idx", condition=Q(status="running")
            )
        ]

    def __str__(self) -> str:
        return f"bulk action #{self.pk} ({self.action})"

    def begin(self) -> bool:
        """previewed → running, once (False: it was started already)."""
        now = timezone.now()
        fields = {"status": BulkStatus.RUNNING, "started_at": now, "heartbeat_at": now}
        with transaction.atomic(savepoint=False):
            job = BulkAction.objects.filter(pk=self.pk, status=BulkStatus.PREVIEWED)
            if not job.update(**fields):
                return False
            seal(self)
        for name, value in fields.items():
            setattr(self, name, value)
        return True

    # Which moves a person may make, from where.
    CONTROLS = {
        "pause": ({BulkStatus.RUNNING}, BulkStatus.PAUSED),
        "resume": ({BulkStatus.PAUSED}, BulkStatus.RUNNING),
        "stop": ({BulkStatus.RUNNING, BulkStatus.PAUSED}, BulkStatus.STOPPED),
    }

    def control(self, move: str, user) -> bool:
        """Pause, resume or stop the job (a conditional update, sealed): False when it is not
        in a state that move applies to (finished, or moved already by someone else). The
        worker reads the status between runs, so the run in hand finishes first."""
        sources, target = self.CONTROLS[move]
        now = timezone.now()
        fields = {"status": target, "control_by": user, "control_at": now}
        if target == BulkStatus.RUNNING:
            fields["heartbeat_at"] = now
        if target == BulkStatus.STOPPED:
            fields["finished_at"] = now
        with transaction.atomic(savepoint=False):
            moved = BulkAction.objects.filter(pk=self.pk, status__in=sources).update(**fields)
            if not moved:
                return False
            seal(self)
        for name, value in fields.items():
            setattr(self, name, value)
        return True

    def is_running(self) -> bool:
        """Read from the database: the worker asks before each run."""
        return BulkAction.objects.filter(pk=self.pk, status=BulkStatus.RUNNING).exists()

    def beat(self, now=None) -> None:
        """The job moves: the sweep leaves it to its worker (approvals/bulk.py resume_stale)."""
        BulkAction.objects.filter(pk=self.pk).update(heartbeat_at=now or timezone.now())

    def finish_if_done(self) -> bool:
        """running → done once no item is pending (one statement, so two workers agree)."""
        pending = BulkActionItem.objects.filter(bulk_action=self, status=BulkItemStatus.PENDING)
        with transaction.atomic(savepoint=False):
            done = (
                BulkAction.objects.filter(pk=self.pk, status=BulkStatus.RUNNING)
                .exclude(models.Exists(pending))
                .update(status=BulkStatus.DONE, finished_at=timezone.now())
            )
            if done:
                seal(self)
        return bool(done)

    @property
    def capped(self) -> bool:
        return self.matched > MAX_RUNS

    def counts(self) -> dict[str, int]:
        """Items by status (one query), plus `total`."""
        found = dict(
            self.items.values_list("status").annotate(n=Count("id")).values_list("status", "n")
        )
        counts = {s: found.get(s, 0) for s in BulkItemStatus.values}
        counts["total"] = sum(found.values())
        counts["finished"] = counts["total"] - counts["pending"]
        return counts


class BulkItemQuerySet(models.QuerySet):
    def bulk_create(self, objs, *args, **kwargs):
        """Write a preview's items, then seal their jobs again: each job's seal then covers
        its frozen set of items (one seal per job, in the same transaction)."""
        with transaction.atomic(savepoint=False):
            created = super().bulk_create(objs, *args, **kwargs)
            jobs = sorted({item.bulk_action_id for item in created})
            seal_rows(BulkAction, jobs)
        return created


class BulkActionItem(models.Model):
    Status = BulkItemStatus

    objects = BulkItemQuerySet.as_manager()

    bulk_action = models.ForeignKey(BulkAction, on_delete=models.CASCADE, related_name="items")
    position = models.PositiveIntegerField()
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="+")
    step = models.ForeignKey(
        Step, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    # The run's version when previewed: acting finds it changed → skipped, never overwritten.
    expected_version = models.PositiveIntegerField()
    status = models.CharField(max_length=20, choices=BulkItemStatus.choices, default="pending")
    plan = models.TextField(blank=True, default="")  # what the action will do to this run
    reason = models.TextField(blank=True, default="")  # why it was skipped or failed
    # What the external system says for the call's key (confirm actions): {system, found, id}.
    evidence = models.JSONField(default=dict, blank=True, encoder=DjangoJSONEncoder)
    decision = models.ForeignKey(
        "approvals.HumanDecision", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["bulk_action", "run"], name="bulk_item_run_once"),
            models.UniqueConstraint(fields=["bulk_action", "position"], name="bulk_item_position"),
        ]
        indexes = [models.Index(fields=["bulk_action", "status", "position"], name="bulk_item_idx")]
        ordering = ["bulk_action", "position"]

    def finish(self, status: str, reason: str = "", decision=None) -> None:
        """Mark the item handled (inside the transaction that acted on its run, so the two
        commit together)."""
        fields = {"status": status, "reason": reason[:2000], "finished_at": timezone.now()}
        with transaction.atomic(savepoint=False):
            BulkActionItem.objects.filter(pk=self.pk).update(decision=decision, **fields)
            seal(self)
        for name, value in {**fields, "decision": decision}.items():
            setattr(self, name, value)

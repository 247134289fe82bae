"""Workers (their heartbeats) and inbound events."""

from __future__ import annotations

from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.db.models import Q
from django.utils import timezone

from runs.models.step import Wait

# --------------------------------------------------------------------------------------------
# Workers: one row per worker process incarnation, its heartbeat, and whether it stopped or was
# found dead (runs.engine.liveness).


class Worker(models.Model):
    """A worker process's incarnation: the name its leases carry, and its heartbeat.

    A process that stops beating is dead to the others within seconds: another worker marks it
    dead and takes its leases back (its steps' leases expire at once), and a worker that starts
    under the same node name does the same to its own previous incarnation. A process that was
    only paused and wakes up finds its claims fenced (Lease: owner and attempt).
    """

    # The lease owner: host, pid and a token drawn when the process started (runs.engine.dispatch).
    id = models.CharField(max_length=200, primary_key=True)
    # The Celery node (and pool process) it serves: a restart under the same name takes the
    # previous incarnation's leases back at once.
    node = models.CharField(max_length=200)
    host = models.CharField(max_length=200)
    pid = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    beat_at = models.DateTimeField()
    stopped_at = models.DateTimeField(null=True, blank=True)
    dead_at = models.DateTimeField(null=True, blank=True)
    # Who found it dead: another worker (the heartbeat stopped), its successor (a restart under
    # the same node), or a person.
    found_dead_by = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        indexes = [
            models.Index(
                fields=["beat_at"],
                name="worker_alive_idx",
                condition=Q(stopped_at__isnull=True, dead_at__isnull=True),
            ),
            models.Index(fields=["node", "started_at"], name="worker_node_idx"),
        ]

    def __str__(self) -> str:
        return f"worker {self.id} ({self.node})"


# Inbound events that arrived before anyone waited for them (early callbacks are not lost).


class InboundEvent(models.Model):
    event_id = models.CharField(max_length=200, unique=True)
    event_type = models.CharField(max_length=150)
    correlation_key = models.CharField(max_length=255)
    payload = models.JSONField(default=dict, encoder=DjangoJSONEncoder)
    source = models.CharField(max_length=200, default="system")
    received_at = models.DateTimeField(default=timezone.now)
    matched_wait = models.ForeignKey(
        Wait, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        indexes = [
            models.Index(
                fields=["event_type", "correlation_key"],
                name="inbound_unmatched_idx",
                condition=Q(matched_wait__isnull=True),
            )
        ]

    def match(self, wait: Wait) -> None:
        """The wait this event resolved (early events wait for theirs; not a state change)."""
        InboundEvent.objects.filter(pk=self.pk).update(matched_wait=wait)
        self.matched_wait = wait

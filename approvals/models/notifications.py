"""SLA breaches, notification channels and their deliveries."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.db.models import F, Q
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from runs.models import (
    Run,
    _choices_check,
)


class SlaBreach(models.Model):
    """A run that stayed with a person past its due time, escalated once per due time."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="sla_breaches")
    due_at = models.DateTimeField()
    breached_at = models.DateTimeField(default=timezone.now)
    level = models.PositiveIntegerField()
    from_queue = models.CharField(max_length=100, blank=True, default="")
    to_queue = models.CharField(max_length=100, blank=True, default="")
    action = models.CharField(max_length=20, blank=True, default="")
    rule = models.JSONField(default=dict, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "due_at"], name="sla_breach_once_per_due")
        ]


class ChannelKind(models.TextChoices):
    EMAIL = "email", _("Email")
    WEBHOOK = "webhook", _("Webhook (JSON)")
    SLACK = "slack", _("Slack")


class NotificationChannel(models.Model):
    """Where a queue's notifications go: email addresses, an outgoing JSON webhook, or a Slack
    channel (its id; the app's token is a setting, approvals/slack.py)."""

    Kind = ChannelKind

    queue = models.CharField(max_length=100)
    kind = models.CharField(max_length=20, choices=Kind.choices)
    # Comma-separated addresses for email, an http(s) URL for a webhook, a Slack channel id.
    target = models.CharField(max_length=1000)
    enabled = models.BooleanField(default=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["queue", "id"]
        constraints = [_choices_check("kind", ChannelKind, "channel_kind_valid")]
        indexes = [models.Index(fields=["queue"], name="channel_queue_idx")]

    def __str__(self) -> str:
        return f"{self.queue}: {self.kind} {self.target}"


class DeliveryStatus(models.TextChoices):
    PENDING = "pending", _("Pending")
    SENT = "sent", _("Sent")
    FAILED = "failed", _("Failed (gave up)")


class NotificationDelivery(models.Model):
    """One notification to one channel for one run event. The key makes it at most one row per
    (run, event, channel, timeline seq), however often the code that records it runs."""

    Status = DeliveryStatus

    key = models.CharField(max_length=255, unique=True)
    channel = models.ForeignKey(
        NotificationChannel, on_delete=models.CASCADE, related_name="deliveries"
    )
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="notifications")
    event = models.CharField(max_length=40)
    payload = models.JSONField(encoder=DjangoJSONEncoder)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    # When a sender may (next) take it: now for a fresh one, later after a failure, and a short
    # claim while a sender holds it.
    next_attempt_at = models.DateTimeField(default=timezone.now)
    created_at = models.DateTimeField(default=timezone.now)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [_choices_check("status", DeliveryStatus, "delivery_status_valid")]
        indexes = [
            models.Index(
                fields=["next_attempt_at"],
                name="delivery_due_idx",
                condition=Q(status="pending"),
            )
        ]

    def __str__(self) -> str:
        return f"{self.key} ({self.status})"

    @classmethod
    def claim(cls, pk: int, now, *, hold: timedelta) -> NotificationDelivery | None:
        """Take a due delivery for one send attempt (compare-and-set on its due time): a
        second sender, or a second copy of the task, finds it held and does nothing."""
        claimed = cls.objects.filter(
            pk=pk, status=cls.Status.PENDING, next_attempt_at__lte=now
        ).update(next_attempt_at=now + hold, attempts=F("attempts") + 1)
        return cls.objects.select_related("channel").get(pk=pk) if claimed else None

    def mark_sent(self) -> None:
        self._settle(self.Status.SENT, sent_at=timezone.now(), last_error="")

    def mark_failed(self, error: str, *, give_up: bool, retry_at) -> None:
        """The attempt failed: try again at `retry_at`, or give up (the console shows it)."""
        status = self.Status.FAILED if give_up else self.Status.PENDING
        self._settle(status, last_error=error[:2000], next_attempt_at=retry_at)

    def _settle(self, status: str, **fields: Any) -> None:
        # A delivery is not a run's state: its history is the row itself (no timeline event).
        NotificationDelivery.objects.filter(pk=self.pk).update(status=status, **fields)
        self.status = status
        for name, value in fields.items():
            setattr(self, name, value)


class NotificationCursor(models.Model):
    """How far the sweeper has read the timeline for events that notify (one row per reader)."""

    name = models.CharField(max_length=50, unique=True)
    position_at = models.DateTimeField()

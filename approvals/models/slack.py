"""Slack: who a Slack user is in TaskPilots, and the messages posted about approvals.

A `SlackIdentity` links one Slack user (workspace id + user id) to one TaskPilots user: a button
pressed in Slack decides as that user, with that user's roles, or not at all. A `SlackMessage`
is where the message about an approval was posted in one channel (its channel id and `ts`), so
that it can be updated when the approval is decided anywhere (approvals/slack.py).
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from approvals.models.notifications import NotificationChannel
from approvals.models.requests import ApprovalRequest


class SlackIdentity(models.Model):
    """A Slack user (team id + user id, as Slack's payloads name them) linked to a TaskPilots
    user. Linked by the person themselves from the link an unlinked press in Slack answers with
    (approvals/slack_link.py; `linked_by` "console:<username>"), or by an admin (the Django
    admin, `manage.py link_slack_user`)."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="slack_identities"
    )
    team_id = models.CharField(_("Slack workspace id"), max_length=32)
    slack_user_id = models.CharField(_("Slack user id"), max_length=32)
    linked_at = models.DateTimeField(default=timezone.now)
    linked_by = models.CharField(max_length=150, blank=True, default="")

    class Meta:
        verbose_name = _("Slack identity")
        verbose_name_plural = _("Slack identities")
        constraints = [
            models.UniqueConstraint(
                fields=["team_id", "slack_user_id"], name="slack_identity_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.team_id}/{self.slack_user_id} → {self.user}"

    @classmethod
    def user_for(cls, team_id: str, slack_user_id: str):
        """The active TaskPilots user linked to this Slack user, or None."""
        found = (
            cls.objects.select_related("user")
            .filter(team_id=team_id, slack_user_id=slack_user_id, user__is_active=True)
            .first()
        )
        return found.user if found else None


class SlackMessage(models.Model):
    """The message about `approval` posted through `channel` (one per approval and channel)."""

    approval = models.ForeignKey(
        ApprovalRequest, on_delete=models.CASCADE, related_name="slack_messages"
    )
    channel = models.ForeignKey(
        NotificationChannel, on_delete=models.CASCADE, related_name="slack_messages"
    )
    slack_channel = models.CharField(max_length=32)
    ts = models.CharField(max_length=32)
    posted_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["approval", "channel"], name="slack_message_once")
        ]

    def __str__(self) -> str:
        return f"approval {self.approval_id} in {self.slack_channel} at {self.ts}"

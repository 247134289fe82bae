"""People in the loop: approval requests, takeovers, every human decision, and escalation rules."""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.db.models import Q
from django.utils import timezone

from runs.models import FailureClass, Risk, Run, Step, _choices_check


class ApprovalStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    DECIDED = "decided", "Decided"
    EXPIRED = "expired", "Expired"
    CANCELLED = "cancelled", "Cancelled"


class ApprovalRequest(models.Model):
    Status = ApprovalStatus

    class Decision(models.TextChoices):
        APPROVED = "approved", "Approved"
        APPROVED_WITH_EDITS = "approved_with_edits", "Approved with edits"
        REJECTED = "rejected", "Rejected"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="approvals")
    step = models.ForeignKey(Step, on_delete=models.CASCADE, related_name="approvals")
    queue = models.CharField(max_length=100, default="support")
    reason = models.TextField()
    risk = models.CharField(max_length=10, choices=Risk.choices, default=Risk.MEDIUM)
    # The tool and parameters the approver is asked about.
    tool = models.CharField(max_length=150, blank=True, default="")
    proposed_params = models.JSONField(default=dict, encoder=DjangoJSONEncoder)
    due_at = models.DateTimeField(null=True, blank=True)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.PENDING)
    decision = models.CharField(max_length=30, choices=Decision.choices, blank=True, default="")
    edited_params = models.JSONField(null=True, blank=True, encoder=DjangoJSONEncoder)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    comment = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            _choices_check("status", ApprovalStatus, "approval_status_valid"),
            models.CheckConstraint(
                condition=Q(decision="") | Q(decision__in=["approved", "approved_with_edits",
                                                           "rejected"]),
                name="approval_decision_valid",
            ),
            # A decided request names its decision, an undecided one has none.
            models.CheckConstraint(
                condition=(Q(status="decided") & ~Q(decision="")) | (~Q(status="decided")
                                                                      & Q(decision="")),
                name="approval_decision_matches_status",
            ),
            models.UniqueConstraint(
                fields=["step"], condition=Q(status="pending"), name="approval_one_pending"
            ),
        ]  # fmt: skip
        indexes = [
            models.Index(
                fields=["queue", "due_at"], name="approval_queue_idx", condition=Q(status="pending")
            )
        ]

    def __str__(self) -> str:
        return f"approval {self.pk} for {self.run_id} ({self.status})"


class Takeover(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="takeovers")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    started_at = models.DateTimeField(default=timezone.now)
    ended_at = models.DateTimeField(null=True, blank=True)
    resolution = models.TextField(blank=True, default="")

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["run"], condition=Q(ended_at__isnull=True), name="takeover_one_open"
            )
        ]


class DecisionVerb(models.TextChoices):
    APPROVE = "approve", "Approve"
    APPROVE_WITH_EDITS = "approve_with_edits", "Approve with edits"
    REJECT = "reject", "Reject"
    TAKE_OVER = "take_over", "Take over"
    RELEASE = "release", "Release"
    CONFIRM_HAPPENED = "confirm_happened", "Confirm it happened"
    CONFIRM_NOT_HAPPENED = "confirm_not_happened", "Confirm it did not happen"
    RETRY = "retry", "Retry now"
    SKIP = "skip", "Skip step"
    COMPLETE_BY_HAND = "complete_by_hand", "Done by hand"
    CANCEL = "cancel", "Cancel run"


class HumanDecision(models.Model):
    """Every human action on a run, bound to the snapshot the person saw."""

    Verb = DecisionVerb

    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="decisions")
    step = models.ForeignKey(
        Step, null=True, blank=True, on_delete=models.PROTECT, related_name="decisions"
    )
    snapshot = models.ForeignKey(
        "runs.Snapshot", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    approval = models.ForeignKey(
        ApprovalRequest, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    verb = models.CharField(max_length=30, choices=Verb.choices)
    before = models.JSONField(null=True, blank=True, encoder=DjangoJSONEncoder)
    after = models.JSONField(null=True, blank=True, encoder=DjangoJSONEncoder)
    proof = models.TextField(blank=True, default="")
    comment = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [_choices_check("verb", DecisionVerb, "decision_verb_valid")]
        indexes = [models.Index(fields=["user", "-created_at"], name="decision_user_idx")]


class RuleAction(models.TextChoices):
    RETRY = "retry", "Retry with backoff"
    WAIT = "wait", "Wait for the outage"
    DEGRADE = "degrade", "Degrade to the fallback tool"
    COMPENSATE = "compensate", "Compensate committed side effects"
    ESCALATE = "escalate", "Escalate to a person"
    FAIL = "fail", "Fail the run"


class EscalationRule(models.Model):
    """How a failure is routed. Rules are tried in `position` order; the first match wins.

    An empty match field matches anything.
    """

    Action = RuleAction

    position = models.PositiveIntegerField(default=100)
    name = models.CharField(max_length=200)
    enabled = models.BooleanField(default=True)
    workflow = models.CharField(max_length=100, blank=True, default="")
    step = models.CharField(max_length=150, blank=True, default="")
    tool = models.CharField(max_length=150, blank=True, default="")
    failure_class = models.CharField(
        max_length=20, choices=FailureClass.choices, blank=True, default=""
    )
    risk = models.CharField(max_length=10, choices=Risk.choices, blank=True, default="")
    action = models.CharField(max_length=20, choices=Action.choices)
    queue = models.CharField(max_length=100, default="ops")
    max_attempts = models.PositiveIntegerField(default=5)
    backoff_base_seconds = models.FloatField(default=1.0)
    backoff_cap_seconds = models.FloatField(default=60.0)
    wait_window_seconds = models.PositiveIntegerField(default=900)
    probe_interval_seconds = models.PositiveIntegerField(default=30)
    approval_sla_seconds = models.PositiveIntegerField(default=4 * 3600)
    version = models.PositiveIntegerField(default=1)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["position", "id"]
        constraints = [
            _choices_check("action", RuleAction, "rule_action_valid"),
            models.CheckConstraint(
                condition=Q(failure_class="") | Q(failure_class__in=FailureClass.values),
                name="rule_failure_class_valid",
            ),
            models.CheckConstraint(
                condition=Q(risk="") | Q(risk__in=Risk.values), name="rule_risk_valid"
            ),
            models.CheckConstraint(
                condition=Q(backoff_cap_seconds__gte=models.F("backoff_base_seconds")),
                name="rule_backoff_cap_above_base",
            ),
        ]
        indexes = [models.Index(fields=["enabled", "position"], name="rule_order_idx")]

    def __str__(self) -> str:
        return f"#{self.position} {self.name} → {self.action}"

    def matches(self, *, workflow: str, step: str, tool: str, failure_class: str, risk: str):
        return all(
            not want or want == have
            for want, have in (
                (self.workflow, workflow),
                (self.step, step),
                (self.tool, tool),
                (self.failure_class, failure_class),
                (self.risk, risk),
            )
        )

    def backoff(self, attempt: int, rng: random.Random | None = None) -> timedelta:
        """Exponential backoff with full jitter, capped: base·2^(attempt-1), then uniform(½, 1)."""
        raw = min(self.backoff_cap_seconds, self.backoff_base_seconds * 2 ** max(attempt - 1, 0))
        jitter = (rng or random).uniform(0.5, 1.0)
        return timedelta(seconds=raw * jitter)

    def describe(self) -> dict[str, Any]:
        return {"rule_id": self.pk, "rule": self.name, "version": self.version,
                "action": self.action, "queue": self.queue}  # fmt: skip

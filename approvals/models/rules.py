"""Escalation rules, their sealed versions, and tool pauses."""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import IntegrityError, models, transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from approvals.models.requests import RuleAction
from approvals.thresholds import above_threshold
from runs import tools as tool_registry
from runs.models import (
    FailureClass,
    Risk,
    _choices_check,
)
from runs.people import first_matching
from runs.seal import SealedModel, seal, seal_rows


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
    # How long a person has for an approval, or an escalation, this rule creates (0 = no SLA).
    approval_sla_seconds = models.PositiveIntegerField(default=4 * 3600)
    # When a person misses the SLA of a run routed here (failure class `timeout` rules): the
    # queue it moves to ("" = stays) and the SLA it gets there (0 = none).
    escalate_to = models.CharField(max_length=100, blank=True, default="")
    escalate_after_seconds = models.PositiveIntegerField(default=0)
    # Calls this rule matches need this many distinct approvers (1 or 2) — an `approve` rule's
    # calls whatever the workflow declared, the approval steps of other rules. With a threshold
    # (an amount, or a number of records touched), `approvers_required` are needed above it and
    # `approvers_below` (0 or 1) at or below it. The amount is the call's `amount_param` (or
    # the one the tool declares), in `amount_currency` when one is given (converted by
    # TASKPILOTS_CURRENCY_RATES); records likewise. A value that cannot be read or converted
    # counts as above (the careful side). See approvals/gate.py.
    approvers_required = models.PositiveSmallIntegerField(default=1)
    approvers_below = models.PositiveSmallIntegerField(default=0)
    amount_param = models.CharField(max_length=100, blank=True, default="")
    amount_above = models.DecimalField(max_digits=18, decimal_places=2, null=True, blank=True)
    amount_currency = models.CharField(max_length=3, blank=True, default="")
    records_param = models.CharField(max_length=100, blank=True, default="")
    records_above = models.PositiveIntegerField(null=True, blank=True)
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
                condition=Q(approvers_required__in=[1, 2]), name="rule_approvers_one_or_two"
            ),
            models.CheckConstraint(
                condition=Q(approvers_below__lt=models.F("approvers_required")),
                name="rule_approvers_below_fewer",
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

    @classmethod
    def first_match(
        cls, *, workflow: str, step: str, tool: str, failure_class: str, risk: str
    ) -> EscalationRule | None:
        """The rule that routes this failure: the first enabled one, in order, that matches
        (`approve` rules route nothing: they put calls behind approval, approvals/gate.py).
        Read from the database every time, so an admin's edit applies to the next failure."""
        return first_matching(
            cls.objects.filter(enabled=True).exclude(action=RuleAction.APPROVE),
            workflow=workflow,
            step=step,
            tool=tool,
            failure_class=failure_class,
            risk=risk,
        )

    @property
    def has_threshold(self) -> bool:
        return (
            bool(self.amount_param)
            or self.amount_above is not None
            or (self.records_above is not None)
        )

    def approvers_for(self, params: Any, tool: tool_registry.Tool | None = None) -> int:
        """How many distinct people must approve a call with these parameters."""
        if not self.has_threshold:
            return self.approvers_required
        if above_threshold(self, params if isinstance(params, dict) else {}, tool):
            return self.approvers_required
        return self.approvers_below

    def backoff(self, attempt: int, rng: random.Random | None = None) -> timedelta:
        """Exponential backoff with full jitter, capped: base·2^(attempt-1), then uniform(½, 1)."""
        raw = min(self.backoff_cap_seconds, self.backoff_base_seconds * 2 ** max(attempt - 1, 0))
        jitter = (rng or random).uniform(0.5, 1.0)
        return timedelta(seconds=raw * jitter)

    def describe(self) -> dict[str, Any]:
        return {
            "rule_id": self.pk,
            "rule": self.name,
            "version": self.version,
            "action": self.action,
            "queue": self.queue,
        }

    VERSIONED_FIELDS = (
        "position",
        "name",
        "enabled",
        "workflow",
        "step",
        "tool",
        "failure_class",
        "risk",
        "action",
        "queue",
        "max_attempts",
        "backoff_base_seconds",
        "backoff_cap_seconds",
        "wait_window_seconds",
        "probe_interval_seconds",
        "approval_sla_seconds",
        "escalate_to",
        "escalate_after_seconds",
        "approvers_required",
        "approvers_below",
        "amount_param",
        "amount_above",
        "amount_currency",
        "records_param",
        "records_above",
    )

    def data(self) -> dict[str, Any]:
        """The rule's settings as one JSON object (what RuleVersion keeps)."""
        return {name: getattr(self, name) for name in self.VERSIONED_FIELDS}


class RulesStamp(models.Model):
    """One row whose `stamp` is replaced by a fresh random value in every transaction that
    changes escalation rules, by any path (a statement trigger on the rules' table,
    approvals/migrations/0027, so the ORM, the admin, bulk edits and plain SQL alike).

    The engine's one-round-trip statements read it to know that the approval rules a worker
    cached are still those in force (approvals.gate.RULES_STAMP_SQL): one index lookup however
    many rules there are. A stamp is never reused, so rules changed and changed back, or a
    change rolled back, never pass for rules a worker read at another time."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    stamp = models.CharField(max_length=36)

    class Meta:
        constraints = [models.CheckConstraint(condition=Q(id=1), name="rules_stamp_one_row")]

    def __str__(self) -> str:
        return f"rules stamp {self.stamp}"


# --------------------------------------------------------------------------------------------
# Rule history, tool pauses, SLA breaches and notifications (the admin side of issue 7)


class RuleChange(models.TextChoices):
    CREATED = "created", _("Created")
    UPDATED = "updated", _("Updated")
    ENABLED = "enabled", _("Enabled")
    DISABLED = "disabled", _("Disabled")
    MOVED = "moved", _("Moved")


class RuleVersion(SealedModel):
    """One row per change of an EscalationRule, written in the transaction of the change.

    `data` is the rule as it was after the change; `before` as it was before (None on create),
    so an auditor reads who changed what without diffing rows. Written once: the version and
    the rule row it describes are both sealed on the records chain as it is saved, so a rule
    row changed afterwards no longer matches its seal.
    """

    Change = RuleChange
    append_only = True

    rule = models.ForeignKey(EscalationRule, on_delete=models.PROTECT, related_name="versions")
    version = models.PositiveIntegerField()
    change = models.CharField(max_length=20, choices=Change.choices)
    data = models.JSONField(encoder=DjangoJSONEncoder)
    before = models.JSONField(null=True, blank=True, encoder=DjangoJSONEncoder)
    changed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    changed_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["rule", "-version"]
        constraints = [
            models.UniqueConstraint(fields=["rule", "version"], name="rule_version_unique"),
            _choices_check("change", RuleChange, "rule_version_change_valid"),
        ]

    def __str__(self) -> str:
        return f"rule {self.rule_id} v{self.version} ({self.change})"

    def save(self, *args, **kwargs):
        adding = self._state.adding
        with transaction.atomic(savepoint=False):
            super().save(*args, **kwargs)
            if adding:
                seal_rows(EscalationRule, [self.rule_id])

    @property
    def changes(self) -> list[tuple[str, Any, Any]]:
        """(field, before, after) for every setting this version changed."""
        if not self.before:
            return []
        return [
            (name, self.before.get(name), value)
            for name, value in self.data.items()
            if self.before.get(name) != value
        ]


class ToolPause(SealedModel):
    """An admin's circuit breaker on a tool: while a pause is open (resumed_at is null), steps
    that would call the tool wait instead, and no call is made. Sealed on the records chain
    when it opens and when it is resumed (`resume`)."""

    tool = models.CharField(max_length=150)
    reason = models.TextField()
    # None: TaskPilots opened it (a tool whose API drifted, runs.engine.routing).
    paused_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    paused_at = models.DateTimeField(default=timezone.now)
    resumed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    resumed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            # At most one open pause per tool; its index serves the engine's per-call check.
            models.UniqueConstraint(
                fields=["tool"], condition=Q(resumed_at__isnull=True), name="tool_pause_one_open"
            )
        ]

    def __str__(self) -> str:
        return f"pause of {self.tool} ({'open' if self.resumed_at is None else 'resumed'})"

    def resume(self, user, now=None) -> bool:
        """Close the pause (who, when) and seal it; False when it was closed already. Called
        last in its transaction (after the runs it wakes are locked)."""
        now = now or timezone.now()
        with transaction.atomic(savepoint=False):
            closed = ToolPause.objects.filter(pk=self.pk, resumed_at__isnull=True).update(
                resumed_at=now, resumed_by=user
            )
            if closed:
                seal(self)
        if closed:
            self.resumed_at, self.resumed_by = now, user
        return bool(closed)

    @classmethod
    def active_for(cls, tool: str) -> ToolPause | None:
        """The open pause of this tool, if any (one index lookup: tool_pause_one_open)."""
        return cls.objects.filter(tool=tool, resumed_at__isnull=True).first()

    @classmethod
    def open_by_engine(cls, tool: str, reason: str) -> tuple[ToolPause, bool]:
        """Open a pause with nobody's name on it, or keep the open one: (pause, created). Two
        runs finding the drift at once meet on tool_pause_one_open; the second keeps the
        first's pause."""
        existing = cls.active_for(tool)
        if existing is not None:
            return existing, False
        try:
            with transaction.atomic():
                return cls.objects.create(tool=tool, reason=reason[:2000]), True
        except IntegrityError:
            return cls.objects.get(tool=tool, resumed_at__isnull=True), False

    @classmethod
    def open_statement(cls) -> str:
        """Every open pause as one JSON value, {tool: [id, reason]} ({} when none), for the
        engine's batched round trips (the partial index tool_pause_one_open holds them)."""
        return (
            "SELECT coalesce(json_object_agg(tool, json_build_array(id, reason)), '{}'::json) "
            f"FROM {cls._meta.db_table} WHERE resumed_at IS NULL"
        )

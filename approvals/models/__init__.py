"""People in the loop: approval requests, takeovers, every human decision, and escalation rules."""

from __future__ import annotations

import contextlib
import random
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.core.serializers.json import DjangoJSONEncoder
from django.db import IntegrityError, connection, models, transaction
from django.db.models import F, Q
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from approvals.thresholds import above_threshold
from runs import tools as tool_registry
from runs.conditions import describe as describe_condition
from runs.models import (
    FailureClass,
    InvalidTransition,
    Risk,
    RouteAction,
    Run,
    SideEffect,
    Step,
    TimelineEvent,
    _choices_check,
    digest,
)
from runs.people import Approval, first_matching
from runs.seal import SealedModel, seal, seal_rows
from runs.verbs import Verb


class ApprovalStatus(models.TextChoices):
    PENDING = "pending", _("Pending")
    DECIDED = "decided", _("Decided")
    EXPIRED = "expired", _("Expired")
    CANCELLED = "cancelled", _("Cancelled")


class ApprovalRequest(models.Model):
    Status = ApprovalStatus

    class Decision(models.TextChoices):
        APPROVED = "approved", _("Approved")
        APPROVED_WITH_EDITS = "approved_with_edits", _("Approved with edits")
        REJECTED = "rejected", _("Rejected")

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
    # What the approver allowed only under conditions (runs.conditions): [{param, op, value}],
    # enforced by the engine on the call. Empty: no conditions.
    conditions = models.JSONField(default=list, blank=True, encoder=DjangoJSONEncoder)
    # How many distinct people must approve (1 or 2), decided when the request opens from the
    # rule that matched then: a later rule edit does not change a pending request.
    approvals_required = models.PositiveSmallIntegerField(default=1)
    # A two-person request's first approval: who, when, the parameters they approved (what the
    # second approver is asked about) and their conditions. Empty until then.
    first_approved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    first_approved_at = models.DateTimeField(null=True, blank=True)
    first_params = models.JSONField(null=True, blank=True, encoder=DjangoJSONEncoder)
    first_conditions = models.JSONField(default=list, blank=True, encoder=DjangoJSONEncoder)
    # Why more than one person, or anybody, must approve: the rules that asked, each
    # {rule_id, rule, version, approvers, amount?, records?} (approvals.gate), for the run page.
    approvers_because = models.JSONField(default=list, blank=True, encoder=DjangoJSONEncoder)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            _choices_check("status", ApprovalStatus, "approval_status_valid"),
            models.CheckConstraint(
                condition=Q(approvals_required__in=[1, 2]), name="approval_required_one_or_two"
            ),
            models.CheckConstraint(
                condition=Q(decision="")
                | Q(decision__in=["approved", "approved_with_edits", "rejected"]),
                name="approval_decision_valid",
            ),
            # A decided request names its decision, an undecided one has none.
            models.CheckConstraint(
                condition=(Q(status="decided") & ~Q(decision=""))
                | (~Q(status="decided") & Q(decision="")),
                name="approval_decision_matches_status",
            ),
            models.UniqueConstraint(
                fields=["step"], condition=Q(status="pending"), name="approval_one_pending"
            ),
        ]
        indexes = [
            models.Index(
                fields=["queue", "due_at"], name="approval_queue_idx", condition=Q(status="pending")
            )
        ]

    S = Status
    TRANSITIONS: dict[str, set[str]] = {
        S.PENDING: {S.DECIDED, S.EXPIRED, S.CANCELLED},
        S.DECIDED: set(),
        S.EXPIRED: set(),
        S.CANCELLED: set(),
    }
    DECISION_VERBS = {
        Decision.APPROVED: Verb.APPROVAL_APPROVED,
        Decision.APPROVED_WITH_EDITS: Verb.APPROVAL_APPROVED_WITH_EDITS,
        Decision.REJECTED: Verb.APPROVAL_REJECTED,
    }

    def __str__(self) -> str:
        return f"approval {self.pk} for {self.run_id} ({self.status})"

    @classmethod
    def open(cls, run: Run, step: Step, asked: Approval) -> ApprovalRequest:
        """Ask a person (the engine's approval step, in its transaction; the step's
        `approval.requested` event names this request)."""
        with transaction.atomic(savepoint=False):
            request = cls.objects.create(
                run=run,
                step=step,
                queue=asked.queue,
                reason=asked.reason,
                risk=asked.risk,
                tool=asked.tool,
                proposed_params=asked.proposed_params,
                due_at=asked.due_at,
                approvals_required=asked.approvals_required,
                approvers_because=list(asked.because),
            )
            seal(request)
        return request

    @property
    def awaits_second(self) -> bool:
        """A two-person request that one person approved and a second has not yet."""
        return (
            self.approvals_required == 2
            and self.status == self.Status.PENDING
            and self.first_approved_by_id is not None
        )

    @property
    def approved_params(self) -> dict:
        """What an approval approves now: the first approver's parameters once they approved
        (the second approver is asked about those), else the proposal."""
        return self.first_params if self.first_params is not None else self.proposed_params

    def approve_first(self, user, *, params: dict, comment: str = "", conditions=()) -> None:
        """The first of two approvals: recorded (with its event), the request stays pending and
        the run does not move; the run's version moves so a page loaded before it is stale.
        The caller holds the run, step and request locks (approvals.actions)."""
        now = timezone.now()
        with transaction.atomic(savepoint=False):
            count = ApprovalRequest.objects.filter(
                pk=self.pk, status=self.Status.PENDING, first_approved_by__isnull=True
            ).update(
                first_approved_by=user,
                first_approved_at=now,
                first_params=params,
                first_conditions=list(conditions),
            )
            if not count:
                raise InvalidTransition("approval", self.pk, self.status, "first_approved")
            Run.objects.filter(pk=self.run_id).update(
                lock_version=F("lock_version") + 1, updated_at=now
            )
            TimelineEvent.append(
                self.run_id,
                Verb.APPROVAL_FIRST_APPROVED,
                {
                    "approval": self.pk,
                    "step": self.step.name,
                    "queue": self.queue,
                    "by": user.get_username(),
                    "approvals_required": self.approvals_required,
                    "comment": comment,
                    **({"conditions": list(conditions)} if conditions else {}),
                    "params": params,
                    "diff": params_diff(self.proposed_params, params),
                    "shown_digest": self.shown()["digest"],
                },
                actor=f"user:{user.get_username()}",
            )
            seal(self)
        self.first_approved_by, self.first_approved_at = user, now
        self.first_params, self.first_conditions = params, list(conditions)

    def require_approvers(self, count: int, *, reasons=(), because=()) -> None:
        """More distinct people must approve than the request asked for (the parameters being
        approved pass a rule's threshold). The caller holds the run, step and request locks."""
        with transaction.atomic(savepoint=False):
            ApprovalRequest.objects.filter(pk=self.pk, status=self.Status.PENDING).update(
                approvals_required=count, approvers_because=list(because)
            )
            TimelineEvent.append(
                self.run_id,
                Verb.APPROVAL_APPROVERS_RAISED,
                {
                    "approval": self.pk,
                    "step": self.step.name,
                    "from": self.approvals_required,
                    "to": count,
                    "reasons": list(reasons),
                },
            )
            self.approvers_because = list(because)
            seal(self)
        self.approvals_required = count

    def shown(self) -> dict[str, Any]:
        """Exactly what the approver is shown: the tool, its target and the parameters, with
        their digest (a decision records it; the side effect that executes it names it)."""
        return shown(self.tool, self.proposed_params)

    def _move(
        self, target: str, verb: Verb, *, actor: str = "system", data=None, **fields: Any
    ) -> None:
        """Compare-and-set from the request's current status, with its event, in one
        transaction (the verbs below). Raises InvalidTransition when someone else got there
        first."""
        with transaction.atomic(savepoint=False):
            count = ApprovalRequest.objects.filter(
                pk=self.pk, status__in=[s for s, t in self.TRANSITIONS.items() if target in t]
            ).update(status=target, **fields)
            if count:
                event = {
                    "approval": self.pk,
                    "step": self.step.name,
                    "from": self.status,
                    "to": target,
                    **(data or {}),
                }
                TimelineEvent.append(self.run_id, verb, event, actor=actor)
                seal(self)
        if not count:
            current = ApprovalRequest.objects.values_list("status", flat=True).get(pk=self.pk)
            raise InvalidTransition("approval", self.pk, current, target)
        self.status = target
        for name, value in fields.items():
            setattr(self, name, value)

    def decide(
        self, user, decision: str, *, params: dict, comment: str = "", conditions=()
    ) -> None:
        """Record a person's decision on exactly what they were shown (and the conditions,
        already validated, an approval is granted under)."""
        D = self.Decision
        self._move(
            self.Status.DECIDED,
            self.DECISION_VERBS[decision],
            actor=f"user:{user.get_username()}",
            decision=decision,
            edited_params=params if decision == D.APPROVED_WITH_EDITS else None,
            decided_by=user,
            decided_at=timezone.now(),
            comment=comment,
            conditions=list(conditions),
            data={
                "comment": comment,
                **({"conditions": list(conditions)} if conditions else {}),
                **(
                    {"first_approved_by": self.first_approved_by.get_username()}
                    if self.first_approved_by_id
                    else {}
                ),
                "proposed": self.proposed_params,
                "params": params,
                "diff": params_diff(self.proposed_params, params),
                "shown_digest": self.shown()["digest"],
            },
        )

    def expire(self, *, by: str = "sla") -> None:
        """Nobody decided before the deadline and the rule ends the step."""
        self._move(self.Status.EXPIRED, Verb.APPROVAL_EXPIRED, data={"by": by})

    def cancel(self, *, actor: str = "system", reason: str = "") -> None:
        """Nobody needs the decision any more (step skipped, done by hand, run cancelled)."""
        self._move(
            self.Status.CANCELLED,
            Verb.APPROVAL_CANCELLED,
            actor=actor,
            data={"reason": reason[:500]},
        )

    def requeue(self, queue: str, due_at) -> None:
        """An SLA breach moved the run to another queue with a new deadline (not a state
        change: the run's `run.sla_breached` event records it)."""
        ApprovalRequest.objects.filter(pk=self.pk).update(queue=queue, due_at=due_at)
        self.queue, self.due_at = queue, due_at


def shown(tool: str, params: Any) -> dict[str, Any]:
    """What a person is shown about a call: tool, target and parameters, with their digest."""
    target = ""
    if tool:
        with contextlib.suppress(tool_registry.UnknownTool, Exception):
            target = tool_registry.get(tool).target_of(params)
    seen = {"tool": tool, "target": target, "params": params}
    return {**seen, "digest": digest(seen)}


def params_diff(before: Any, after: Any) -> dict:
    if not isinstance(before, dict) or not isinstance(after, dict):
        return {"before": before, "after": after}
    keys = sorted(set(before) | set(after))
    return {k: [before.get(k), after.get(k)] for k in keys if before.get(k) != after.get(k)}


class Takeover(SealedModel):
    """A person holding a run: sealed when it begins (the insert) and when it ends."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="takeovers")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    started_at = models.DateTimeField(default=timezone.now)
    ended_at = models.DateTimeField(null=True, blank=True)
    resolution = models.TextField(blank=True, default="")
    # The person's own answer when releasing: did handling this run need an engineer? None
    # when the takeover ended otherwise (cancel, reject), or before the question was asked.
    needed_engineer = models.BooleanField(null=True, blank=True)
    engineer_note = models.TextField(blank=True, default="")

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["run"], condition=Q(ended_at__isnull=True), name="takeover_one_open"
            )
        ]

    @classmethod
    def begin(cls, run: Run, user, *, expected_version: int | None = None) -> Takeover:
        """A person claims the run: automation stops touching it until they release it.

        1. The run moves to `taken_over` with its owner (`run.taken_over`).
        2. The takeover row opens (at most one open per run), with `takeover.started`.
        """
        run.take_over(user, expected_version=expected_version)
        takeover = cls.objects.create(run=run, user=user)
        TimelineEvent.append(
            run.pk,
            Verb.TAKEOVER_STARTED,
            {"takeover": takeover.pk, "user": user.get_username(), "from": "", "to": "open"},
            actor=f"user:{user.get_username()}",
        )
        return takeover

    @classmethod
    def end(
        cls,
        run: Run,
        user,
        resolution: str,
        *,
        needed_engineer: bool | None = None,
        engineer_note: str = "",
    ) -> None:
        """Close the run's open takeover, if any, with what the person concluded (and, on a
        release, their answer to "did this need an engineer?", also in `takeover.ended`)."""
        for takeover in cls.objects.filter(run=run, ended_at__isnull=True):
            cls.objects.filter(pk=takeover.pk).update(
                ended_at=timezone.now(),
                resolution=resolution[:2000],
                needed_engineer=needed_engineer,
                engineer_note=engineer_note[:2000],
            )
            data = {
                "takeover": takeover.pk,
                "resolution": resolution[:500],
                "from": "open",
                "to": "ended",
            }
            if needed_engineer is not None:
                data["needed_engineer"] = needed_engineer
                data["engineer_note"] = engineer_note[:500]
            TimelineEvent.append(
                run.pk, Verb.TAKEOVER_ENDED, data, actor=f"user:{user.get_username()}"
            )
            seal(takeover)


class DecisionVerb(models.TextChoices):
    APPROVE = "approve", _("Approve")
    APPROVE_WITH_EDITS = "approve_with_edits", _("Approve with edits")
    REJECT = "reject", _("Reject")
    TAKE_OVER = "take_over", _("Take over")
    RELEASE = "release", _("Release")
    CONFIRM_HAPPENED = "confirm_happened", _("Confirm it happened")
    CONFIRM_NOT_HAPPENED = "confirm_not_happened", _("Confirm it did not happen")
    RETRY = "retry", _("Retry now")
    SKIP = "skip", _("Skip step")
    COMPLETE_BY_HAND = "complete_by_hand", _("Done by hand")
    CANCEL = "cancel", _("Cancel run")
    REASSIGN = "reassign", _("Reassign")


class HumanDecision(SealedModel):
    """Every human action on a run, bound to exactly what the person saw (`shown`).

    Written once and sealed on the run's timeline in the same transaction (SealedModel); a
    decision never changes (the database refuses UPDATE and DELETE). A confirmation that an
    unknown outcome happened also seals the ledger row the person settled (its receipt and
    `confirmed_by`)."""

    Verb = DecisionVerb
    append_only = True

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
    # Exactly what the person was shown: tool, target, parameters and their digest (approvals
    # and edits; for a settled outcome, the snapshot's call). Empty for actions on a whole run.
    shown = models.JSONField(default=dict, blank=True, encoder=DjangoJSONEncoder)
    before = models.JSONField(null=True, blank=True, encoder=DjangoJSONEncoder)
    after = models.JSONField(null=True, blank=True, encoder=DjangoJSONEncoder)
    proof = models.TextField(blank=True, default="")
    comment = models.TextField(blank=True, default="")
    # The conditions an approval was granted under (as on its ApprovalRequest).
    conditions = models.JSONField(default=list, blank=True, encoder=DjangoJSONEncoder)
    created_at = models.DateTimeField(default=timezone.now)
    # Taken as one item of a bulk action (approvals/bulk.py), when it was.
    bulk_action = models.ForeignKey(
        "approvals.BulkAction", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )

    class Meta:
        constraints = [_choices_check("verb", DecisionVerb, "decision_verb_valid")]
        indexes = [models.Index(fields=["user", "-created_at"], name="decision_user_idx")]

    def save(self, *args, **kwargs):
        adding = self._state.adding
        with transaction.atomic(savepoint=False):
            super().save(*args, **kwargs)
            if adding and self.verb == DecisionVerb.CONFIRM_HAPPENED and self.snapshot_id:
                settled = SideEffect.objects.filter(
                    snapshot_id=self.snapshot_id,
                    confirmed_by__startswith="user:",
                    status=SideEffect.Status.COMMITTED,
                )
                seal_rows(SideEffect, settled.order_by("pk").values_list("pk", flat=True))

    @property
    def conditions_text(self) -> str:
        """The conditions as people read them: `amount <= 50; currency in EUR, USD`."""
        return "; ".join(describe_condition(c) for c in self.conditions or ())

    def reference(self) -> dict[str, Any]:
        """How the side effect that executes this decision names it in its snapshot."""
        return {
            "id": self.pk,
            "verb": self.verb,
            "by": self.user.get_username(),
            "tool": self.shown.get("tool", ""),
            "shown_digest": self.shown.get("digest", ""),
        }


# The router's vocabulary is the engine's (runs.models.RouteAction); rules store its values.
RuleAction = RouteAction


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


# --------------------------------------------------------------------------------------------
# Local decisions over tools' own metadata (issue 17)


# The metadata an admin may decide locally, over what the tool's code (or its MCP server's
# annotations) says. Everything else about a tool (its lookup, verification, compensation...)
# is code and stays code.
OVERRIDABLE = ("risk", "side_effect", "dedupes_by_key")
RISK_ORDER = {Risk.LOW: 0, Risk.MEDIUM: 1, Risk.HIGH: 2}


def metadata_of(tool: tool_registry.Tool) -> dict[str, Any]:
    """The overridable metadata of a tool, as a plain dict."""
    return {name: getattr(tool, name) for name in OVERRIDABLE}


def loosened(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """The fields where `after` makes the engine less careful than `before`: a side effect
    treated as a read (no snapshot, no key, retried as a read), a tool said to dedupe by key
    (an unknown outcome is sent again), a lower risk (rules for the higher one stop matching)."""
    found = []
    if before.get("side_effect") and after.get("side_effect") is False:
        found.append("side_effect")
    if before.get("dedupes_by_key") is False and after.get("dedupes_by_key"):
        found.append("dedupes_by_key")
    if RISK_ORDER.get(after.get("risk"), 2) < RISK_ORDER.get(before.get("risk"), 0):
        found.append("risk")
    return found


class MetadataConflict(Exception):
    """Someone else changed the tool's local decision since the form was loaded."""

    def __init__(self, current: ToolMetadataOverride | None):
        self.current = current
        super().__init__(current)


class MetadataLoosened(Exception):
    """The change makes the engine less careful and was not confirmed; nothing was written."""

    def __init__(self, fields: list[str], before: dict[str, Any], after: dict[str, Any]):
        self.fields, self.before, self.after = fields, before, after
        super().__init__(", ".join(fields))


class ToolMetadataOverride(SealedModel):
    """An admin's decision over a tool's own metadata (risk, side effect, dedupes by key).

    Every change is a new row and no row ever changes (a trigger refuses UPDATE and DELETE): the
    newest row of a tool is the decision in force, the older ones are its history. A field left
    empty (`risk` "", the booleans None) keeps the tool's own value, so a row with none set
    clears the decision: the tool's own metadata applies again. Each row also keeps the tool's
    own metadata and what was in force just before it, so it reads as old → new on its own.
    The engine sees the decisions through runs.tools.get (approvals.local_metadata). Each row
    is sealed on the records chain as it is written.
    """

    append_only = True
    # decide()'s writers queue on this transaction-level advisory lock ("tool").
    HISTORY_LOCK = 0x746F6F6C

    tool = models.CharField(max_length=150)
    risk = models.CharField(max_length=10, choices=Risk.choices, blank=True, default="")
    side_effect = models.BooleanField(null=True, blank=True)
    dedupes_by_key = models.BooleanField(null=True, blank=True)
    reason = models.TextField()
    # The tool's own metadata when the decision was made (code, or MCP annotations and config).
    tool_metadata = models.JSONField(default=dict)
    # The metadata in force just before this change (the previous decision over tool_metadata).
    before = models.JSONField(default=dict)
    # The fields where this change made the engine less careful, which the admin confirmed.
    loosened = ArrayField(models.CharField(max_length=20), default=list, blank=True)
    changed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    changed_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(risk="") | Q(risk__in=Risk.values), name="tool_override_risk_valid"
            ),
            models.CheckConstraint(
                condition=Q(reason__regex=r"\S"), name="tool_override_reason_given"
            ),
        ]
        indexes = [
            # The newest row per tool (the decisions in force) and a tool's history.
            models.Index(fields=["tool", "-id"], name="tool_override_newest_idx")
        ]

    def __str__(self) -> str:
        return f"metadata of {self.tool}: {self.overrides() or 'cleared'}"

    def overrides(self) -> dict[str, Any]:
        """What this decision sets (a field it leaves empty keeps the tool's own value)."""
        found: dict[str, Any] = {}
        if self.risk:
            found["risk"] = self.risk
        for name in ("side_effect", "dedupes_by_key"):
            if getattr(self, name) is not None:
                found[name] = getattr(self, name)
        return found

    @property
    def clears(self) -> bool:
        return not self.overrides()

    @property
    def after(self) -> dict[str, Any]:
        """The metadata in force from this change on."""
        return {**self.tool_metadata, **self.overrides()}

    @property
    def changes(self) -> list[tuple[str, Any, Any]]:
        """(field, before, after) for every field this change moved."""
        after = self.after
        return [
            (name, self.before.get(name), after.get(name))
            for name in OVERRIDABLE
            if self.before.get(name) != after.get(name)
        ]

    @classmethod
    def in_force(cls, tool: str) -> ToolMetadataOverride | None:
        """The tool's newest row (a clear, too), or None when it never had a decision."""
        return cls.objects.filter(tool=tool).order_by("-id").first()

    @classmethod
    def decide(
        cls,
        tool: tool_registry.Tool,
        user,
        reason: str,
        *,
        risk: str = "",
        side_effect: bool | None = None,
        dedupes_by_key: bool | None = None,
        expected: int | None = None,
        confirmed: bool = False,
    ) -> tuple[ToolMetadataOverride | None, bool]:
        """Record an admin's decision over `tool` (as its code registered it); all fields
        empty clears the decision. Returns (decision in force, changed).

        1. Lock the history against other writers (an advisory lock every writer takes;
           readers are not blocked), so `before` is what was really in force and the stamp the
           engine's caches compare only grows.
        2. `expected` (the id of the decision the admin's form showed, 0 for none) must still
           be the newest row: MetadataConflict otherwise.
        3. The same decision again writes nothing (a repeated POST changes nothing).
        4. A change that makes the engine less careful than what is in force needs
           `confirmed`: MetadataLoosened otherwise, and nothing is written.
        5. Write the row; this process's cache reloads at once, the others within
           approvals.local_metadata.REFRESH_SECONDS of the commit.
        """
        from approvals import local_metadata

        reason = (reason or "").strip()
        if not reason:
            raise ValueError("a decision over a tool's metadata needs a reason")
        if risk and risk not in Risk.values:
            raise ValueError(f"risk must be one of {Risk.values}")
        own = metadata_of(tool)
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [cls.HISTORY_LOCK])
            current = cls.in_force(tool.name)
            if expected is not None and (current.pk if current else 0) != expected:
                raise MetadataConflict(current)
            wanted = cls(
                tool=tool.name, risk=risk, side_effect=side_effect, dedupes_by_key=dedupes_by_key
            )
            previous = current.overrides() if current else {}
            if wanted.overrides() == previous:
                return current, False
            before = {**own, **previous}
            after = {**own, **wanted.overrides()}
            looser = loosened(before, after)
            if looser and not confirmed:
                raise MetadataLoosened(looser, before, after)
            wanted.reason = reason
            wanted.tool_metadata = own
            wanted.before = before
            wanted.loosened = looser
            wanted.changed_by = user
            wanted.save()
            local_metadata.changed()
        return wanted, True


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


class NotificationChannel(models.Model):
    """Where a queue's notifications go: email addresses or an outgoing JSON webhook."""

    Kind = ChannelKind

    queue = models.CharField(max_length=100)
    kind = models.CharField(max_length=20, choices=Kind.choices)
    # Comma-separated addresses for email, an http(s) URL for a webhook.
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


class MetricCounts(models.Model):
    """What the metrics dashboard adds up with sum(), for one run (RunMetrics), or the ended runs
    that started in one day (MetricsDay) or hour (MetricsHour): flags and tallies, and the tool
    tallies as three parallel arrays (tool, failure class or "" for attempts, count). See
    approvals.metrics for each column's definition.
    """

    runs = models.IntegerField()
    finished = models.IntegerField()
    succeeded = models.IntegerField()
    faulted_finished = models.IntegerField()
    auto_recovered = models.IntegerField()
    human_stepped_in = models.IntegerField()
    takeovers = models.IntegerField()
    runs_taken_over = models.IntegerField()
    second_intervention = models.IntegerField()
    failed_steps = models.IntegerField()
    recovered = models.IntegerField()
    recovered_locally = models.IntegerField()
    tool_calls = models.IntegerField()
    tool_failures = models.IntegerField()
    steps_committed = models.IntegerField()
    steps_duplicated = models.IntegerField()
    steps_resent = models.IntegerField()
    wrong_retries = models.IntegerField()
    committed = models.IntegerField()
    covered = models.IntegerField()
    snapshots = models.IntegerField()
    missing = models.IntegerField()
    settled = models.IntegerField()
    expired = models.IntegerField()
    decided = models.IntegerField()
    # Recoveries that went to a person because metadata was missing, by cause
    # (runs.models.RecoveryCause); takeover cost; duplicates after a resume.
    recovery_missing_workflow = models.IntegerField(default=0)
    recovery_missing_step = models.IntegerField(default=0)
    recovery_missing_wait = models.IntegerField(default=0)
    takeovers_ended = models.IntegerField(default=0)
    takeover_actions = models.IntegerField(default=0)
    takeovers_answered = models.IntegerField(default=0)
    takeovers_needing_engineer = models.IntegerField(default=0)
    resumes = models.IntegerField(default=0)
    resumes_with_duplicate = models.IntegerField(default=0)
    duplicates_after_resume = models.IntegerField(default=0)
    tool_names = ArrayField(models.TextField())
    tool_classes = ArrayField(models.TextField())
    tool_counts = ArrayField(models.IntegerField())

    class Meta:
        abstract = True


class MetricSums(MetricCounts):
    """A run's counts and every one of its durations (a few per run), by kind."""

    close_s = ArrayField(models.FloatField())
    recover_s = ArrayField(models.FloatField())
    resume_s = ArrayField(models.FloatField())
    handling_s = ArrayField(models.FloatField())
    latency_ms = ArrayField(models.FloatField())
    takeover_s = ArrayField(models.FloatField(), default=list)

    class Meta:
        abstract = True


class PeriodSums(MetricCounts):
    """The counts of a day's or an hour's ended runs, and their durations as a sketch: how many
    fell in each log bucket of 1 % (approvals/metrics/sketch.py), per kind of duration (its
    index in VALUE_FIELDS), as three parallel arrays sorted by kind and bucket. Sketches add up
    bucket by bucket, so a window's medians come from a few thousand counts, not from every
    duration."""

    sketch_kinds = ArrayField(models.SmallIntegerField())
    sketch_bins = ArrayField(models.IntegerField())
    sketch_counts = ArrayField(models.IntegerField())

    class Meta:
        abstract = True


SUM_FIELDS = [f.name for f in MetricCounts._meta.fields if isinstance(f, models.IntegerField)]
VALUE_FIELDS = ["close_s", "recover_s", "resume_s", "handling_s", "latency_ms", "takeover_s"]
TOOL_FIELDS = ["tool_names", "tool_classes", "tool_counts"]
SKETCH_FIELDS = ["sketch_kinds", "sketch_bins", "sketch_counts"]


class RunMetrics(MetricSums):
    """One run's figures, stored (`approvals.metrics.rollup`).

    An ended run never changes again and a parked one rarely does, so their figures are worked
    out once, after the run has been still for a minute (`manage.py rollup_metrics`, or the
    beat task), and the dashboard adds these rows up instead of re-reading the timeline. Runs
    without a current row (moving, or not rolled up yet) are computed live by the same SQL.
    """

    run = models.OneToOneField(Run, primary_key=True, on_delete=models.CASCADE, related_name="+")
    created_at = models.DateTimeField()  # the run's, for the window
    finished_at = models.DateTimeField(null=True)  # the run's, for the rollup's high-water mark
    # The run's timeline head when this row was computed. Every change of a run appends an
    # event (principle 5), so a row whose event_seq is not the run's is stale and not used.
    event_seq = models.PositiveIntegerField()
    status = models.CharField(max_length=20)
    computed_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [
            models.Index(fields=["created_at"], name="runmetrics_created_idx"),
            models.Index(fields=["finished_at"], name="runmetrics_finished_idx"),
            # Open runs' rows, which no day row sums.
            models.Index(
                fields=["created_at"], name="runmetrics_open_idx", condition=Q(finished=0)
            ),
        ]

    def __str__(self) -> str:
        return f"metrics of run {self.run_id}"


class MetricsDay(PeriodSums):
    """The sums of the stored rows of the runs that started on one day (in `tz`) and have ended.

    Rebuilt by the rollup in the same transaction as any row it stores for such a run, and
    when the day is over; the dashboard reads it for every whole past day of a window.
    """

    tz = models.CharField(max_length=64)
    day = models.DateField()
    computed_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tz", "day"], name="metricsday_unique")]

    def __str__(self) -> str:
        return f"metrics of {self.day} ({self.tz})"


class MetricsHour(PeriodSums):
    """The same sums for the ended runs that started in one hour (`hour`, its start). The
    dashboard reads them for the whole past hours of a window that no day row covers: the 24 h
    window, and the first and last days of the others."""

    hour = models.DateTimeField(unique=True)
    computed_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"metrics of the hour from {self.hour:%Y-%m-%d %H:%M} UTC"


class MetricsCounter(models.Model):
    """An all-time count behind /metrics, over the runs that ended before
    MetricsCounterMark.through: runs by workflow and final status, side effects committed and
    compensated by tool, failed tool attempts by tool and class. The rollup adds the runs that
    ended since, once each, and moves the mark; a scrape adds only what ended after it."""

    family = models.CharField(max_length=32)  # "runs", "committed", "compensated", "failures"
    name = models.CharField(max_length=200)  # the workflow or the tool
    detail = models.CharField(max_length=50, blank=True)  # the status or the failure class
    value = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["family", "name", "detail"], name="metricscounter_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.family}{{{self.name},{self.detail}}} = {self.value}"


class MetricsCounterMark(models.Model):
    """How far MetricsCounter has counted: every run that ended before `through` (one row)."""

    name = models.CharField(max_length=32, unique=True, default="counters")
    through = models.DateTimeField()


class ClaimHeld(Exception):
    """Someone else holds the run's soft claim (`claim` is theirs)."""

    def __init__(self, claim: SoftClaim):
        super().__init__(f"run {claim.run_id} is claimed by {claim.user}")
        self.claim = claim


class SoftClaim(models.Model):
    """“I'll handle it”: a person says, for a few minutes, that they are working a run, so that
    two people do not work the same one (approvals/live.py shows it on the run page and inbox).

    Advisory, not a lock: anyone who may act still can (after confirming a warning); the hard
    guards stay the takeover and the run's version check. So a claim is not a state change of
    the run: it never bumps Run.lock_version and writes no timeline event (who decided what is
    in HumanDecision). One row per run, kept after release or expiry (expires_at in the past),
    so `changed_at` only moves forward: the live pages' stamp is max(changed_at).
    """

    run = models.OneToOneField(Run, on_delete=models.CASCADE, related_name="soft_claim")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    claimed_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    changed_at = models.DateTimeField(db_index=True)

    def __str__(self) -> str:
        return f"{self.user} handles {self.run_id} until {self.expires_at:%H:%M:%S}"

    def is_active(self, now=None) -> bool:
        return self.expires_at > (now or timezone.now())

    def minutes_left(self, now=None) -> int:
        seconds = (self.expires_at - (now or timezone.now())).total_seconds()
        return max(1, int(-(-seconds // 60))) if seconds > 0 else 0

    @classmethod
    def claim(cls, run: Run, user, *, minutes: int) -> SoftClaim:
        """Claim `run` for `user` for `minutes` (or extend their own claim by as much from now).

        Serialised on the run's row lock (as every change to one run is, runs/models/run.py
        Run.lock), so two people pressing “I'll handle it” at once get one claim and one
        ClaimHeld. A finished run cannot be claimed (InvalidTransition)."""
        now = timezone.now()
        with transaction.atomic():
            Run.lock(run.pk)
            status = Run.objects.filter(pk=run.pk).values_list("status", flat=True).first()
            if status is None or status in Run.TERMINAL:
                raise InvalidTransition("run", run.pk, status, "claimed")
            claim = cls.objects.filter(run_id=run.pk).select_related("user").first()
            if claim and claim.is_active(now) and claim.user_id != user.pk:
                raise ClaimHeld(claim)
            if claim is None:
                claim = cls(run_id=run.pk)
            if not (claim.pk and claim.is_active(now)):
                claim.claimed_at = now
            claim.user = user
            claim.expires_at = now + timedelta(minutes=minutes)
            claim.changed_at = now
            claim.save()
            return claim

    @classmethod
    def release(cls, run: Run, user, *, admin: bool = False) -> bool:
        """End `user`'s claim on `run` now (an admin may end anyone's). False: nothing to end."""
        now = timezone.now()
        mine = Q() if admin else Q(user=user)
        ended = cls.objects.filter(mine, run_id=run.pk, expires_at__gt=now).update(
            expires_at=now, changed_at=now
        )
        return bool(ended)


def known_queues() -> list[str]:
    """The queues people work from: the escalation rules', the approval steps' of registered
    workflows and the notification channels' (no scan of the runs)."""
    from runs import workflows as workflow_registry

    channels = NotificationChannel.objects.order_by().values_list("queue", flat=True)
    rules = EscalationRule.objects.order_by().values_list("queue", flat=True)
    queues = set(rules.union(channels).order_by())  # one query
    for definition in workflow_registry.all_workflows():
        queues.update(s.queue for s in definition.steps if s.kind == "approval")
    return sorted(q for q in queues if q)


def routed_queues() -> set[str]:
    """The queues runs can be sent to: the rules' (and their SLA's next queue), the approval
    steps' of registered workflows, and the engine's own `ops` and `support`."""
    from runs import workflows as workflow_registry

    rules = EscalationRule.objects.order_by().values_list("queue", "escalate_to")
    queues = {"ops", "support", *(q for pair in rules for q in pair)}
    for definition in workflow_registry.all_workflows():
        queues.update(s.queue for s in definition.steps if s.kind == "approval")
    return {q for q in queues if q}


from approvals.models.bulk import BulkAction, BulkActionItem  # noqa: E402, F401
from approvals.models.records import AuditRecord, AuditRecordHead  # noqa: E402, F401

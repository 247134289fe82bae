"""Approval requests, takeovers and every human decision (sealed)."""

from __future__ import annotations

import contextlib
from typing import Any

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models, transaction
from django.db.models import F, Q
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from runs import tools as tool_registry
from runs.conditions import describe as describe_condition
from runs.models import (
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
from runs.people import Approval
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

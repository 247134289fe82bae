"""The durable data model: runs, steps, snapshots, the side-effect ledger, waits and the timeline.

Every status column has a check constraint and a transition table; a transition is a conditional
UPDATE (compare-and-set on the current status) that writes its timeline event in the same
transaction, so two concurrent callers can never both win and no state change goes unrecorded.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, models, transaction
from django.db.models import F, Q
from django.utils import timezone
from django.utils.translation import gettext_lazy as _


class TransitionError(Exception):
    """A state change that is not allowed from the row's current state."""


class InvalidTransition(TransitionError):
    def __init__(self, model: str, pk: Any, current: str, target: str):
        self.current, self.target = current, target
        super().__init__(f"{model} {pk}: cannot go from {current!r} to {target!r}")


class ConcurrentUpdate(TransitionError):
    """Someone else changed the row first (version or lease no longer matches)."""


class ImmutableRecord(Exception):
    """Snapshots and timeline events are written once and never changed."""


def canonical_json(value: Any) -> str:
    """The one serialisation used for checksums and hashes: sorted keys, no spaces, UTF-8."""
    return json.dumps(
        value, cls=DjangoJSONEncoder, sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )


def to_json_value(value: Any) -> Any:
    """Normalise to plain JSON types so the stored value and its hash agree after a round trip."""
    return json.loads(canonical_json(value))


def digest(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


def _choices_check(field: str, choices: type[models.TextChoices], name: str):
    return models.CheckConstraint(condition=Q(**{f"{field}__in": choices.values}), name=name)


def _sources(table: dict[str, set[str]], target: str) -> list[str]:
    return [source for source, targets in table.items() if target in targets]


class ImmutableQuerySet(models.QuerySet):
    def update(self, **kwargs):
        raise ImmutableRecord(f"{self.model.__name__} rows cannot be updated")

    def delete(self):
        raise ImmutableRecord(f"{self.model.__name__} rows cannot be deleted")


class ImmutableModel(models.Model):
    objects = ImmutableQuerySet.as_manager()

    class Meta:
        abstract = True

    def save(self, *args, **kwargs):
        if not self._state.adding:
            raise ImmutableRecord(f"{type(self).__name__} {self.pk} cannot be changed")
        kwargs["force_insert"] = True
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise ImmutableRecord(f"{type(self).__name__} {self.pk} cannot be deleted")


# --------------------------------------------------------------------------------------------
# Failure classes and step kinds (shared vocabulary of tools, the router and the console)


# The labels of these two are shown in the console (rule chips, the tester, risk badges), so
# they are translatable (locale/; makemessages reads runs/models.py).
class FailureClass(models.TextChoices):
    TRANSIENT = "transient", _("Transient (retryable)")
    OUTAGE = "outage", _("External outage")
    INVALID_INPUT = "invalid_input", _("Invalid input (data uncertainty)")
    PERMISSION = "permission", _("Permission denied")
    UNKNOWN_OUTCOME = "unknown_outcome", _("Unknown outcome (side-effect boundary)")
    # Not a tool error: a wait or approval reached its deadline undecided.
    TIMEOUT = "timeout", _("Wait timed out")


class Risk(models.TextChoices):
    LOW = "low", _("Low")
    MEDIUM = "medium", _("Medium")
    HIGH = "high", _("High")


class StepKind(models.TextChoices):
    COMPUTE = "compute", "Compute"
    READ = "read", "Read"
    SIDE_EFFECT = "side_effect", "Side effect"
    APPROVAL = "approval", "Approval"
    WAIT_EVENT = "wait_event", "Wait for event"
    WAIT_TIMER = "wait_timer", "Wait for timer"


# --------------------------------------------------------------------------------------------
# Run


class RunStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    RUNNING = "running", "Running"
    WAITING = "waiting", "Waiting"
    NEEDS_HUMAN = "needs_human", "Needs a person"
    TAKEN_OVER = "taken_over", "Taken over"
    COMPENSATING = "compensating", "Compensating"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"
    COMPENSATED = "compensated", "Compensated"


class Run(models.Model):
    Status = RunStatus

    S = Status
    TERMINAL = frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED, S.COMPENSATED})
    # Runs the engine may advance without anyone's help.
    RUNNABLE = frozenset({S.PENDING, S.RUNNING, S.COMPENSATING})
    # Runs parked for a person (the console inbox).
    HUMAN = frozenset({S.NEEDS_HUMAN, S.TAKEN_OVER})
    TRANSITIONS: dict[str, set[str]] = {
        S.PENDING: {S.RUNNING, S.NEEDS_HUMAN, S.FAILED, S.CANCELLED},
        S.RUNNING: {
            S.WAITING,
            S.NEEDS_HUMAN,
            S.TAKEN_OVER,
            S.COMPENSATING,
            S.SUCCEEDED,
            S.FAILED,
            S.CANCELLED,
        },
        S.WAITING: {S.RUNNING, S.NEEDS_HUMAN, S.TAKEN_OVER, S.COMPENSATING, S.CANCELLED, S.FAILED},
        S.NEEDS_HUMAN: {
            S.RUNNING,
            S.TAKEN_OVER,
            S.COMPENSATING,
            S.SUCCEEDED,
            S.FAILED,
            S.CANCELLED,
        },
        S.TAKEN_OVER: {
            S.RUNNING,
            S.NEEDS_HUMAN,
            S.COMPENSATING,
            S.SUCCEEDED,
            S.FAILED,
            S.CANCELLED,
        },
        S.COMPENSATING: {S.COMPENSATED, S.NEEDS_HUMAN, S.TAKEN_OVER, S.FAILED},
        S.SUCCEEDED: set(),
        S.FAILED: set(),
        S.CANCELLED: set(),
        S.COMPENSATED: set(),
    }

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    workflow = models.CharField(max_length=100)
    workflow_version = models.PositiveIntegerField()
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.PENDING)
    stage = models.CharField(max_length=100, blank=True, default="")
    input = models.JSONField(default=dict, encoder=DjangoJSONEncoder)
    # sha256 of the canonical input: the "input snapshot ref" rehydration points at.
    input_digest = models.CharField(max_length=64)
    business_key = models.CharField(max_length=200, null=True, blank=True, unique=True)
    # Who the run acts for and with which scopes; copied into every snapshot.
    principal = models.CharField(max_length=200, default="system")
    scopes = models.JSONField(default=list, blank=True)
    session_context_ref = models.CharField(max_length=200, blank=True, default="")
    failure_count = models.PositiveIntegerField(default=0)
    escalation_level = models.PositiveIntegerField(default=0)
    queue = models.CharField(max_length=100, blank=True, default="")
    attention_reason = models.TextField(blank=True, default="")
    attention_due_at = models.DateTimeField(null=True, blank=True)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="owned_runs",
    )
    result = models.JSONField(null=True, blank=True, encoder=DjangoJSONEncoder)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    lock_version = models.PositiveIntegerField(default=0)
    # Head of the hash-chained timeline, so appending an event needs no extra read.
    event_seq = models.PositiveIntegerField(default=0)
    event_hash = models.CharField(max_length=64, default="")

    class Meta:
        constraints = [_choices_check("status", RunStatus, "run_status_valid")]
        indexes = [
            models.Index(
                fields=["attention_due_at", "created_at"],
                name="run_inbox_idx",
                condition=Q(status__in=["needs_human", "taken_over"]),
            ),
            models.Index(
                fields=["updated_at"],
                name="run_runnable_idx",
                condition=Q(status__in=["pending", "running", "compensating"]),
            ),
            models.Index(fields=["workflow", "status", "-created_at"], name="run_workflow_idx"),
            models.Index(fields=["status", "-created_at"], name="run_status_idx"),
            # Newest first, with the id as tie-breaker: keyset pagination (API cursors, run list).
            models.Index(fields=["-created_at", "-id"], name="run_created_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.workflow}@{self.workflow_version} {self.id} ({self.status})"

    @property
    def is_terminal(self) -> bool:
        return self.status in self.TERMINAL

    # -- locking ---------------------------------------------------------------------------
    @staticmethod
    def lock(run_id, *, skip_locked: bool = False) -> bool:
        """Lock the run's row until the end of the current transaction.

        The lock order, everywhere: a transaction that changes a run locks its Run row first,
        then its Step rows, then SideEffect, Wait, ApprovalRequest and InboundEvent rows. Every
        transaction touching one run is then serialised on the Run row and none can hold a step
        while waiting for the run (the deadlock between an API cancel and a worker recording an
        outcome). `TimelineEvent.append` locks the run row too, so appending the event first
        also takes the lock in order. With `skip_locked`, returns False instead of waiting.
        """
        sql = "SELECT 1 FROM runs_run WHERE id = %s FOR UPDATE"
        with connection.cursor() as cursor:
            cursor.execute(sql + (" SKIP LOCKED" if skip_locked else ""), [run_id])
            return cursor.fetchone() is not None

    # -- timeline --------------------------------------------------------------------------
    def record(self, verb: str, data: dict | None = None, *, actor: str = "system"):
        return TimelineEvent.append(self.pk, verb, data or {}, actor=actor)

    # -- transitions -----------------------------------------------------------------------
    def transition(
        self,
        target: str,
        *,
        verb: str,
        data: dict | None = None,
        actor: str = "system",
        expected_version: int | None = None,
        **fields: Any,
    ) -> None:
        """Move the run to `target`.

        1. Conditional UPDATE: only from a status that may go to `target` (and, when given, only
           at `expected_version`, so a console user acting on a stale page loses cleanly).
        2. Bump lock_version and updated_at; set finished_at on terminal states.
        3. Append the timeline event in the same transaction.
        """
        now = timezone.now()
        updates: dict[str, Any] = {"status": target, "updated_at": now, **fields}
        if target in self.TERMINAL:
            updates["finished_at"] = now
        filters: dict[str, Any] = {"pk": self.pk, "status__in": _sources(self.TRANSITIONS, target)}
        if expected_version is not None:
            filters["lock_version"] = expected_version
        # No savepoint (a round trip each); a refused change writes nothing and raises only
        # after the block, so a caller's transaction stays usable.
        with transaction.atomic(savepoint=False):
            count = Run.objects.filter(**filters).update(
                lock_version=F("lock_version") + 1, **updates
            )
            if count:
                event_data = {"from": self.status, "to": target, **(data or {})}
                self.record(verb, event_data, actor=actor)
        if count == 0:
            row = Run.objects.filter(pk=self.pk).values_list("status", "lock_version").first()
            if row is None:
                raise Run.DoesNotExist(self.pk)
            if row[0] in filters["status__in"]:
                raise ConcurrentUpdate(f"run {self.pk} changed (version {row[1]})")
            raise InvalidTransition("run", self.pk, row[0], target)
        for name, value in updates.items():
            setattr(self, name, value)
        self.lock_version = (
            expected_version if expected_version is not None else self.lock_version
        ) + 1

    def start(self) -> None:
        self.transition(self.Status.RUNNING, verb="run.started")

    def wait(self, reason: str) -> None:
        self.transition(self.Status.WAITING, verb="run.waiting", data={"reason": reason})

    def resume(self, *, actor: str = "system", reason: str = "") -> None:
        self.transition(
            self.Status.RUNNING,
            verb="run.resumed",
            data={"reason": reason},
            actor=actor,
            attention_reason="",
            attention_due_at=None,
        )

    def ask_human(
        self, reason: str, *, queue: str, due_at=None, failure_class: str = "", actor="system"
    ) -> None:
        self.transition(
            self.Status.NEEDS_HUMAN,
            verb="run.needs_human",
            data={"reason": reason, "queue": queue, "failure_class": failure_class},
            actor=actor,
            attention_reason=reason,
            queue=queue,
            attention_due_at=due_at,
        )

    def take_over(self, user, *, expected_version: int | None = None) -> None:
        self.transition(
            self.Status.TAKEN_OVER,
            verb="run.taken_over",
            actor=f"user:{user.get_username()}",
            expected_version=expected_version,
            owner=user,
        )

    def release(self, user, *, expected_version: int | None = None) -> None:
        self.transition(
            self.Status.NEEDS_HUMAN,
            verb="run.released",
            actor=f"user:{user.get_username()}",
            expected_version=expected_version,
            owner=None,
        )

    def begin_compensation(self, reason: str, *, actor: str = "system") -> None:
        self.transition(
            self.Status.COMPENSATING,
            verb="run.compensating",
            data={"reason": reason},
            actor=actor,
        )

    def succeed(self, result: Any = None) -> None:
        self.transition(
            self.Status.SUCCEEDED,
            verb="run.succeeded",
            result=to_json_value(result),
            attention_reason="",
            attention_due_at=None,
        )

    def fail(self, reason: str, *, actor: str = "system") -> None:
        self.transition(
            self.Status.FAILED,
            verb="run.failed",
            data={"reason": reason},
            actor=actor,
            attention_reason=reason,
            attention_due_at=None,
        )

    def cancel(self, reason: str, *, actor: str = "system", expected_version=None) -> None:
        self.transition(
            self.Status.CANCELLED,
            verb="run.cancelled",
            data={"reason": reason},
            actor=actor,
            expected_version=expected_version,
            attention_reason=reason,
            attention_due_at=None,
        )

    def mark_compensated(self) -> None:
        self.transition(
            self.Status.COMPENSATED,
            verb="run.compensated",
            attention_reason="",
            attention_due_at=None,
        )

    # -- reading -----------------------------------------------------------------------------
    def rehydration(self) -> dict:
        from runs.rehydration import rehydration_document

        return rehydration_document(self)


# --------------------------------------------------------------------------------------------
# Step


class StepStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    DEGRADED = "degraded", "Degraded (fallback used)"
    RETRY_SCHEDULED = "retry_scheduled", "Retry scheduled"
    WAITING = "waiting", "Waiting"
    NEEDS_HUMAN = "needs_human", "Needs a person"
    UNKNOWN_OUTCOME = "unknown_outcome", "Outcome unknown"
    FAILED = "failed", "Failed"
    SKIPPED = "skipped", "Skipped"
    COMPENSATED = "compensated", "Compensated"


class Step(models.Model):
    Status = StepStatus

    S = Status
    DONE = frozenset({S.SUCCEEDED, S.DEGRADED, S.SKIPPED, S.COMPENSATED})
    FINISHED = DONE | {S.FAILED}
    UNFINISHED = frozenset(set(Status.values) - FINISHED)
    TRANSITIONS: dict[str, set[str]] = {
        S.PENDING: {S.RUNNING, S.SKIPPED, S.FAILED, S.NEEDS_HUMAN},
        S.RUNNING: {
            S.SUCCEEDED,
            S.DEGRADED,
            S.RETRY_SCHEDULED,
            S.WAITING,
            S.NEEDS_HUMAN,
            S.UNKNOWN_OUTCOME,
            S.FAILED,
            S.SKIPPED,
        },
        S.RETRY_SCHEDULED: {S.RUNNING, S.NEEDS_HUMAN, S.SKIPPED, S.FAILED},
        S.WAITING: {S.RUNNING, S.SUCCEEDED, S.NEEDS_HUMAN, S.SKIPPED, S.FAILED},
        S.NEEDS_HUMAN: {S.PENDING, S.RUNNING, S.SUCCEEDED, S.SKIPPED, S.FAILED},
        S.UNKNOWN_OUTCOME: {S.PENDING, S.SUCCEEDED, S.NEEDS_HUMAN, S.SKIPPED, S.FAILED},
        S.SUCCEEDED: {S.COMPENSATED},
        S.DEGRADED: set(),
        S.FAILED: set(),
        S.SKIPPED: set(),
        S.COMPENSATED: set(),
    }

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="steps")
    name = models.CharField(max_length=150)
    iteration = models.PositiveIntegerField(default=0)
    position = models.PositiveIntegerField()
    kind = models.CharField(max_length=20, choices=StepKind.choices)
    stage = models.CharField(max_length=100, blank=True, default="")
    tool = models.CharField(max_length=150, blank=True, default="")
    # For steps decided at run time (agent loops, compensations): everything needed to execute
    # them again without recomputing the decision. Empty for steps declared in the workflow.
    spec = models.JSONField(default=dict, blank=True, encoder=DjangoJSONEncoder)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    error_class = models.CharField(max_length=20, blank=True, default="")
    last_error = models.TextField(blank=True, default="")
    result = models.JSONField(null=True, blank=True, encoder=DjangoJSONEncoder)
    idempotency_key = models.CharField(max_length=255, blank=True, default="")
    # Which escalation rule (id, version, name, action) routed the last failure.
    routing = models.JSONField(default=dict, blank=True)
    lease_owner = models.CharField(max_length=200, blank=True, default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            _choices_check("status", StepStatus, "step_status_valid"),
            _choices_check("kind", StepKind, "step_kind_valid"),
            models.UniqueConstraint(
                fields=["run", "name", "iteration"], name="step_unique_name_iteration"
            ),
            models.UniqueConstraint(fields=["run", "position"], name="step_unique_position"),
        ]
        indexes = [
            models.Index(
                fields=["next_attempt_at"],
                name="step_due_idx",
                condition=Q(status__in=["retry_scheduled", "waiting"]),
            ),
            models.Index(
                fields=["lease_expires_at"],
                name="step_lease_idx",
                condition=Q(status="running"),
            ),
            models.Index(fields=["tool", "status"], name="step_tool_idx"),
        ]
        ordering = ["run", "position"]

    def __str__(self) -> str:
        return f"{self.name}#{self.iteration} ({self.status})"

    @property
    def is_done(self) -> bool:
        return self.status in self.DONE

    def transition(
        self,
        target: str,
        *,
        verb: str,
        data: dict | None = None,
        actor: str = "system",
        held_by: str | None = None,
        **fields: Any,
    ) -> None:
        """Move the step to `target` with a compare-and-set on its status (and, for a worker
        finishing its own attempt, on its lease: `held_by`), and record the event on the run's
        timeline."""
        now = timezone.now()
        updates: dict[str, Any] = {"status": target, **fields}
        if target in self.FINISHED:
            updates.setdefault("finished_at", now)
        if target != self.Status.RUNNING:
            updates.setdefault("lease_owner", "")
            updates.setdefault("lease_expires_at", None)
        filters: dict[str, Any] = {
            "pk": self.pk,
            "status__in": _sources(self.TRANSITIONS, target),
        }
        if held_by is not None:
            filters["lease_owner"] = held_by
        own_transaction = not connection.in_atomic_block
        with transaction.atomic(savepoint=False):
            if own_transaction:
                Run.lock(self.run_id)  # the lock order; a caller's transaction took it already
            count = Step.objects.filter(**filters).update(**updates)
            if count:
                event = {"step": self.name, "iteration": self.iteration, "from": self.status}
                event.update({"to": target, **(data or {})})
                TimelineEvent.append(self.run_id, verb, event, actor=actor)
        if count == 0:
            row = Step.objects.filter(pk=self.pk).values_list("status", flat=True).first()
            if row is None:
                raise Step.DoesNotExist(self.pk)
            if row in filters["status__in"]:
                raise ConcurrentUpdate(f"step {self.pk} is leased by someone else")
            raise InvalidTransition("step", self.pk, row, target)
        for name, value in updates.items():
            setattr(self, name, value)


# --------------------------------------------------------------------------------------------
# Snapshot: the structured record written before every side effect.

# Every field the first seed article lists; a snapshot names the ones it could not fill.
SNAPSHOT_FIELDS = (
    "run_id",
    "session_context_ref",
    "tool",
    "params",
    "target_resource",
    "permissions",
    "prior_results_summary",
    "stage",
    "idempotency_key",
)


class Snapshot(ImmutableModel):
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="snapshots")
    step = models.ForeignKey(Step, on_delete=models.PROTECT, related_name="snapshots")
    attempt = models.PositiveIntegerField()
    workflow_version = models.PositiveIntegerField()
    stage = models.CharField(max_length=100, blank=True, default="")
    tool = models.CharField(max_length=150)
    params = models.JSONField(encoder=DjangoJSONEncoder)
    target_resource = models.CharField(max_length=500, blank=True, default="")
    permissions = models.JSONField(default=dict)
    prior_results_summary = models.JSONField(default=dict, encoder=DjangoJSONEncoder)
    session_context_ref = models.CharField(max_length=200, blank=True, default="")
    idempotency_key = models.CharField(max_length=255)
    missing_fields = models.JSONField(default=list)
    checksum = models.CharField(max_length=64)
    # Retention dropped the payload (params, prior results); the checksum stays as its proof.
    pruned = models.BooleanField(default=False)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [models.Index(fields=["idempotency_key"], name="snapshot_key_idx")]

    def __str__(self) -> str:
        return f"snapshot {self.pk} {self.tool} key={self.idempotency_key}"

    def content(self) -> dict:
        return {
            "run_id": str(self.run_id),
            "step_id": self.step_id,
            "attempt": self.attempt,
            "workflow_version": self.workflow_version,
            "stage": self.stage,
            "tool": self.tool,
            "params": self.params,
            "target_resource": self.target_resource,
            "permissions": self.permissions,
            "prior_results_summary": self.prior_results_summary,
            "session_context_ref": self.session_context_ref,
            "idempotency_key": self.idempotency_key,
            "missing_fields": self.missing_fields,
        }

    def compute_checksum(self) -> str:
        return digest(self.content())

    def save(self, *args, **kwargs):
        self.params = to_json_value(self.params)
        self.prior_results_summary = to_json_value(self.prior_results_summary)
        self.checksum = self.compute_checksum()
        super().save(*args, **kwargs)


# --------------------------------------------------------------------------------------------
# SideEffect: the ledger. One row per idempotency key.


class SideEffectStatus(models.TextChoices):
    INTENDED = "intended", "Intended (about to be sent)"
    COMMITTED = "committed", "Committed"
    UNKNOWN = "unknown", "Outcome unknown"
    NOT_COMMITTED = "not_committed", "Not committed"
    COMPENSATED = "compensated", "Compensated"


class SideEffect(models.Model):
    Status = SideEffectStatus

    S = Status
    TRANSITIONS: dict[str, set[str]] = {
        S.INTENDED: {S.COMMITTED, S.NOT_COMMITTED, S.UNKNOWN},
        S.UNKNOWN: {S.COMMITTED, S.NOT_COMMITTED},
        # A new attempt with the same key, once the previous one is known not to have landed.
        S.NOT_COMMITTED: {S.INTENDED},
        S.COMMITTED: {S.COMPENSATED},
        S.COMPENSATED: set(),
    }

    idempotency_key = models.CharField(max_length=255, unique=True)
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="side_effects")
    step = models.ForeignKey(Step, on_delete=models.PROTECT, related_name="side_effects")
    snapshot = models.ForeignKey(Snapshot, on_delete=models.PROTECT, related_name="+")
    tool = models.CharField(max_length=150)
    target = models.CharField(max_length=500, blank=True, default="")
    # Checksum of the parameters the key was first used with: the same key with other
    # parameters is an error, never a second call.
    params_checksum = models.CharField(max_length=64)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.INTENDED)
    external_id = models.CharField(max_length=255, blank=True, default="")
    receipt = models.JSONField(default=dict, blank=True, encoder=DjangoJSONEncoder)
    # "tool", "reconcile" (lookup by key) or "user:<name>".
    confirmed_by = models.CharField(max_length=200, blank=True, default="")
    compensation_key = models.CharField(max_length=255, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)
    # When the latest attempt was about to be sent: a "not found" answer by key is only trusted
    # once the system can no longer be processing that request (the tool's settle window).
    attempted_at = models.DateTimeField(default=timezone.now)
    committed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [_choices_check("status", SideEffectStatus, "side_effect_status_valid")]
        indexes = [
            models.Index(fields=["run", "created_at"], name="side_effect_run_idx"),
            models.Index(fields=["tool", "status"], name="side_effect_tool_idx"),
            models.Index(
                fields=["updated_at"],
                name="side_effect_open_idx",
                condition=Q(status__in=["intended", "unknown"]),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tool} {self.idempotency_key} ({self.status})"

    def transition(
        self,
        target: str,
        *,
        verb: str,
        data: dict | None = None,
        actor: str = "system",
        **fields: Any,
    ) -> None:
        now = timezone.now()
        updates: dict[str, Any] = {"status": target, "updated_at": now, **fields}
        if target == self.Status.COMMITTED:
            updates.setdefault("committed_at", now)
        if target == self.Status.INTENDED:
            updates.setdefault("attempted_at", now)
        own_transaction = not connection.in_atomic_block
        with transaction.atomic(savepoint=False):
            if own_transaction:
                Run.lock(self.run_id)  # the lock order; a caller's transaction took it already
            count = SideEffect.objects.filter(
                pk=self.pk, status__in=_sources(self.TRANSITIONS, target)
            ).update(**updates)
            if count:
                event = {"key": self.idempotency_key, "tool": self.tool, "from": self.status}
                event.update({"to": target, **(data or {})})
                TimelineEvent.append(self.run_id, verb, event, actor=actor)
        if count == 0:
            row = SideEffect.objects.filter(pk=self.pk).values_list("status", flat=True)
            raise InvalidTransition("side effect", self.pk, row.first() or "?", target)
        for name, value in updates.items():
            setattr(self, name, value)


# --------------------------------------------------------------------------------------------
# Wait: timers, awaited events, approvals and tool recoveries the run is parked on.


class WaitKind(models.TextChoices):
    EVENT = "event", "Event"
    TIMER = "timer", "Timer"
    APPROVAL = "approval", "Approval"
    TOOL_RECOVERY = "tool_recovery", "Tool recovery"


class WaitStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    RESOLVED = "resolved", "Resolved"
    EXPIRED = "expired", "Expired"
    CANCELLED = "cancelled", "Cancelled"


class Wait(models.Model):
    Kind = WaitKind

    Status = WaitStatus

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="waits")
    step = models.ForeignKey(Step, on_delete=models.CASCADE, related_name="waits")
    kind = models.CharField(max_length=20, choices=Kind.choices)
    event_type = models.CharField(max_length=150, blank=True, default="")
    correlation_key = models.CharField(max_length=255, blank=True, default="")
    due_at = models.DateTimeField(null=True, blank=True)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.PENDING)
    payload = models.JSONField(null=True, blank=True, encoder=DjangoJSONEncoder)
    resolved_by = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            _choices_check("status", WaitStatus, "wait_status_valid"),
            _choices_check("kind", WaitKind, "wait_kind_valid"),
            # One live wait per step.
            models.UniqueConstraint(
                fields=["step"], condition=Q(status="pending"), name="wait_one_pending_per_step"
            ),
        ]
        indexes = [
            models.Index(fields=["due_at"], name="wait_due_idx", condition=Q(status="pending")),
            models.Index(
                fields=["event_type", "correlation_key"],
                name="wait_event_idx",
                condition=Q(status="pending"),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} wait {self.pk} ({self.status})"


# --------------------------------------------------------------------------------------------
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


# --------------------------------------------------------------------------------------------
# TimelineEvent: append-only, hash-chained per run.


class TimelineEvent(ImmutableModel):
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="events")
    seq = models.PositiveIntegerField()
    at = models.DateTimeField()
    actor = models.CharField(max_length=200)
    verb = models.CharField(max_length=80)
    data = models.JSONField(default=dict, encoder=DjangoJSONEncoder)
    # The chain hashes the digest of the data, not the data: retention can drop a payload
    # (`pruned`) and the chain still verifies.
    data_digest = models.CharField(max_length=64)
    pruned = models.BooleanField(default=False)
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "seq"], name="timeline_run_seq")]
        indexes = [
            models.Index(fields=["verb", "at"], name="timeline_verb_idx"),
            models.Index(fields=["actor", "at"], name="timeline_actor_idx"),
        ]
        ordering = ["run", "seq"]

    def __str__(self) -> str:
        return f"{self.run_id}#{self.seq} {self.verb}"

    @staticmethod
    def compute_hash(seq: int, at, actor: str, verb: str, data_digest: str, prev_hash: str) -> str:
        material = canonical_json([seq, at.isoformat(), actor, verb, data_digest, prev_hash])
        return hashlib.sha256(material.encode()).hexdigest()

    @classmethod
    def append(cls, run_id, verb: str, data: dict, *, actor: str = "system") -> TimelineEvent:
        """Append an event to the run's chain.

        One round trip: a single statement locks the run row, reads the chain head, inserts the
        event with its hash and moves the head. PostgreSQL computes the hash over exactly the
        bytes `compute_hash` hashes (the seq and previous hash are spliced into the canonical
        JSON built here), so the chain verifies in Python. Callers are inside the transaction
        of the state change the event describes, so both commit or neither does.
        """
        at = timezone.now()
        data = to_json_value(data)
        data_digest = digest(data)
        # canonical_json([seq, at, actor, verb, digest, prev]) = "[" seq "," middle ',"' prev '"]'
        middle = canonical_json([at.isoformat(), actor, verb, data_digest])[1:-1]
        with connection.cursor() as cursor:
            cursor.execute(
                _APPEND_SQL,
                {
                    "run": run_id,
                    "at": at,
                    "actor": actor,
                    "verb": verb,
                    "data": canonical_json(data),
                    "digest": data_digest,
                    "middle": middle,
                },
            )
            row = cursor.fetchone()
        if row is None:
            raise Run.DoesNotExist(run_id)
        event_id, seq, prev_hash, event_hash = row
        event = cls(
            id=event_id,
            run_id=run_id,
            seq=seq,
            at=at,
            actor=actor,
            verb=verb,
            data=data,
            data_digest=data_digest,
            prev_hash=prev_hash,
            hash=event_hash,
        )
        event._state.adding = False
        event._state.db = "default"
        return event

    def recompute_hash(self) -> str:
        return self.compute_hash(
            self.seq, self.at, self.actor, self.verb, self.data_digest, self.prev_hash
        )


_APPEND_SQL = """
WITH head AS (
    SELECT event_seq + 1 AS seq, event_hash AS prev FROM runs_run WHERE id = %(run)s FOR UPDATE
), event AS (
    INSERT INTO runs_timelineevent
        (run_id, seq, at, actor, verb, data, data_digest, pruned, prev_hash, hash)
    SELECT %(run)s, head.seq, %(at)s, %(actor)s, %(verb)s, %(data)s::jsonb, %(digest)s, false,
        head.prev,
        encode(sha256(convert_to(
            '[' || head.seq || ',' || %(middle)s || ',"' || head.prev || '"]', 'UTF8')), 'hex')
    FROM head
    RETURNING id, seq, prev_hash, hash
)
UPDATE runs_run SET event_seq = event.seq, event_hash = event.hash, updated_at = %(at)s
FROM event WHERE runs_run.id = %(run)s
RETURNING event.id, event.seq, event.prev_hash, event.hash
"""


def verify_chain(events: Iterable[TimelineEvent]) -> tuple[bool, str]:
    """Walk one run's events in seq order; return (ok, message naming the first broken event)."""
    expected_prev, expected_seq = "", 1
    for event in events:
        if event.seq != expected_seq:
            return False, f"event seq {event.seq}: expected seq {expected_seq} (missing event)"
        if event.prev_hash != expected_prev:
            return False, f"event seq {event.seq}: prev_hash does not match the previous event"
        if not event.pruned and digest(event.data) != event.data_digest:
            return False, f"event seq {event.seq}: data does not match its digest"
        if event.recompute_hash() != event.hash:
            return False, f"event seq {event.seq}: content does not match its hash"
        expected_prev, expected_seq = event.hash, expected_seq + 1
    return True, "ok"


from runs.api_models import ApiClient  # noqa: E402,F401

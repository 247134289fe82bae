"""A run: its status machine, its lock, its stage and its verbs."""

from __future__ import annotations

import re
import uuid
from typing import Any

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, models, transaction
from django.db.models import F, Q
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from runs import statements
from runs.models.base import (
    ChoicesField,
    ConcurrentUpdate,
    InvalidTransition,
    RecoveryCause,
    _sources,
    db_json,
)
from runs.models.timeline import TimelineEvent
from runs.models.values import to_json_value
from runs.verbs import Verb

# --------------------------------------------------------------------------------------------
# Run


class RunStatus(models.TextChoices):
    PENDING = "pending", _("Pending")
    RUNNING = "running", _("Running")
    WAITING = "waiting", _("Waiting")
    NEEDS_HUMAN = "needs_human", _("Needs a person")
    TAKEN_OVER = "taken_over", _("Taken over")
    COMPENSATING = "compensating", _("Compensating")
    SUCCEEDED = "succeeded", _("Succeeded")
    FAILED = "failed", _("Failed")
    CANCELLED = "cancelled", _("Cancelled")
    COMPENSATED = "compensated", _("Compensated")


# A run id's beginning as lists show it (`0e911daf…`): at least its first 8 hex digits.
SHORT_ID = re.compile(r"^[0-9a-f]{8}[0-9a-f-]{0,28}…?$", re.IGNORECASE)


class RunQuerySet(models.QuerySet):
    def filtered(
        self,
        *,
        workflow: str = "",
        status: str = "",
        business_key: str = "",
        search: str = "",
        created_after=None,
        created_before=None,
    ) -> RunQuerySet:
        """The one run filter, newest first: the API's run list (runs.api.runs.list_runs) and
        the console's search (approvals.console.search_runs). Empty values filter nothing.
        `search` is a run id, a run id's beginning as lists show it, a business key or its
        beginning; `created_after` is inclusive, `created_before` exclusive (run_created_idx
        serves both, and the order)."""
        runs = self
        search = search.strip()
        if search:
            try:
                runs = runs.filter(Q(pk=uuid.UUID(search)) | Q(business_key=search))
            except ValueError:
                runs = runs.filter(_short_id(search) | Q(business_key__startswith=search))
        if workflow:
            runs = runs.filter(workflow=workflow)
        if status:
            runs = runs.filter(status=status)
        if business_key:
            runs = runs.filter(business_key=business_key)
        if created_after is not None:
            runs = runs.filter(created_at__gte=created_after)
        if created_before is not None:
            runs = runs.filter(created_at__lt=created_before)
        return runs.order_by("-created_at", "-id")


def _short_id(text: str) -> Q:
    """The ids from a short id's prefix up to the next one, a range the primary key's index
    serves. An empty Q matches nothing here: anything else is a business key's beginning."""
    digits = text.rstrip("…").replace("-", "").lower()
    if not SHORT_ID.match(text) or len(digits) > 32:
        return Q(pk__in=[])
    low = uuid.UUID(digits.ljust(32, "0"))
    high = uuid.UUID(digits.ljust(32, "f"))
    return Q(pk__gte=low, pk__lte=high)


class Run(models.Model):
    Status = RunStatus

    objects = RunQuerySet.as_manager()

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
    status = ChoicesField(
        max_length=20, choices=Status.choices, default=Status.PENDING, domain="runs_run_status"
    )
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
        # The status's allowed values: its domain (ChoicesField).
        indexes = [
            models.Index(
                fields=["attention_due_at", "created_at"],
                name="run_inbox_idx",
                condition=Q(status__in=["needs_human", "taken_over"]),
            ),
            # The sweeper's runnable runs. Keyed on created_at, not updated_at: the engine moves
            # updated_at with every transaction, and an update that changes no indexed column
            # stays on its page (HOT) without touching any index (runs/migrations/0011).
            models.Index(
                fields=["created_at"],
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
        sql = statements.LOCK_RUN_OR_SKIP if skip_locked else statements.LOCK_RUN
        with connection.cursor() as cursor:
            cursor.execute(sql, [run_id])
            return cursor.fetchone() is not None

    # -- timeline --------------------------------------------------------------------------
    def record(self, verb: str, data: dict | None = None, *, actor: str = "system"):
        return TimelineEvent.append(self.pk, verb, data or {}, actor=actor)

    # -- transitions -----------------------------------------------------------------------
    def _move(
        self,
        target: str,
        verb: Verb,
        *,
        data: dict | None = None,
        actor: str = "system",
        expected_version: int | None = None,
        now=None,
        into=None,
        **fields: Any,
    ) -> None:
        """Move the run to `target` (every verb below comes through here).

        1. Conditional UPDATE: only from a status that may go to `target` (and, when given, only
           at `expected_version`, so a console user acting on a stale page loses cleanly).
        2. Bump lock_version and updated_at; set finished_at on terminal states.
        3. Append the timeline event in the same transaction.

        `into` a batch (runs.batch: the engine's hot path), the same change is carried out by its
        one statement, whose compare-and-set on the run's row is on the chain head the worker
        holds and on the status the batch expects; nothing changes in memory (see Step._move).
        """
        now = now or timezone.now()
        updates: dict[str, Any] = {"status": target, "updated_at": now, **fields}
        if target in self.TERMINAL:
            updates["finished_at"] = now
        if into is not None:
            if into.run_status not in _sources(self.TRANSITIONS, target):
                raise InvalidTransition("run", self.pk, into.run_status, target)
            source = into.run_status
            del updates["updated_at"]  # the batch's time, with the chain head
            into.change_run(**{name: self._prepared(name, v) for name, v in updates.items()})
            into.bump_version()
            into.event(verb, {"from": source, "to": target, **(data or {})}, actor=actor)
            return
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
                self.record(verb, self.event_data(target, data), actor=actor)
        if count == 0:
            raise self._refusal(filters["status__in"], target)
        for name, value in updates.items():
            setattr(self, name, value)
        self.lock_version = (
            expected_version if expected_version is not None else self.lock_version
        ) + 1

    def _prepared(self, name: str, value: Any) -> Any:
        """A field's value as the ORM sends it (for a batch's raw statement): JSON as the ORM
        stores it, everything else as it is."""
        return db_json(value) if name in _JSON_FIELDS else value

    def _refusal(self, allowed, target: str) -> Exception:
        """Why a conditional UPDATE touched no row: the run is gone, it moved on while in an
        allowed state (its version changed), or its state does not allow `target`."""
        row = Run.objects.filter(pk=self.pk).values_list("status", "lock_version").first()
        if row is None:
            return Run.DoesNotExist(self.pk)
        if row[0] in allowed:
            return ConcurrentUpdate(f"run {self.pk} changed (version {row[1]})")
        return InvalidTransition("run", self.pk, row[0], target)

    def event_data(self, target: str, data: dict | None = None) -> dict:
        """What a transition's timeline event says (the one definition: the verbs and the
        engine's batched transactions, runs.engine.inline, write the same)."""
        return {"from": self.status, "to": target, **(data or {})}

    def start(self, *, into=None) -> None:
        self._move(self.Status.RUNNING, Verb.RUN_STARTED, into=into)

    def wait(self, reason: str) -> None:
        self._move(self.Status.WAITING, Verb.RUN_WAITING, data={"reason": reason})

    def resume(self, *, actor: str = "system", reason: str = "") -> None:
        self._move(
            self.Status.RUNNING,
            Verb.RUN_RESUMED,
            data={"reason": reason},
            actor=actor,
            attention_reason="",
            attention_due_at=None,
        )

    def ask_human(
        self,
        reason: str,
        *,
        queue: str,
        due_at=None,
        failure_class: str = "",
        actor="system",
        cause: str = "",
    ) -> None:
        """Park the run for a person. `cause` names, for the metrics, why the engine could not
        go on by itself when that is not a failure (RecoveryCause: metadata it needs is gone)."""
        data = {"reason": reason, "queue": queue, "failure_class": failure_class}
        if cause:
            data["cause"] = RecoveryCause(cause).value
        self._move(
            self.Status.NEEDS_HUMAN,
            Verb.RUN_NEEDS_HUMAN,
            data=data,
            actor=actor,
            attention_reason=reason,
            queue=queue,
            attention_due_at=due_at,
        )

    def take_over(self, user, *, expected_version: int | None = None) -> None:
        self._move(
            self.Status.TAKEN_OVER,
            Verb.RUN_TAKEN_OVER,
            actor=f"user:{user.get_username()}",
            expected_version=expected_version,
            owner=user,
        )

    def release(self, user, *, to: str = RunStatus.NEEDS_HUMAN, expected_version=None) -> None:
        """Give a taken-over run back: to the inbox (`needs_human`), or straight to the engine
        (`running`) or to its wait (`waiting`) when its step can go on without a person."""
        self._move(
            to,
            Verb.RUN_RELEASED,
            actor=f"user:{user.get_username()}",
            expected_version=expected_version,
            owner=None,
        )

    def breach_sla(self, *, queue: str, due_at, data: dict) -> TimelineEvent:
        """A person's SLA ran out: one escalation level up, maybe another queue and deadline,
        with `run.sla_breached` (no status change: the run stays with a person)."""
        Run.objects.filter(pk=self.pk).update(
            escalation_level=F("escalation_level") + 1,
            queue=queue,
            attention_due_at=due_at,
            updated_at=timezone.now(),
        )
        self.escalation_level += 1
        self.queue, self.attention_due_at = queue, due_at
        return self.record(Verb.RUN_SLA_BREACHED, data)

    def requeue(self, queue: str, *, actor: str, reason: str = "", expected_version=None) -> None:
        """A person hands a run that waits for a person to another queue (their inbox and
        notification channels), with `run.requeued`. Not a status change, but a change people
        act on: the version moves, so a page showing the old queue is stale."""
        filters: dict[str, Any] = {"pk": self.pk, "status": self.Status.NEEDS_HUMAN}
        if expected_version is not None:
            filters["lock_version"] = expected_version
        before, now = self.queue, timezone.now()
        with transaction.atomic(savepoint=False):
            count = Run.objects.filter(**filters).update(
                queue=queue, lock_version=F("lock_version") + 1, updated_at=now
            )
            if count:
                data = {"from_queue": before, "to_queue": queue, "reason": reason[:500]}
                self.record(Verb.RUN_REQUEUED, data, actor=actor)
        if count == 0:
            raise self._refusal({self.Status.NEEDS_HUMAN}, f"queue {queue}")
        self.queue, self.updated_at = queue, now
        self.lock_version = (
            expected_version if expected_version is not None else self.lock_version
        ) + 1

    def enter_stage(self, stage: str, *, into=None) -> None:
        """The run's current stage label (a step's `stage`); not a state change. `into` a batch,
        only when a stage is named and differs from the one this object holds."""
        if into is not None:
            if stage and stage != self.stage:
                into.change_run(stage=stage)
            return
        Run.objects.filter(pk=self.pk).update(stage=stage)
        self.stage = stage

    def count_failure(self, *, escalate: bool = False) -> None:
        """One more failed attempt (and, when it went to a person, one more escalation): the
        counters rehydration and the metrics read. Not a state change: no event of its own."""
        updates = {"failure_count": F("failure_count") + 1}
        if escalate:
            updates["escalation_level"] = F("escalation_level") + 1
        Run.objects.filter(pk=self.pk).update(**updates)

    def begin_compensation(self, reason: str, *, actor: str = "system") -> None:
        self._move(
            self.Status.COMPENSATING,
            Verb.RUN_COMPENSATING,
            data={"reason": reason},
            actor=actor,
        )

    def succeed(self, result: Any = None, *, now=None, into=None) -> None:
        self._move(
            self.Status.SUCCEEDED,
            Verb.RUN_SUCCEEDED,
            now=now,
            into=into,
            result=to_json_value(result),
            attention_reason="",
            attention_due_at=None,
        )

    def fail(self, reason: str, *, actor: str = "system") -> None:
        self._move(
            self.Status.FAILED,
            Verb.RUN_FAILED,
            data={"reason": reason},
            actor=actor,
            attention_reason=reason,
            attention_due_at=None,
        )

    def cancel(self, reason: str, *, actor: str = "system", expected_version=None) -> None:
        self._move(
            self.Status.CANCELLED,
            Verb.RUN_CANCELLED,
            data={"reason": reason},
            actor=actor,
            expected_version=expected_version,
            attention_reason=reason,
            attention_due_at=None,
        )

    def mark_compensated(self) -> None:
        self._move(
            self.Status.COMPENSATED,
            Verb.RUN_COMPENSATED,
            attention_reason="",
            attention_due_at=None,
        )


# The run's JSON columns (Run._prepared).
_JSON_FIELDS = frozenset(
    f.name for f in Run._meta.concrete_fields if isinstance(f, models.JSONField)
)

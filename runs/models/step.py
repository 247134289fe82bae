"""A step: its status machine, its lease and its verbs (and their batched forms); the waits
(timers, events, approvals, a tool's recovery) a step is parked on."""

from __future__ import annotations

from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, models, transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from runs.models.base import (
    LEASE_UNEXPIRED,
    ChoicesField,
    ConcurrentUpdate,
    InvalidTransition,
    Lease,
    StepKind,
    _choices_check,
    _sources,
)
from runs.models.run import Run
from runs.models.timeline import TimelineEvent
from runs.models.values import to_json_value
from runs.verbs import Verb

# --------------------------------------------------------------------------------------------
# Step


class StepStatus(models.TextChoices):
    PENDING = "pending", _("Pending")
    RUNNING = "running", _("Running")
    SUCCEEDED = "succeeded", _("Succeeded")
    DEGRADED = "degraded", _("Degraded (fallback used)")
    RETRY_SCHEDULED = "retry_scheduled", _("Retry scheduled")
    WAITING = "waiting", _("Waiting")
    NEEDS_HUMAN = "needs_human", _("Needs a person")
    UNKNOWN_OUTCOME = "unknown_outcome", _("Outcome unknown")
    FAILED = "failed", _("Failed")
    SKIPPED = "skipped", _("Skipped")
    COMPENSATED = "compensated", _("Compensated")


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

    # Indexed by step_unique_position (run, position): no index of its own to write per step.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="steps", db_index=False)
    name = models.CharField(max_length=150)
    iteration = models.PositiveIntegerField(default=0)
    position = models.PositiveIntegerField()
    kind = ChoicesField(max_length=20, choices=StepKind.choices, domain="runs_step_kind")
    stage = models.CharField(max_length=100, blank=True, default="")
    tool = models.CharField(max_length=150, blank=True, default="")
    # For steps decided at run time (agent loops, compensations): everything needed to execute
    # them again without recomputing the decision. Empty for steps declared in the workflow.
    spec = models.JSONField(default=dict, blank=True, encoder=DjangoJSONEncoder)
    status = ChoicesField(
        max_length=20, choices=Status.choices, default=Status.PENDING, domain="runs_step_status"
    )
    attempts = models.PositiveIntegerField(default=0)
    error_class = models.CharField(max_length=20, blank=True, default="")
    last_error = models.TextField(blank=True, default="")
    result = models.JSONField(null=True, blank=True, encoder=DjangoJSONEncoder)
    idempotency_key = models.CharField(max_length=255, blank=True, default="")
    # Which escalation rule (id, version, name, action) routed the last failure.
    routing = models.JSONField(default=dict, blank=True)
    # A read step's input and what came back, written with its outcome (read_record()): the
    # parameters it was called with and a bounded summary of the response. Empty otherwise.
    read_record = models.JSONField(default=dict, blank=True, encoder=DjangoJSONEncoder)
    lease_owner = models.CharField(max_length=200, blank=True, default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            # The status's and the kind's allowed values: their domains (ChoicesField).
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

    def _move(
        self,
        target: str,
        verb: Verb,
        *,
        data: dict | None = None,
        actor: str = "system",
        held_by: Lease | None = None,
        into=None,
        **fields: Any,
    ) -> None:
        """Move the step to `target` with a compare-and-set on its status (and, for a worker
        finishing its own attempt, on its lease and attempt: `held_by`), and record the event on
        the run's timeline in the same transaction. Every verb below comes through here.

        The change is described once (the row's new values, the compare-and-set, the event) and
        carried out one of two ways: here, statement by statement in the caller's transaction;
        or, `into` a batch (runs.batch: the engine's hot path), as parts of its one statement,
        where a compare-and-set that touches no row refuses the whole statement. A batched verb
        changes nothing in memory: its caller does once the batch committed."""
        updates: dict[str, Any] = {"status": target, **fields}
        if target in self.FINISHED and "finished_at" not in updates:
            updates["finished_at"] = timezone.now()
        if target != self.Status.RUNNING:
            updates.setdefault("lease_owner", "")
            updates.setdefault("lease_expires_at", None)
        sources = _sources(self.TRANSITIONS, target)
        if into is not None:
            where = {"status": sources, **self._held(held_by)}
            into.update(Step, self.pk, updates, where, "the lease was taken back")
            into.event(verb, self.event_data(target, data), actor=actor)
            return
        filters: dict[str, Any] = {"pk": self.pk, "status__in": sources}
        if held_by is not None:
            filters["lease_owner"], filters["attempts"] = held_by.owner, held_by.attempt
        own_transaction = not connection.in_atomic_block
        with transaction.atomic(savepoint=False):
            if own_transaction:
                Run.lock(self.run_id)  # the lock order; a caller's transaction took it already
            count = Step.objects.filter(**filters).update(**updates)
            if count:
                event = self.event_data(target, data)
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

    def event_data(self, target: str, data: dict | None = None) -> dict:
        """What a transition's timeline event says (see Run.event_data)."""
        return {
            "step": self.name,
            "iteration": self.iteration,
            "from": self.status,
            "to": target,
            **(data or {}),
        }

    @property
    def lease(self) -> Lease:
        return Lease(self.lease_owner, self.attempts)

    @staticmethod
    def _held(held_by: Lease | None, *, unexpired: bool = False) -> dict[str, Any]:
        """The compare-and-set of a worker's own attempt: its lease and attempt (and, where a
        call may follow, a lease not yet expired)."""
        if held_by is None:
            return {}
        held = {"lease_owner": held_by.owner, "attempts": held_by.attempt}
        return {**held, "lease_expires_at": LEASE_UNEXPIRED} if unexpired else held

    # -- the engine's verbs: a worker claims the step, then records what its attempt produced.
    # `held_by` is the claiming worker: its outcome lands only while it still holds the lease.

    def start(self, *, worker: str, lease_until, attempt: int, started_at) -> None:
        """Claim a pending (or due) step for a new attempt."""
        self._move(
            self.Status.RUNNING,
            Verb.STEP_STARTED,
            data={"attempt": attempt, "kind": self.kind},
            attempts=attempt,
            lease_owner=worker,
            lease_expires_at=lease_until,
            next_attempt_at=None,
            started_at=started_at,
        )

    def reclaim(self, *, worker: str, lease_until, attempt: int, why: str = "") -> bool:
        """Take back a running step whose lease ran out (its worker died or hung).

        A compare-and-set on the previous owner: of two claimers only one wins (False for the
        other). The status stays `running`; the event names the worker that lost the step.
        """
        previous = self.lease_owner
        fields = {
            "attempts": attempt,
            "lease_owner": worker,
            "lease_expires_at": lease_until,
            "next_attempt_at": None,
        }
        with transaction.atomic(savepoint=False):
            count = Step.objects.filter(
                pk=self.pk, status=self.Status.RUNNING, lease_owner=previous, attempts=self.attempts
            ).update(**fields)
            if count:
                TimelineEvent.append(
                    self.run_id,
                    Verb.STEP_LEASE_RECLAIMED,
                    {
                        "step": self.name,
                        "iteration": self.iteration,
                        "previous_worker": previous,
                        "attempt": attempt,
                        "kind": self.kind,
                        **({"why": why} if why else {}),
                    },
                )
        if count:
            for name, value in fields.items():
                setattr(self, name, value)
        return bool(count)

    def succeed(
        self, result: Any, *, held_by=None, actor="system", data=None, into=None, **fields
    ) -> None:
        self._move(
            self.Status.SUCCEEDED,
            Verb.STEP_SUCCEEDED,
            held_by=held_by,
            actor=actor,
            data=data,
            into=into,
            result=result,
            **fields,
        )

    def succeed_attempt(
        self, result: Any, *, held_by: Lease, read_record=None, now=None, into=None
    ) -> None:
        """The claimed attempt succeeded, as the engine records it (runs.engine.record, and its
        hot path runs.engine.inline `into` a batch): the result, a read's record in the same
        update, the errors of earlier attempts cleared."""
        fields: dict[str, Any] = {"read_record": read_record} if read_record else {}
        if now is not None:
            fields["finished_at"] = now
        self.succeed(
            result,
            held_by=held_by,
            error_class="",
            last_error="",
            data={"attempt": self.attempts},
            into=into,
            **fields,
        )

    def degrade(
        self,
        result: Any,
        *,
        held_by: str,
        failure_class: str,
        error: str,
        details: dict | None = None,
        **fields,
    ) -> None:
        """Succeeded through the tool's fallback (the rule of the tool's failure says degrade);
        `details` name the switch for the timeline (rule, tools, keys)."""
        self._move(
            self.Status.DEGRADED,
            Verb.STEP_DEGRADED,
            held_by=held_by,
            result=result,
            error_class=failure_class,
            last_error=error,
            data={"attempt": self.attempts, **(details or {})},
            **fields,
        )

    def complete_by_hand(self, result: Any, *, actor: str) -> None:
        """A person did the step's work outside TaskPilots."""
        self._move(
            self.Status.SUCCEEDED,
            Verb.STEP_DONE_BY_HAND,
            actor=actor,
            result=result,
            data={"result": result},
        )

    def schedule_retry(
        self, at, *, held_by: str, failure_class: str, error: str, routing: dict
    ) -> None:
        """The attempt failed; the router says try again at `at` (backoff with jitter)."""
        self._move(
            self.Status.RETRY_SCHEDULED,
            Verb.STEP_RETRY_SCHEDULED,
            held_by=held_by,
            error_class=failure_class,
            last_error=error,
            next_attempt_at=at,
            routing=routing,
            data={
                "routing": routing,
                "attempt": self.attempts,
                "error": error[:500],
                "retry_in_s": round((at - timezone.now()).total_seconds(), 3),
            },
        )

    def schedule_recheck(self, at, *, held_by: str, error: str) -> None:
        """The outcome is unknown and the system has no record yet: ask again at `at`, before
        anything is resent (the first request may still land)."""
        self._move(
            self.Status.RETRY_SCHEDULED,
            Verb.SIDE_EFFECT_RECHECK_SCHEDULED,
            held_by=held_by,
            error_class="unknown_outcome",
            last_error=error,
            next_attempt_at=at,
            data={"recheck_at": at, "attempt": self.attempts},
        )

    def wait_for_tool(
        self, probe_at, *, window_ends, held_by: str, failure_class: str, error: str, routing: dict
    ) -> None:
        """The tool is out: probe it at `probe_at` until its wait window closes."""
        self._move(
            self.Status.WAITING,
            Verb.STEP_WAITING_FOR_TOOL,
            held_by=held_by,
            error_class=failure_class,
            last_error=error,
            next_attempt_at=probe_at,
            routing=routing,
            data={
                "routing": routing,
                "probe_at": probe_at,
                "window_ends": window_ends,
                "error": error[:500],
            },
        )

    def hold_for_pause(
        self, *, held_by: str, recheck_at, pause: dict, failure: dict | None = None
    ) -> None:
        """An admin paused the tool: park without calling it, give the attempt back.

        `failure` (failure_class, error, routing): the step's own call failed in a way that
        opened the pause (API drift). That attempt was made and counts, and the event carries
        the routing the metrics count as a tool failure."""
        routing = {
            "rule": "(tool paused by an admin)",
            "action": "wait",
            "paused_tool": pause["tool"],
            "pause": pause["pause"],
        }
        data = {"tool": pause["tool"], "pause": pause["pause"], "reason": pause["reason"]}
        extra = {"attempts": max(self.attempts - 1, 0)}
        if failure is not None:  # the call was made: its attempt counts
            routing = {**failure["routing"], **routing, "rule": failure["routing"].get("rule")}
            data["routing"] = {**failure["routing"], "failure_class": failure["failure_class"]}
            data["error"] = failure["error"][:500]
            extra = {"error_class": failure["failure_class"], "last_error": failure["error"][:4000]}
        self._move(
            self.Status.WAITING,
            Verb.STEP_TOOL_PAUSED,
            held_by=held_by,
            next_attempt_at=recheck_at,
            routing=routing,
            data=data,
            **extra,
        )

    def wait(self, wait: Wait, *, held_by: str) -> None:
        """Parked on an event or a timer (the Wait row says which)."""
        self._move(
            self.Status.WAITING,
            Verb.STEP_WAITING,
            held_by=held_by,
            data={
                "wait": wait.kind,
                "event_type": wait.event_type,
                "correlation_key": wait.correlation_key,
                "due_at": wait.due_at,
            },
        )

    def request_approval(
        self,
        *,
        held_by: str,
        approval: int,
        queue: str,
        reason: str,
        tool: str,
        routing: dict | None = None,
    ) -> None:
        """A person is asked to approve the step's call (ApprovalRequest `approval`): an
        approval step's, or — `routing` says so — a side effect's own call that the gate
        (runs.engine.gate) found no approval in force for."""
        self._move(
            self.Status.NEEDS_HUMAN,
            Verb.APPROVAL_REQUESTED,
            held_by=held_by,
            data={
                "approval": approval,
                "queue": queue,
                "reason": reason,
                "tool": tool,
                **({"routing": routing} if routing else {}),
            },
            # The gate's question replaces a failure the step may have had: not an error.
            **({"routing": routing, "error_class": ""} if routing else {}),
        )

    def escalate(
        self, *, failure_class: str, error: str, routing: dict, held_by=None, actor: str = "system"
    ) -> None:
        """Hand the step to a person (the router's escalate, or a person taking it on)."""
        self._move(
            self.Status.NEEDS_HUMAN,
            Verb.STEP_ESCALATED,
            held_by=held_by,
            actor=actor,
            error_class=failure_class,
            last_error=error[:4000],
            routing=routing,
            data={"routing": routing, "error": error[:500]} if routing else None,
        )

    def mark_unknown_outcome(self, *, held_by: str, error: str, routing: dict) -> None:
        """The call may or may not have landed, and nothing can tell: a person decides."""
        self._move(
            self.Status.UNKNOWN_OUTCOME,
            Verb.STEP_UNKNOWN_OUTCOME,
            held_by=held_by,
            error_class="unknown_outcome",
            last_error=error,
            routing=routing,
        )

    def fail(
        self,
        *,
        failure_class: str = "",
        error: str,
        routing: dict | None = None,
        held_by=None,
        actor: str = "system",
    ) -> None:
        self._move(
            self.Status.FAILED,
            Verb.STEP_FAILED,
            held_by=held_by,
            actor=actor,
            error_class=failure_class,
            last_error=error,
            routing=routing or {},
            data={"routing": routing} if routing else None,
        )

    def skip(self, *, reason: str, actor: str = "system") -> None:
        self._move(
            self.Status.SKIPPED,
            Verb.STEP_SKIPPED,
            actor=actor,
            last_error=reason,
            data={"reason": reason},
        )

    def mark_compensated(self) -> None:
        """Its side effect was undone by a compensating step."""
        self._move(self.Status.COMPENSATED, Verb.STEP_COMPENSATED)

    def request_retry(self, *, actor: str, data: dict | None = None, **fields) -> None:
        """A person sends the step back to the engine (retry now, retry with edits, not done)."""
        self._move(self.Status.PENDING, Verb.STEP_RETRY_REQUESTED, actor=actor, data=data, **fields)

    def retry_now(self, *, actor: str) -> None:
        """A person cuts a scheduled retry or probe short: the step is due now (no state change:
        the next claim picks it up)."""
        Step.objects.filter(pk=self.pk).update(next_attempt_at=timezone.now())
        TimelineEvent.append(
            self.run_id, Verb.STEP_RETRY_REQUESTED, {"step": self.name}, actor=actor
        )

    def end_pause_hold(self) -> None:
        """The paused tool is back: the step forgets the pause (the claim goes on)."""
        Step.objects.filter(pk=self.pk).update(routing={})
        self.routing = {}

    def remember_key(self, key: str, *, held_by: Lease | None = None, into=None) -> None:
        """The idempotency key of the step's call. `into` a batch (the hot path's intent), only
        while the claim `held_by` holds the step, unexpired: no intent, and so no call, for a
        claim that was or is about to be taken back."""
        values = {"idempotency_key": key}
        if into is not None:
            where = {"status": self.Status.RUNNING, **self._held(held_by, unexpired=True)}
            into.update(Step, self.pk, values, where, "the lease was taken back")
            return
        if self.idempotency_key != key:
            Step.objects.filter(pk=self.pk).update(idempotency_key=key)
            self.idempotency_key = key

    # -- the same verbs as parts of one batched transaction (runs.batch), fenced by the claim.

    def open(self, *, into=None) -> None:
        """Create this (unsaved) step already running and leased, with `step.started`
        (runs.engine.claim builds the row): here, in the caller's transaction, or `into` a
        batch (its id taken ahead: runs.batch.STEP_IDS). A step whose call is written in the
        same batch carries its idempotency key from the start."""
        if into is not None:
            into.insert(self)
            into.event(Verb.STEP_STARTED, self.started_data())
            return
        self.save(force_insert=True)
        TimelineEvent.append(self.run_id, Verb.STEP_STARTED, self.started_data())

    def open_done(self, result: Any, now, *, read_record=None, into) -> None:
        """A step that changes nothing, executed ahead of its claim (runs.engine.inline: a pure
        compute step, or a read with its read record), created done `into` a batch with the
        events `open` and `succeed_attempt` write (`step.started`, `step.succeeded`): one row
        instead of an INSERT and an UPDATE of it, which one statement cannot make. Only the hot
        path executes steps ahead; had nothing committed, the step would simply run again."""
        batch = into
        self.status, self.result, self.finished_at = self.Status.SUCCEEDED, result, now
        if read_record:
            self.read_record = read_record
        self.lease_owner, self.lease_expires_at = "", None
        batch.insert(self)
        batch.event(Verb.STEP_STARTED, self.started_data())
        self.status = self.Status.RUNNING  # the event's "from"
        data = {"attempt": self.attempts}
        batch.event(Verb.STEP_SUCCEEDED, self.event_data(self.Status.SUCCEEDED, data))
        self.status = self.Status.SUCCEEDED

    def started_data(self) -> dict:
        """`step.started` of a step created running (here and in runs.engine.claim)."""
        return {
            "step": self.name,
            "iteration": self.iteration,
            "kind": self.kind,
            "attempt": self.attempts,
            "stage": self.stage,
            "from": "",
            "to": self.Status.RUNNING,
        }


# --------------------------------------------------------------------------------------------
# Wait: timers, awaited events, approvals and tool recoveries the run is parked on.


class WaitKind(models.TextChoices):
    EVENT = "event", _("Event")
    TIMER = "timer", _("Timer")
    APPROVAL = "approval", _("Approval")
    TOOL_RECOVERY = "tool_recovery", _("Tool recovery")


class WaitStatus(models.TextChoices):
    PENDING = "pending", _("Pending")
    RESOLVED = "resolved", _("Resolved")
    EXPIRED = "expired", _("Expired")
    CANCELLED = "cancelled", _("Cancelled")


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

    S = Status
    TRANSITIONS: dict[str, set[str]] = {
        S.PENDING: {S.RESOLVED, S.EXPIRED, S.CANCELLED},
        S.RESOLVED: set(),
        S.EXPIRED: set(),
        S.CANCELLED: set(),
    }

    def __str__(self) -> str:
        return f"{self.kind} wait {self.pk} ({self.status})"

    @classmethod
    def open(
        cls, step: Step, kind: str, *, event_type: str = "", correlation_key: str = "", due_at=None
    ) -> Wait:
        """Park `step` on a wait (one pending wait per step, a database constraint)."""
        wait = cls.objects.create(
            run_id=step.run_id,
            step=step,
            kind=kind,
            event_type=event_type,
            correlation_key=correlation_key,
            due_at=due_at,
        )
        TimelineEvent.append(
            step.run_id,
            Verb.WAIT_OPENED,
            {
                "wait": wait.pk,
                "kind": kind,
                "step": step.name,
                "event_type": event_type,
                "correlation_key": correlation_key,
                "due_at": due_at,
                "from": "",
                "to": cls.Status.PENDING,
            },
        )
        return wait

    def _move(
        self, target: str, verb: Verb, *, actor: str = "system", data=None, **fields: Any
    ) -> bool:
        """Settle the wait (compare-and-set from pending) with its event. Returns False when it
        was settled already (a timer and a cancel racing): the first one wins, quietly."""
        fields = {"status": target, "resolved_at": timezone.now(), **fields}
        with transaction.atomic(savepoint=False):
            count = Wait.objects.filter(
                pk=self.pk, status__in=_sources(self.TRANSITIONS, target)
            ).update(**fields)
            if count:
                event = {"wait": self.pk, "kind": self.kind, "from": self.status, "to": target}
                TimelineEvent.append(self.run_id, verb, {**event, **(data or {})}, actor=actor)
        if count:
            for name, value in fields.items():
                setattr(self, name, value)
        return bool(count)

    def resolve(self, payload: Any = None, *, by: str, actor: str = "system") -> bool:
        """What the run waited for arrived: the event (its payload), the timer, the decision,
        the tool back. `by` says which (event:<id>, timer, user:<name>, probe…)."""
        return self._move(
            self.Status.RESOLVED,
            Verb.WAIT_RESOLVED,
            actor=actor,
            data={"by": by},
            payload=to_json_value(payload),
            resolved_by=by,
        )

    def expire(self) -> bool:
        """Its deadline passed with nothing resolving it (the router decides what next)."""
        return self._move(self.Status.EXPIRED, Verb.WAIT_EXPIRED, data={"due_at": self.due_at})

    def cancel(self, *, by: str, actor: str = "system") -> bool:
        """Nobody waits any more: the step was skipped, done by hand, or the run cancelled."""
        return self._move(
            self.Status.CANCELLED,
            Verb.WAIT_CANCELLED,
            actor=actor,
            resolved_by=by,
            data={"by": by},
        )

    def rekey(self, correlation_key: str) -> None:
        """Point a pause wait at another pause (not a state change)."""
        Wait.objects.filter(pk=self.pk).update(correlation_key=correlation_key)
        self.correlation_key = correlation_key

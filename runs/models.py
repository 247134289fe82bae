"""The durable data model: runs, steps, snapshots, the side-effect ledger, waits and the timeline.

Every status column has a check constraint and a transition table; a transition is a conditional
UPDATE (compare-and-set on the current status) that writes its timeline event in the same
transaction, so two concurrent callers can never both win and no state change goes unrecorded.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import re
import uuid
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, models, transaction
from django.db.models import F, Q
from django.utils import timezone
from django.utils.translation import gettext_lazy as _
from psycopg.types.json import Jsonb

from runs.api.models import ApiClient, ApiScope  # noqa: F401  (the API clients are the runs app's)
from runs.verbs import Verb


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


@dataclass(frozen=True)
class Lease:
    """A worker's claim on a running step: who holds it, and for which attempt.

    The attempt is the fencing value: every claim and every reclaim of a step raises it, so a
    worker that was only paused (SIGSTOP, a GC pause, a frozen VM) and whose step was taken back
    meanwhile no longer matches, even when the new owner is another thread of the same process.
    Recording an outcome, writing an intent and making the call are all conditional on it.
    """

    owner: str
    attempt: int


def chain_hash(seq: int, at_iso: str, actor: str, verb: str, data_digest: str, prev: str) -> str:
    """An event's hash over its place in the chain and its content (the one definition: the
    append, the verifier and the offline export check all use it): sha256 of the canonical JSON
    of [seq, at, actor, verb, data digest, previous hash]. Built directly (the hot path hashes
    every event): the time and the digests are ASCII without anything JSON escapes, actor and
    verb are encoded as canonical_json encodes strings (tests/runs/test_audit_verify.py)."""
    if _PLAIN.fullmatch(at_iso) and _PLAIN.fullmatch(data_digest) and _PLAIN.fullmatch(prev):
        actor_json, verb_json = json_string(actor), json_string(verb)
        return plain_chain_hash(seq, at_iso, actor_json, verb_json, data_digest, prev)
    # e.g. an export someone edited: whatever it holds is encoded, never spliced in
    material = canonical_json([seq, at_iso, actor, verb, data_digest, prev])
    return hashlib.sha256(material.encode()).hexdigest()


def plain_chain_hash(
    seq: int, at_iso: str, actor_json: str, verb_json: str, data_digest: str, prev: str
) -> str:
    """`chain_hash` of parts that need no escaping, actor and verb already JSON-encoded
    (json_string): what the engine hashes for the events it writes itself (its own times,
    digests and hashes)."""
    material = f'[{int(seq)},"{at_iso}",{actor_json},{verb_json},"{data_digest}","{prev}"]'
    return hashlib.sha256(material.encode()).hexdigest()


_json_string = json.JSONEncoder(ensure_ascii=False).encode


@functools.lru_cache(maxsize=4096)
def json_string(text: str) -> str:
    """A string as canonical_json encodes it. Actors and verbs repeat on every event: each is
    encoded once."""
    return _json_string(text)


# What a time, a digest or a hash holds: nothing JSON would escape.
_PLAIN = re.compile(r"[0-9A-Za-z:+.\-]*")

# One encoder for every call (json.dumps would build one each time). The hot path encodes every
# event, row and result through it. No circular-reference markers (a dict of ids kept for every
# container): a value that holds itself ends in RecursionError instead of ValueError.
_CANONICAL = DjangoJSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, check_circular=False
)


def canonical_json(value: Any) -> str:
    """The one serialisation used for checksums and hashes: sorted keys, no spaces, UTF-8."""
    return _CANONICAL.encode(value)


def to_json_value(value: Any) -> Any:
    """Normalise to plain JSON types so the stored value and its hash agree after a round trip:
    a copy, as decoding the value's canonical JSON would give it (keys sorted, tuples as lists,
    other key types as strings, what the encoder's default makes of dates, decimals, uuids).

    A value that is plain JSON already — exactly dict with str keys, list, str, int, float,
    bool, None, as tools and workflows return — is copied without encoding it (a payload of
    16 KB costs about 25 µs to encode and decode, its copy about 1 µs); anything else takes
    the round trip."""
    try:
        return _plain_copy(value)
    except _NotPlain:
        return from_canonical_json(canonical_json(value))


class _NotPlain(Exception):
    pass


def _plain_copy(value: Any) -> Any:
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return value
    if kind is dict:
        for key in value:
            if type(key) is not str:
                raise _NotPlain
        return {key: _plain_copy(value[key]) for key in sorted(value)}
    if kind is list:
        return [_plain_copy(item) for item in value]
    if kind is float and math.isfinite(value):
        return value
    raise _NotPlain


# raw_decode, not json.loads: canonical JSON has no whitespace around its one value to skip
# (json.loads matches it twice with a regular expression).
_DECODER = json.JSONDecoder()


def from_canonical_json(text: str) -> Any:
    """The value of a text canonical_json produced."""
    return _DECODER.raw_decode(text)[0]


def digest(value: Any) -> str:
    return text_digest(canonical_json(value))


def text_digest(text: str) -> str:
    """`digest` of a value whose canonical JSON is `text` (encoded once for both)."""
    return hashlib.sha256(text.encode()).hexdigest()


# How much of a read's input and response its step keeps (Step.read_record).
READ_PARAMS_MAX_CHARS = 4000
READ_PREVIEW_CHARS = 200


def read_record(params: Any, response: Any) -> dict:
    """What a read step keeps of its call: the parameters (whole up to READ_PARAMS_MAX_CHARS
    of JSON, else a digest and the first characters) and a summary of the response — its JSON
    type, length (keys, items or characters), size, digest and the first characters. Bounded,
    so a large response costs a few hundred bytes on the step row."""
    params = to_json_value(params)
    params_json = canonical_json(params)
    if len(params_json) > READ_PARAMS_MAX_CHARS:
        params = {
            "truncated": True,
            "sha256": text_digest(params_json),
            "preview": params_json[:READ_PREVIEW_CHARS],
        }
    response = to_json_value(response)
    text = canonical_json(response)
    kind = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    output = {
        "type": kind.get(type(response), "number"),
        "size": len(text),
        "sha256": text_digest(text),
        "preview": text[:READ_PREVIEW_CHARS],
    }
    if isinstance(response, dict | list | str):
        output["length"] = len(response)
    return {"params": params, "output": output}


# How much of an untrusted value an event or a page shows (its digest stands for all of it).
SHOWN_CHARS = 300


def shown(value: Any, limit: int = SHOWN_CHARS) -> str:
    """A short rendering of an untrusted value for an event: canonical JSON, cut at `limit`
    characters (rendered escaped wherever it is shown)."""
    text = canonical_json(to_json_value(value))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _choices_check(field: str, choices: type[models.TextChoices], name: str):
    return models.CheckConstraint(condition=Q(**{f"{field}__in": choices.values}), name=name)


class ChoicesField(models.CharField):
    """A CharField whose allowed values PostgreSQL checks through a domain of that name.

    For the columns every statement of the engine's hot path writes (a run's, a step's and a
    ledger row's status, a step's kind): PostgreSQL compiles a domain's CHECK once per
    connection, where it reads a table's CHECK constraint again, from its text, in every
    statement that writes the table. A migration creates the domain before the column takes
    it (runs/migrations/0021_status_domains.py); a new choice needs a migration that changes
    the domain's CHECK (tests/runs/test_models.py compares each domain with its choices).
    """

    def __init__(self, *args, domain: str = "", **kwargs):
        self.domain = domain
        super().__init__(*args, **kwargs)

    def deconstruct(self):
        name, path, args, kwargs = super().deconstruct()
        kwargs["domain"] = self.domain
        return name, path, args, kwargs

    def db_type(self, connection) -> str:
        return self.domain


def _sources(table: dict[str, set[str]], target: str) -> list[str]:
    return [source for source, targets in table.items() if target in targets]


def _empty(value: Any, name: str) -> bool:
    if name == "permissions":
        value = value and value.get("actor")
    return value in (None, "", [], {})


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
    # A read that found nothing where something was expected (404/410, or an empty answer from
    # a tool that declares `expects_result`): the data is missing, not the system.
    EMPTY_RESULT = "empty_result", _("Empty result")
    # The system answers in a shape the adapter was not written for (406, an unknown field, a
    # response that fails the tool's response check): every call will fail the same way.
    API_DRIFT = "api_drift", _("API version drift")
    # Not a tool error: a wait or approval reached its deadline undecided.
    TIMEOUT = "timeout", _("Wait timed out")


class RecoveryCause(models.TextChoices):
    """Why the engine could not resume a run by itself although nothing failed: metadata the
    resume needs is gone. Written into `run.needs_human` (`data.cause`); the metrics count it."""

    WORKFLOW_NOT_REGISTERED = "workflow_not_registered", _("Workflow version not registered")
    STEP_NOT_IN_WORKFLOW = "step_not_in_workflow", _("Step no longer in the workflow")
    NOTHING_TO_WAIT_FOR = "nothing_to_wait_for", _("Waiting with nothing to wait for")


class Risk(models.TextChoices):
    LOW = "low", _("Low")
    MEDIUM = "medium", _("Medium")
    HIGH = "high", _("High")


class RouteAction(models.TextChoices):
    """What an escalation rule does with a failure (the router's vocabulary)."""

    RETRY = "retry", _("Retry with backoff")
    WAIT = "wait", _("Wait for the outage")
    DEGRADE = "degrade", _("Degrade to the fallback tool")
    COMPENSATE = "compensate", _("Compensate committed side effects")
    ESCALATE = "escalate", _("Escalate to a person")
    FAIL = "fail", _("Fail the run")
    # Not a route: a rule with this action puts matching calls behind a person's approval
    # (runs.engine.gate); the router never picks it for a failure.
    APPROVE = "approve", _("Ask a person to approve the call")


class StepKind(models.TextChoices):
    COMPUTE = "compute", _("Compute")
    READ = "read", _("Read")
    SIDE_EFFECT = "side_effect", _("Side effect")
    APPROVAL = "approval", _("Approval")
    WAIT_EVENT = "wait_event", _("Wait for event")
    WAIT_TIMER = "wait_timer", _("Wait for timer")


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
        sql = "SELECT 1 FROM runs_run WHERE id = %s FOR UPDATE"
        with connection.cursor() as cursor:
            cursor.execute(sql + (" SKIP LOCKED" if skip_locked else ""), [run_id])
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
        **fields: Any,
    ) -> None:
        """Move the run to `target` (every verb below comes through here).

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
                self.record(verb, self.event_data(target, data), actor=actor)
        if count == 0:
            raise self._refusal(filters["status__in"], target)
        for name, value in updates.items():
            setattr(self, name, value)
        self.lock_version = (
            expected_version if expected_version is not None else self.lock_version
        ) + 1

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

    def start(self) -> None:
        self._move(self.Status.RUNNING, Verb.RUN_STARTED)

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

    def enter_stage(self, stage: str) -> None:
        """The run's current stage label (a step's `stage`); not a state change."""
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

    def succeed(self, result: Any = None) -> None:
        self._move(
            self.Status.SUCCEEDED,
            Verb.RUN_SUCCEEDED,
            result=to_json_value(result),
            attention_reason="",
            attention_due_at=None,
        )

    # -- the same verbs as parts of one batched transaction (runs.batch: the engine's hot path).
    # The batch changes the run's row first, by a compare-and-set on its chain head and on the
    # status the verb moves from; these add the changes and the event of that one move.

    def start_in(self, batch) -> None:
        """`start`, from pending."""
        batch.change_run(status=self.Status.RUNNING)
        batch.bump_version()
        batch.event(Verb.RUN_STARTED, self.event_data(self.Status.RUNNING))

    def succeed_in(self, batch, result: Any, now) -> None:
        """`succeed`, from running."""
        batch.change_run(
            status=self.Status.SUCCEEDED,
            result=db_json(result),
            finished_at=now,
            attention_reason="",
            attention_due_at=None,
        )
        batch.bump_version()
        # The event's "from" is what the run is when this part runs: started in the same batch
        # or before it, it is running.
        batch.event(
            Verb.RUN_SUCCEEDED,
            {"from": self.Status.RUNNING, "to": self.Status.SUCCEEDED},
        )

    def enter_stage_in(self, batch, stage: str) -> None:
        if stage and stage != self.stage:
            batch.change_run(stage=stage)

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
        **fields: Any,
    ) -> None:
        """Move the step to `target` with a compare-and-set on its status (and, for a worker
        finishing its own attempt, on its lease and attempt: `held_by`), and record the event on
        the run's timeline in the same transaction. Every verb below comes through here."""
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

    def succeed(self, result: Any, *, held_by=None, actor="system", data=None, **fields) -> None:
        self._move(
            self.Status.SUCCEEDED,
            Verb.STEP_SUCCEEDED,
            held_by=held_by,
            actor=actor,
            data=data,
            result=result,
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

    def remember_key(self, key: str) -> None:
        if self.idempotency_key != key:
            Step.objects.filter(pk=self.pk).update(idempotency_key=key)
            self.idempotency_key = key

    # -- the same verbs as parts of one batched transaction (runs.batch), fenced by the claim.

    def open_in(self, batch) -> None:
        """Create this (unsaved) step already running and leased, with `step.started` (its id
        taken ahead: runs.batch.STEP_IDS; runs.engine.claim builds the row). A step whose call
        is written in the same batch carries its idempotency key from the start."""
        batch.insert(self)
        batch.event(Verb.STEP_STARTED, self.started_data())

    def open_done_in(self, batch, result: Any, now, *, read_record=None) -> None:
        """A step that changes nothing executed ahead of its claim (runs.engine.inline: a pure
        compute step, or a read with its read record): created done, with the events a claim
        and its success write (`step.started`, `step.succeeded`). Had nothing committed, it
        would simply have run again."""
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

    def succeed_in(self, batch, result: Any, *, held_by: Lease, now, read_record=None) -> None:
        """`succeed` of the claimed attempt, as the engine records it (a read with its
        read_record, in the same statement)."""
        fence = [self.pk, held_by.owner, held_by.attempt]
        if read_record:
            values = [db_json(result), db_json(read_record), now, *fence]
            batch.must(_STEP_SUCCEEDED_READ, values, "the lease was taken back")
        else:
            values = [db_json(result), now, *fence]
            batch.must(_STEP_SUCCEEDED, values, "the lease was taken back")
        data = {"attempt": self.attempts}
        batch.event(Verb.STEP_SUCCEEDED, self.event_data(self.Status.SUCCEEDED, data))

    def remember_key_in(self, batch, key: str, *, held_by: Lease) -> None:
        """`remember_key`, only while the claim holds the step, unexpired (no intent, and so no
        call, for a claim that was or is about to be taken back)."""
        batch.must(
            _STEP_KEY, [key, self.pk, held_by.owner, held_by.attempt], "the lease was taken back"
        )


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
    # The person's decision this call executes (an approval, or edited parameters): id, verb,
    # who, and the digest of what they were shown. Empty when no person decided.
    human_decision = models.JSONField(default=dict, blank=True)
    # What a tool's verification read saw just before this call (runs.tools.Verification
    # baseline), so that after a crash its effect can be told from what was there before.
    verification_baseline = models.JSONField(default=dict, blank=True, encoder=DjangoJSONEncoder)
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
            # Only when present: snapshots written before decisions were named keep their
            # checksums.
            **({"human_decision": self.human_decision} if self.human_decision else {}),
            **(
                {"verification_baseline": self.verification_baseline}
                if self.verification_baseline
                else {}
            ),
        }

    def compute_checksum(self) -> str:
        return digest(self.content())

    def save(self, *args, **kwargs):
        self.params = to_json_value(self.params)
        self.prior_results_summary = to_json_value(self.prior_results_summary)
        self.verification_baseline = to_json_value(self.verification_baseline)
        self.checksum = self.compute_checksum()
        super().save(*args, **kwargs)

    @classmethod
    def prepare(cls, step: Step, **fields: Any) -> Snapshot:
        """The snapshot of the call `step` is about to make, unsaved: the fields it could not
        fill are named, the payload normalised and the checksum computed."""
        snapshot = new_row(
            cls,
            cache={"step": step},
            run_id=step.run_id,
            step_id=step.pk,
            attempt=step.attempts,
            **fields,
        )
        snapshot.params = to_json_value(snapshot.params)
        snapshot.prior_results_summary = to_json_value(snapshot.prior_results_summary)
        snapshot.verification_baseline = to_json_value(snapshot.verification_baseline)
        snapshot.missing_fields = snapshot.missing()
        snapshot.checksum = snapshot.compute_checksum()
        return snapshot

    @classmethod
    def write(cls, step: Step, **fields: Any) -> Snapshot:
        """Write the snapshot of the call `step` is about to make, with its event (the
        protocol's step 2, in the transaction that also writes the ledger row)."""
        snapshot = cls.prepare(step, **fields)
        snapshot.save()
        TimelineEvent.append(step.run_id, Verb.SNAPSHOT_WRITTEN, snapshot.written_event())
        return snapshot

    def write_in(self, batch) -> None:
        """`write` of this prepared snapshot (its id taken ahead: runs.batch.SNAPSHOT_IDS)."""
        batch.insert(self)
        batch.event(Verb.SNAPSHOT_WRITTEN, self.written_event())

    def written_event(self) -> dict:
        named = self.human_decision if isinstance(self.human_decision, dict) else {}
        return {
            "step": self.step.name,
            "snapshot": self.pk,
            "key": self.idempotency_key,
            "tool": self.tool,
            "target": self.target_resource,
            "checksum": self.checksum,
            "missing_fields": self.missing_fields,
            # A call the gate cleared by an approval (runs.engine.gate): which, for which
            # parameters, by whom, out of how many required — what verify_audit checks against
            # the approval's own events, offline too.
            **({"approval": _approval_of(named)} if "approval" in named else {}),
        }

    def missing(self) -> list[str]:
        """The snapshot fields (SNAPSHOT_FIELDS) it could not fill: the missing-field rate."""
        values = {**self.content(), "run_id": str(self.run_id)}
        has_prior = bool(self.prior_results_summary)
        return [
            name
            for name in SNAPSHOT_FIELDS
            if not (name == "prior_results_summary" and not has_prior)
            and _empty(values.get(name), name)
        ]


def _approval_of(named: dict) -> dict:
    return {
        "id": named.get("approval"),
        "decision": named.get("id"),
        "params_digest": named.get("params_digest", ""),
        "approvers": list(named.get("approvers") or ()),
        "required": named.get("required", 0),
    }


# --------------------------------------------------------------------------------------------
# SideEffect: the ledger. One row per idempotency key.


class SideEffectStatus(models.TextChoices):
    INTENDED = "intended", _("Intended (about to be sent)")
    COMMITTED = "committed", _("Committed")
    UNKNOWN = "unknown", _("Outcome unknown")
    NOT_COMMITTED = "not_committed", _("Not committed")
    COMPENSATED = "compensated", _("Compensated")


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

    # Unique by side_effect_unique_key (a constraint: a unique CharField would also get a LIKE
    # index nobody queries, written with every row).
    idempotency_key = models.CharField(max_length=255)
    # Indexed by side_effect_run_idx (run, created_at).
    run = models.ForeignKey(
        Run, on_delete=models.PROTECT, related_name="side_effects", db_index=False
    )
    step = models.ForeignKey(Step, on_delete=models.PROTECT, related_name="side_effects")
    # Never looked up from the snapshot's side: no index.
    snapshot = models.ForeignKey(
        Snapshot, on_delete=models.PROTECT, related_name="+", db_index=False
    )
    tool = models.CharField(max_length=150)
    target = models.CharField(max_length=500, blank=True, default="")
    # Checksum of the parameters the key was first used with: the same key with other
    # parameters is an error, never a second call.
    params_checksum = models.CharField(max_length=64)
    status = ChoicesField(
        max_length=20,
        choices=Status.choices,
        default=Status.INTENDED,
        domain="runs_side_effect_status",
    )
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
        constraints = [
            # The status's allowed values: its domain (ChoicesField).
            models.UniqueConstraint(fields=["idempotency_key"], name="side_effect_unique_key"),
        ]
        indexes = [
            models.Index(fields=["run", "created_at"], name="side_effect_run_idx"),
            models.Index(fields=["tool", "status"], name="side_effect_tool_idx"),
            models.Index(
                fields=["updated_at"],
                name="side_effect_open_idx",
                condition=Q(status__in=["intended", "unknown"]),
            ),
            # The consistency check's walk through recent commits (runs.engine.consistency).
            models.Index(
                fields=["committed_at", "id"],
                name="side_effect_committed_idx",
                condition=Q(status="committed"),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tool} {self.idempotency_key} ({self.status})"

    def _move(
        self, target: str, verb: Verb, *, data=None, actor: str = "system", **fields: Any
    ) -> None:
        """Move the ledger row to `target` (compare-and-set on its status) with its event, in
        one transaction. Every verb below comes through here."""
        now = timezone.now()
        updates: dict[str, Any] = {"status": target, "updated_at": now, **fields}
        if target == self.Status.COMMITTED:
            updates.setdefault("committed_at", now)
        if target == self.Status.INTENDED:
            updates.setdefault("attempted_at", now)
        own_transaction = not connection.in_atomic_block
        sources = _sources(self.TRANSITIONS, target)
        with transaction.atomic(savepoint=False):
            if own_transaction:
                Run.lock(self.run_id)  # the lock order; a caller's transaction took it already
            known = self.status
            # Compare-and-set on the status this object knows; when another writer moved the row
            # meanwhile (a late receipt after the new owner marked it unknown), once more from
            # the status it has now, so the event says where the row really came from.
            count = 0
            for again in (False, True):
                if known in sources:
                    count = SideEffect.objects.filter(pk=self.pk, status=known).update(**updates)
                if count or again:
                    break
                row = SideEffect.objects.filter(pk=self.pk).values_list("status", flat=True)
                known = row.first() or "?"
            if count:
                self.status = known
                TimelineEvent.append(self.run_id, verb, self.event_data(target, data), actor=actor)
        if count == 0:
            raise InvalidTransition("side effect", self.pk, known, target)
        for name, value in updates.items():
            setattr(self, name, value)

    def event_data(self, target: str, data: dict | None = None) -> dict:
        """What a transition's timeline event says (see Run.event_data)."""
        return {
            "key": self.idempotency_key,
            "tool": self.tool,
            "from": self.status,
            "to": target,
            **(data or {}),
        }

    @staticmethod
    def committed_data(receipt: Receipt, confirmed_by: str, data: dict | None = None) -> dict:
        return {"external_id": receipt.external_id, "confirmed_by": confirmed_by, **(data or {})}

    @classmethod
    def intend(cls, snapshot: Snapshot, *, params_checksum: str) -> SideEffect:
        """The ledger row of a call about to be made, under the snapshot's idempotency key
        (committed with the snapshot, before the call: the protocol's step 2)."""
        effect = cls.objects.create(
            idempotency_key=snapshot.idempotency_key,
            run_id=snapshot.run_id,
            step_id=snapshot.step_id,
            snapshot=snapshot,
            tool=snapshot.tool,
            target=snapshot.target_resource,
            params_checksum=params_checksum,
        )
        TimelineEvent.append(snapshot.run_id, Verb.SIDE_EFFECT_INTENDED, effect.intended_event())
        return effect

    def intend_in(self, batch) -> None:
        """`intend` of this unsaved row (its id taken ahead: runs.batch.SIDE_EFFECT_IDS). A key
        used before makes the batch fail on the unique constraint."""
        batch.insert(self)
        batch.event(Verb.SIDE_EFFECT_INTENDED, self.intended_event())

    def commit_in(self, batch, receipt: Receipt, *, confirmed_by: str, now, data=None) -> None:
        """`commit`: the receipt of a call, from the status this worker knows."""
        batch.must(
            _SIDE_EFFECT_COMMIT,
            [
                now,
                now,
                receipt.external_id[:255],
                db_json(receipt.as_json()),
                confirmed_by,
                self.pk,
                self.status,
            ],
            "side effect settled elsewhere",
        )
        data = self.committed_data(receipt, confirmed_by, data)
        batch.event(Verb.SIDE_EFFECT_COMMITTED, self.event_data(self.Status.COMMITTED, data))

    def intended_event(self) -> dict:
        return {
            "step": self.step.name,
            "key": self.idempotency_key,
            "tool": self.tool,
            "target": self.target,
            "from": "",
            "to": SideEffectStatus.INTENDED,
        }

    def intend_again(self, snapshot: Snapshot) -> None:
        """A new attempt under the same key, once the previous one is known not to have landed."""
        self._move(
            self.Status.INTENDED,
            Verb.SIDE_EFFECT_INTENDED,
            snapshot=snapshot,
            data={"step": snapshot.step.name, "attempt": snapshot.attempt},
        )

    def commit(
        self,
        receipt: Receipt,
        *,
        confirmed_by: str,
        actor: str = "system",
        data: dict | None = None,
    ) -> None:
        """The call landed: store its receipt (the commit proof). `confirmed_by` says who
        proved it: the tool's answer, a lookup by key ("reconcile") or a named person."""
        self._move(
            self.Status.COMMITTED,
            Verb.SIDE_EFFECT_COMMITTED,
            actor=actor,
            external_id=receipt.external_id[:255],
            receipt=receipt.as_json(),
            confirmed_by=confirmed_by,
            data=self.committed_data(receipt, confirmed_by, data),
        )

    def mark_unknown(self, why: str) -> None:
        """The call may have landed: reconcile by key, resend if it dedupes, or ask a person."""
        self._move(self.Status.UNKNOWN, Verb.SIDE_EFFECT_UNKNOWN, data={"reason": why[:500]})

    def mark_not_committed(self, *, confirmed_by: str = "", actor: str = "system") -> None:
        """Known not to have landed (the tool refused it, a lookup found nothing once the settle
        window passed, or a person says so): a new attempt may use the same key."""
        self._move(
            self.Status.NOT_COMMITTED,
            Verb.SIDE_EFFECT_NOT_COMMITTED,
            actor=actor,
            confirmed_by=confirmed_by,
            data={"confirmed_by": confirmed_by} if confirmed_by else None,
        )

    def note_result_changed(self, observed: Receipt, changes: dict) -> None:
        """A lookup by key found the effect, but not as recorded earlier or as the snapshot
        expects (runs.engine.ledger.changed_result). Nothing is guessed: the row stays
        `unknown`, keeping what the tool reports now (`receipt.observed`) for the person who
        confirms, and the event carries both sides.

        1. Lock the run (the lock order), unless the caller's transaction holds it.
        2. Store the observed receipt, compare-and-set on `unknown`.
        3. Append `side_effect.result_changed` with both values (digests and a short rendering).
        """
        kept = {"observed": observed.as_json(), "changes": to_json_value(changes)}
        data = {
            "key": self.idempotency_key,
            "tool": self.tool,
            "now": {
                "external_id": observed.external_id[:255],
                "digest": kept["observed"]["response_digest"],
                "shown": shown(observed.response),
            },
            "expected": changes.get("expected", {}),
            "changes": changes.get("fields", {}),
        }
        own_transaction = not connection.in_atomic_block
        with transaction.atomic(savepoint=False):
            if own_transaction:
                Run.lock(self.run_id)
            count = SideEffect.objects.filter(pk=self.pk, status=self.Status.UNKNOWN).update(
                receipt=kept, updated_at=timezone.now()
            )
            if count:
                TimelineEvent.append(self.run_id, Verb.SIDE_EFFECT_RESULT_CHANGED, data)
        if not count:
            raise InvalidTransition("side effect", self.pk, self.status, self.Status.UNKNOWN)
        self.receipt = kept

    @property
    def changed_result(self) -> dict | None:
        """What note_result_changed kept on an unknown row (None on any other)."""
        if self.status != self.Status.UNKNOWN or not isinstance(self.receipt, dict):
            return None
        return self.receipt.get("observed") and self.receipt

    def mark_compensated(self, compensation_key: str) -> None:
        self._move(
            self.Status.COMPENSATED,
            Verb.SIDE_EFFECT_COMPENSATED,
            compensation_key=compensation_key,
        )


class MismatchKind(models.TextChoices):
    MISSING = "missing", _("Missing externally")
    DIFFERENT = "different", _("Different externally")


class ExternalMismatch(models.Model):
    """A committed side effect that its external system, asked by key, no longer shows as the
    ledger recorded it (runs.engine.consistency): missing there, or different. One row per
    effect, kind and observed answer, however many passes see it; resolved when a later pass
    finds the two agreeing again."""

    Kind = MismatchKind

    side_effect = models.ForeignKey(SideEffect, on_delete=models.PROTECT, related_name="+")
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="+", db_index=False)
    kind = models.CharField(max_length=20, choices=Kind.choices)
    # The digest of what the system answered ("" when it holds nothing under the key).
    observed_digest = models.CharField(max_length=64, blank=True, default="")
    detail = models.JSONField(default=dict, encoder=DjangoJSONEncoder)
    found_at = models.DateTimeField(default=timezone.now)
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            _choices_check("kind", MismatchKind, "external_mismatch_kind_valid"),
            models.UniqueConstraint(
                fields=["side_effect", "kind", "observed_digest"],
                name="external_mismatch_unique",
            ),
        ]
        indexes = [
            models.Index(
                fields=["found_at"],
                name="external_mismatch_open_idx",
                condition=Q(resolved_at__isnull=True),
            ),
            # The console's list of every mismatch, newest first (approvals/mismatch_views.py).
            models.Index(fields=["found_at", "id"], name="external_mismatch_found_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.side_effect_id}"

    @classmethod
    def record(cls, effect: SideEffect, kind: str, observed_digest: str, detail: dict):
        """Record what a pass found, with its `side_effect.external_mismatch` event, once: the
        same mismatch seen again adds nothing (a resolved one seen again is opened again).
        Returns the row when it is new (or opened again), else None."""
        detail = to_json_value(detail)
        with transaction.atomic():
            Run.lock(effect.run_id)
            row, created = cls.objects.get_or_create(
                side_effect=effect,
                kind=kind,
                observed_digest=observed_digest,
                defaults={"run_id": effect.run_id, "detail": detail},
            )
            if not created and row.resolved_at is None:
                return None
            if not created:
                cls.objects.filter(pk=row.pk).update(resolved_at=None, found_at=timezone.now())
            TimelineEvent.append(
                effect.run_id,
                Verb.SIDE_EFFECT_EXTERNAL_MISMATCH,
                {"key": effect.idempotency_key, "tool": effect.tool, "kind": kind, **detail},
            )
        return row

    @classmethod
    def resolve(cls, effect: SideEffect) -> int:
        """A pass found the system agreeing with the ledger again: its open mismatches close,
        with a `side_effect.external_matched` event."""
        with transaction.atomic():
            count = cls.objects.filter(side_effect=effect, resolved_at__isnull=True).update(
                resolved_at=timezone.now()
            )
            if count:
                TimelineEvent.append(
                    effect.run_id,
                    Verb.SIDE_EFFECT_EXTERNAL_MATCHED,
                    {"key": effect.idempotency_key, "tool": effect.tool, "resolved": count},
                )
        return count


class ConsistencyCursor(models.Model):
    """Where the consistency check's passes have got to among committed side effects (ordered by
    committed_at, then id), so a pass bounded in size goes on where the last one stopped."""

    name = models.CharField(max_length=50, unique=True)
    position_at = models.DateTimeField()
    position_id = models.BigIntegerField(default=0)
    passes = models.IntegerField(default=0)


# The batched verbs' statements (runs.batch): the same rows and compare-and-sets as the ORM
# verbs above, fenced by the claim (lease owner and attempt) where the verb is.
_STEP_SUCCEEDED = (
    "UPDATE runs_step SET status = 'succeeded', result = %s, error_class = '', last_error = '', "
    "finished_at = %s, lease_owner = '', lease_expires_at = NULL "
    "WHERE id = %s AND status = 'running' AND lease_owner = %s AND attempts = %s"
)
_STEP_SUCCEEDED_READ = (
    "UPDATE runs_step SET status = 'succeeded', result = %s, read_record = %s, error_class = '', "
    "last_error = '', finished_at = %s, lease_owner = '', lease_expires_at = NULL "
    "WHERE id = %s AND status = 'running' AND lease_owner = %s AND attempts = %s"
)
_STEP_KEY = (
    "UPDATE runs_step SET idempotency_key = %s WHERE id = %s AND status = 'running' "
    "AND lease_owner = %s AND attempts = %s AND lease_expires_at > now()"
)
_SIDE_EFFECT_COMMIT = (
    "UPDATE runs_sideeffect SET status = 'committed', updated_at = %s, committed_at = %s, "
    "external_id = %s, receipt = %s, confirmed_by = %s WHERE id = %s AND status = %s"
)


_ROW_DEFAULTS: dict[type, list[tuple[str, Any, bool]]] = {}


def new_row(model: type[models.Model], cache: dict | None = None, **values: Any):
    """An unsaved instance of `model` with `values` (attribute names: `run_id`, not `run`),
    every other field at its default — without Model.__init__'s per-field work: the engine's
    hot path builds a few per step. `cache` holds related objects already known (`run`)."""
    if model not in _ROW_DEFAULTS:
        _ROW_DEFAULTS[model] = [
            (f.attname, f.default, callable(f.default))
            if f.has_default()
            else (f.attname, None, False)
            for f in model._meta.concrete_fields
        ]
    instance = model.__new__(model)
    attributes = instance.__dict__
    for attname, default, call in _ROW_DEFAULTS[model]:
        if attname in values:
            attributes[attname] = values[attname]
        else:
            attributes[attname] = default() if call else default
    instance._state = models.base.ModelState()
    if cache:
        instance._state.fields_cache.update(cache)
    return instance


class SqlValue(str):
    """A column's new value written as SQL, not as a parameter (e.g. `lock_version + 1`)."""


def db_json(value: Any):
    """A JSONField's value as the ORM stores it, for raw statements (None is SQL NULL)."""
    return None if value is None else Jsonb(value, dumps=canonical_json)


@dataclass(frozen=True)
class Receipt:
    """What proves a side effect happened: the other system's id for it and its answer."""

    external_id: str
    response: Any

    def as_json(self) -> dict:
        return to_json_value(
            {
                "external_id": self.external_id,
                "response": self.response,
                "response_digest": digest(self.response),
            }
        )


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


# --------------------------------------------------------------------------------------------
# TimelineEvent: append-only, hash-chained per run.


class TimelineEvent(ImmutableModel):
    # Indexed by timeline_run_seq (run, seq). No foreign key in the database: every event is
    # written by the statement that moves its run's chain head (it locks the run row, and the
    # statement fails without it), runs are never deleted (runs_run_never_deleted, and PROTECT
    # here), and the key's check would cost a lookup per event at every commit.
    run = models.ForeignKey(
        Run,
        on_delete=models.PROTECT,
        related_name="events",
        db_index=False,
        db_constraint=False,
    )
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
        # Partial, so the engine's own events (most of them) write no index but the two above:
        # the notification sweep reads the verbs that notify (approvals/notifications.py), the
        # audit search the events of people and API clients.
        indexes = [
            models.Index(
                fields=["at"],
                name="timeline_notify_idx",
                condition=Q(
                    verb__in=[
                        "run.needs_human",
                        "run.sla_breached",
                        "side_effect.external_mismatch",
                        "tool.paused",
                        "run.requeued",
                        "approval.first_approved",
                    ]
                ),
            ),
            models.Index(
                fields=["actor", "at"], name="timeline_actor_idx", condition=~Q(actor="system")
            ),
        ]
        ordering = ["run", "seq"]

    def __str__(self) -> str:
        return f"{self.run_id}#{self.seq} {self.verb}"

    @staticmethod
    def compute_hash(seq: int, at, actor: str, verb: str, data_digest: str, prev_hash: str) -> str:
        return chain_hash(seq, at.isoformat(), actor, verb, data_digest, prev_hash)

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
        chain_heads.remember(run_id, seq, event_hash)
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

    @staticmethod
    def chained(seq: int, prev_hash: str, verb: str, data: dict, *, actor: str, at_iso: str):
        """An event appended at `seq` after `prev_hash` at the time `at_iso`, hashed here rather
        than in PostgreSQL (the engine's one-round-trip transactions, runs.batch, which hold the
        chain head): (actor as JSON, verb as JSON, canonical data, digest, hash) — the same
        bytes and the same hash `append` produces."""
        text = canonical_json(data)
        data_digest = hashlib.sha256(text.encode()).hexdigest()
        actor_json, verb_json = json_string(actor), json_string(verb)
        event_hash = plain_chain_hash(seq, at_iso, actor_json, verb_json, data_digest, prev_hash)
        return actor_json, verb_json, text, data_digest, event_hash


class ChainHeads:
    """The chain head (seq, hash) this process last wrote or read for each run.

    A hint, never the truth: the engine's batched transactions hash their events from it and
    commit only where the run row still holds exactly this head (a compare-and-set on
    `event_seq` and `event_hash`), so a stale or missing head costs a retry through the
    ordinary path, never a broken chain. Bounded: forgotten all at once when it grows large.
    """

    LIMIT = 20_000

    def __init__(self) -> None:
        self._heads: dict[str, tuple[int, str]] = {}

    def remember(self, run_id, seq: int, event_hash: str) -> None:
        if len(self._heads) >= self.LIMIT:
            self._heads = {}
        self._heads[str(run_id)] = (seq, event_hash)

    def get(self, run_id) -> tuple[int, str] | None:
        return self._heads.get(str(run_id))

    def forget(self, run_id) -> None:
        self._heads.pop(str(run_id), None)


chain_heads = ChainHeads()


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

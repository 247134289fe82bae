"""The side-effect ledger: the snapshot before a call, the side effect with its receipt, what
the consistency check found."""

from __future__ import annotations

from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, models, transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from runs.models.base import (
    ChoicesField,
    ImmutableModel,
    InvalidTransition,
    Receipt,
    _choices_check,
    _empty,
    _sources,
    new_row,
)
from runs.models.run import Run
from runs.models.step import Step
from runs.models.timeline import TimelineEvent
from runs.models.values import digest, shown, to_json_value
from runs.verbs import Verb

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
        snapshot.record()
        return snapshot

    def record(self, *, into=None) -> None:
        """Write this prepared snapshot with its `snapshot.written` event: here, in the caller's
        transaction, or `into` a batch (runs.batch, the engine's hot path: its id and time were
        taken ahead, runs.batch.SNAPSHOT_IDS)."""
        if into is not None:
            into.insert(self)
            into.event(Verb.SNAPSHOT_WRITTEN, self.written_event())
            return
        self.save(force_insert=True)
        TimelineEvent.append(self.run_id, Verb.SNAPSHOT_WRITTEN, self.written_event())

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
        self,
        target: str,
        verb: Verb,
        *,
        data=None,
        actor: str = "system",
        now=None,
        into=None,
        **fields: Any,
    ) -> None:
        """Move the ledger row to `target` (compare-and-set on its status) with its event, in
        one transaction. Every verb below comes through here; `into` a batch (the engine's hot
        path, runs.batch), the same change is a part of its one statement, from the status this
        worker knows (see Step._move)."""
        now = now or timezone.now()
        updates: dict[str, Any] = {"status": target, "updated_at": now, **fields}
        if target == self.Status.COMMITTED:
            updates.setdefault("committed_at", now)
        if target == self.Status.INTENDED:
            updates.setdefault("attempted_at", now)
        sources = _sources(self.TRANSITIONS, target)
        if into is not None:
            where = {"status": self.status}
            into.update(SideEffect, self.pk, updates, where, "side effect settled elsewhere")
            into.event(verb, self.event_data(target, data), actor=actor)
            return
        own_transaction = not connection.in_atomic_block
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
        effect = cls.intended(snapshot, params_checksum=params_checksum)
        effect.record_intent()
        return effect

    @classmethod
    def intended(cls, snapshot: Snapshot, *, params_checksum: str, **fields: Any) -> SideEffect:
        """The unsaved `intended` row of the snapshot's call (`fields`: its id and times, when
        taken ahead for a batch)."""
        return new_row(
            cls,
            cache={"snapshot": snapshot, **snapshot._state.fields_cache},
            idempotency_key=snapshot.idempotency_key,
            run_id=snapshot.run_id,
            step_id=snapshot.step_id,
            snapshot_id=snapshot.pk,
            tool=snapshot.tool,
            target=snapshot.target_resource,
            params_checksum=params_checksum,
            **fields,
        )

    def record_intent(self, *, into=None) -> None:
        """Write this unsaved `intended` row with its event: here, in the caller's transaction,
        or `into` a batch (its id taken ahead: runs.batch.SIDE_EFFECT_IDS). A key used before
        fails on the unique constraint (a batch: the whole statement is refused)."""
        if into is not None:
            into.insert(self)
            into.event(Verb.SIDE_EFFECT_INTENDED, self.intended_event())
            return
        self.save(force_insert=True)
        TimelineEvent.append(self.run_id, Verb.SIDE_EFFECT_INTENDED, self.intended_event())

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
        now=None,
        into=None,
    ) -> None:
        """The call landed: store its receipt (the commit proof). `confirmed_by` says who
        proved it: the tool's answer, a lookup by key ("reconcile") or a named person."""
        self._move(
            self.Status.COMMITTED,
            Verb.SIDE_EFFECT_COMMITTED,
            actor=actor,
            now=now,
            into=into,
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

"""The hash-chained timeline: events, the chain heads this process holds, the append."""

from __future__ import annotations

import hashlib

from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, models
from django.db.models import Q
from django.utils import timezone

from runs import hooks, statements
from runs.models.base import ImmutableModel
from runs.models.values import (
    canonical_json,
    chain_hash,
    digest,
    json_string,
    plain_chain_hash,
    to_json_value,
)

# --------------------------------------------------------------------------------------------
# TimelineEvent: append-only, hash-chained per run.


class TimelineEvent(ImmutableModel):
    # Indexed by timeline_run_seq (run, seq). No foreign key in the database: every event is
    # written by the statement that moves its run's chain head (it locks the run row, and the
    # statement fails without it), runs are never deleted (runs_run_never_deleted, and PROTECT
    # here), and the key's check would cost a lookup per event at every commit.
    run = models.ForeignKey(
        "runs.Run",
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
                        # A request decided, expired or cancelled: its Slack messages update.
                        "approval.approved",
                        "approval.approved_with_edits",
                        "approval.rejected",
                        "approval.expired",
                        "approval.cancelled",
                        # A run taken over or given back: its Slack messages update.
                        "run.taken_over",
                        "run.released",
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
                statements.APPEND_EVENT,
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
            raise cls._meta.get_field("run").related_model.DoesNotExist(run_id)
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
        if hooks.event_observers:
            written = {"id": event_id, "at": at.isoformat(), "actor": actor, "verb": verb}
            hooks.events_written(run_id, [{**written, "data": data, "hash": event_hash}])
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

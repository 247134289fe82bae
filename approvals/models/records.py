"""The records chain, and what seals cover (runs/seal.py).

Rows of one run are sealed on that run's timeline. Rows that belong to no run — rule versions
and the rules they describe, tool pauses, decisions over tools' metadata, bulk jobs — are
sealed on the records chain: one append-only chain, hash-chained exactly as a run's timeline
(`chain_hash` over seq, time, actor, verb, data digest and the previous hash), whose head (seq,
hash) is kept in AuditRecordHead as a run keeps its own. Appending is one statement that locks
the head row; a transaction takes it last (after any run or rule it locks), so it cannot be
half of a deadlock with a run's lock.
"""

from __future__ import annotations

from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, models
from django.db.models import Q
from django.utils import timezone

from approvals.models.bulk import BulkAction, BulkActionItem
from approvals.models.requests import ApprovalRequest, HumanDecision, Takeover
from approvals.models.rules import EscalationRule, RuleVersion, ToolPause
from approvals.models.tool_metadata import ToolMetadataOverride
from runs import seal
from runs.models import ImmutableModel, canonical_json, digest, to_json_value


class AuditRecord(ImmutableModel):
    """One entry of the records chain (a `record.sealed` seal of a row that has no run)."""

    seq = models.PositiveIntegerField(unique=True)
    at = models.DateTimeField()
    actor = models.CharField(max_length=200)
    verb = models.CharField(max_length=80)
    data = models.JSONField(encoder=DjangoJSONEncoder)
    data_digest = models.CharField(max_length=64)
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64)

    class Meta:
        ordering = ["seq"]

    def __str__(self) -> str:
        return f"records#{self.seq} {self.verb}"

    @classmethod
    def append(cls, verb: str, data: dict, *, actor: str = "system") -> int:
        """Append an entry (one statement: lock the head, insert, move the head); its seq."""
        at = timezone.now()
        data = to_json_value(data)
        data_digest = digest(data)
        params = {
            "at": at,
            "actor": actor,
            "verb": verb,
            "data": canonical_json(data),
            "digest": data_digest,
            "middle": canonical_json([at.isoformat(), actor, verb, data_digest])[1:-1],
        }
        with connection.cursor() as cursor:
            cursor.execute(_APPEND_SQL, params)
            row = cursor.fetchone()
            if row is None:  # no head row (a test database flushed since the migration)
                cursor.execute(_HEAD_SQL)
                cursor.execute(_APPEND_SQL, params)
                row = cursor.fetchone()
        return row[0]

    @staticmethod
    def head() -> tuple[int, str]:
        found = AuditRecordHead.objects.filter(pk=1).values_list("seq", "hash").first()
        return found or (0, "")


class AuditRecordHead(models.Model):
    """The records chain's head: one row (id 1), moved by every append."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    seq = models.PositiveIntegerField(default=0)
    hash = models.CharField(max_length=64, blank=True, default="")

    def __str__(self) -> str:
        return f"records head #{self.seq}"


_HEAD_SQL = "INSERT INTO approvals_auditrecordhead (id, seq, hash) VALUES (1, 0, '') " + (
    "ON CONFLICT (id) DO NOTHING"
)

_APPEND_SQL = """
WITH head AS (
    SELECT seq + 1 AS seq, hash AS prev FROM approvals_auditrecordhead WHERE id = 1 FOR UPDATE
), record AS (
    INSERT INTO approvals_auditrecord (seq, at, actor, verb, data, data_digest, prev_hash, hash)
    SELECT head.seq, %(at)s, %(actor)s, %(verb)s, %(data)s::jsonb, %(digest)s, head.prev,
        encode(sha256(convert_to(
            '[' || head.seq || ',' || %(middle)s || ',"' || head.prev || '"]', 'UTF8')), 'hex')
    FROM head
    RETURNING seq, hash
)
UPDATE approvals_auditrecordhead SET seq = record.seq, hash = record.hash
FROM record WHERE approvals_auditrecordhead.id = 1
RETURNING record.seq
"""


def _bulk_items(get_model: seal.GetModel, jobs: list) -> dict:
    """A bulk job's frozen set as its preview wrote it (what the person confirmed): per item
    its position, run, step, the run's version then, the plan and the evidence."""
    items = get_model("approvals.BulkActionItem")._base_manager.filter(bulk_action_id__in=jobs)
    found: dict = {job: {"items": []} for job in jobs}
    for job, *item in items.order_by("bulk_action_id", "position").values_list(
        "bulk_action_id", "position", "run_id", "step_id", "expected_version", "plan", "evidence"
    ):
        found[job]["items"].append(item)
    return found


seal.use_records_chain(AuditRecord)

# What is sealed. Every concrete column is covered but the primary key and those named here.
for model, spec in (
    # Every person's action on a run (approvals/actions.py `_decision`), and the settlement of
    # an unknown outcome seals the ledger row it settled (runs.sideeffect, runs/seal.py).
    (HumanDecision, seal.Spec("approvals.humandecision")),
    # Begin and end (the row gets ended_at, the resolution and the engineer answer).
    (Takeover, seal.Spec("approvals.takeover")),
    # Opened, first approval, decided / expired / cancelled. Left out: queue and due_at, which
    # an SLA breach moves (ApprovalRequest.requeue); `run.sla_breached` and `run.requeued`
    # record each move on the timeline.
    (
        ApprovalRequest,
        seal.Spec("approvals.approvalrequest", exclude=frozenset({"queue", "due_at"})),
    ),
    # An item once handled (done, skipped, failed); pending items are covered by their job's
    # seal (its `items`).
    (BulkActionItem, seal.Spec("approvals.bulkactionitem", required=~Q(status="pending"))),
    # The records chain: no run.
    (RuleVersion, seal.Spec("approvals.ruleversion", run=None)),
    # Sealed with each of its versions (RuleVersion.save): the rule row must still be what its
    # latest version made it.
    (EscalationRule, seal.Spec("approvals.escalationrule", run=None)),
    (ToolPause, seal.Spec("approvals.toolpause", run=None)),
    (ToolMetadataOverride, seal.Spec("approvals.toolmetadataoverride", run=None)),
    # Created, its items written, started, done. Left out: heartbeat_at, which the worker moves
    # after every item and the sweep when it hands the job on (bookkeeping, no decision).
    (
        BulkAction,
        seal.Spec(
            "approvals.bulkaction",
            run=None,
            exclude=frozenset({"heartbeat_at"}),
            extra=_bulk_items,
            extra_names=("items",),
        ),
    ),
):
    if model._meta.label_lower != spec.label:  # a renamed model would lose its seals
        raise LookupError(f"{spec.label} names no model ({model._meta.label_lower})")
    seal.register(spec)

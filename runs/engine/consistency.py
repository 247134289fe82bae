"""The consistency check: committed side effects compared with the external systems that hold
them, not only with the ledger's own invariants.

A pass takes the committed ledger rows of the recent window (committed_at, then id) after the
cursor, a batch at a time and at most a bounded number per pass, and asks each row's tool by
idempotency key (tools that cannot be asked are passed over). The system may say:
- nothing under the key: **missing** externally;
- something that contradicts the receipt or the snapshot (runs.engine.ledger.changed_result,
  or another external id): **different**;
- what the ledger recorded: fine, and any open mismatch of that row is resolved.
A lookup that fails says nothing either way: counted, and asked again on a later pass.
Each mismatch is an ExternalMismatch row with its timeline event, recorded once however many
passes see it; the people's side alerts on the event (approvals/notifications.py). When a pass
reaches the end of the window the cursor goes back to its start, so every recent row is
compared again on the next round. No transaction is open during a lookup.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta

from django.db.models import Q
from django.utils import timezone

from runs import tools
from runs.engine.dispatch import conf
from runs.models import (
    ConsistencyCursor,
    ExternalMismatch,
    Receipt,
    SideEffect,
    digest,
    shown,
    to_json_value,
)
from runs.tools import CallContext, ToolError

CURSOR = "external"
# Receipts written by the tool's own answer or a lookup by key can be compared whole; one a
# person wrote (their reference as proof) only by the expected fields and the external id.
TOOL_RECEIPTS = ("tool", "reconcile")


@dataclass
class ConsistencyReport:
    checked: int = 0
    missing: int = 0
    different: int = 0
    recorded: int = 0  # new mismatches (or ones opened again)
    resolved: int = 0
    unanswered: int = 0
    not_askable: int = 0
    wrapped: bool = False

    def as_dict(self) -> dict:
        return asdict(self)


def check_consistency(
    *,
    since: datetime | None = None,
    now: datetime | None = None,
    batch: int | None = None,
    limit: int | None = None,
    progress: Callable[[ConsistencyReport], None] | None = None,
) -> ConsistencyReport:
    """One pass (see the module docstring). `since`: the window's start (default: the last
    CONSISTENCY_WINDOW_HOURS); `progress` is called after each batch."""
    now = now or timezone.now()
    start = since or now - timedelta(hours=conf("CONSISTENCY_WINDOW_HOURS"))
    batch = batch or conf("CONSISTENCY_BATCH")
    limit = limit or conf("CONSISTENCY_MAX_PER_PASS")
    cursor, _ = ConsistencyCursor.objects.get_or_create(
        name=CURSOR, defaults={"position_at": start}
    )
    at, last_id = cursor.position_at, cursor.position_id
    if at < start:
        at, last_id = start, 0
    report, seen = ConsistencyReport(), 0
    while seen < limit:
        take = min(batch, limit - seen)
        rows = list(
            SideEffect.objects.filter(status=SideEffect.Status.COMMITTED, committed_at__gte=start)
            .filter(Q(committed_at__gt=at) | Q(committed_at=at, id__gt=last_id))
            .select_related("snapshot")
            .order_by("committed_at", "id")[:take]
        )
        for effect in rows:
            _check(effect, report)
        seen += len(rows)
        if rows:
            at, last_id = rows[-1].committed_at, rows[-1].pk
        if progress is not None:
            progress(report)
        if len(rows) < take:
            report.wrapped = True  # the end of the window: the next pass starts over
            at, last_id = start, 0
            break
    ConsistencyCursor.objects.filter(pk=cursor.pk).update(
        position_at=at, position_id=last_id, passes=cursor.passes + 1
    )
    return report


def _check(effect: SideEffect, report: ConsistencyReport) -> None:
    try:
        tool = tools.get(effect.tool)
    except tools.UnknownTool:
        tool = None
    if tool is None or tool.lookup is None:
        report.not_askable += 1
        return
    report.checked += 1
    ctx = CallContext(
        idempotency_key=effect.idempotency_key,
        run_id=str(effect.run_id),
        step="consistency-check",
        attempt=0,
        timeout=tool.timeout if tool.timeout is not None else conf("TOOL_TIMEOUT_SECONDS"),
    )
    try:
        found = tool.lookup(effect.idempotency_key, ctx)
    except ToolError:
        report.unanswered += 1
        return
    except Exception:  # the tool author's code: a bug there says nothing about the effect
        report.unanswered += 1
        return
    recorded = {"external_id": effect.external_id, "digest": effect.receipt.get("response_digest")}
    if not found.found:
        kind, observed_digest = ExternalMismatch.Kind.MISSING, ""
        detail = {"recorded": recorded, "now": None}
    else:
        observed = Receipt(found.external_id, to_json_value(found.response))
        changes = _changes(tool, effect, observed)
        other_id = bool(effect.external_id and found.external_id) and (
            effect.external_id != found.external_id
        )
        if changes is None and not other_id:
            report.resolved += ExternalMismatch.resolve(effect)
            return
        kind, observed_digest = ExternalMismatch.Kind.DIFFERENT, digest(observed.response)
        detail = {
            "recorded": recorded,
            "now": {
                "external_id": observed.external_id[:255],
                "digest": observed_digest,
                "shown": shown(observed.response),
            },
            "changes": (changes or {}).get("fields", {}),
        }
    if kind == ExternalMismatch.Kind.MISSING:
        report.missing += 1
    else:
        report.different += 1
    if ExternalMismatch.record(effect, kind, observed_digest, detail) is not None:
        report.recorded += 1


def _changes(tool, effect: SideEffect, observed: Receipt) -> dict | None:
    """What the answer contradicts in what the ledger recorded. A receipt that is the tool's
    own answer is compared whole (its digest). One a person wrote is compared by the tool's
    expected fields: the values the accepted answer had where it has them (a person who
    accepted a changed result), else the snapshot's parameters."""
    if effect.confirmed_by in TOOL_RECEIPTS:
        earlier = effect.receipt.get("response_digest", "")
        now = digest(observed.response)
        return None if not earlier or earlier == now else {"receipt": {"earlier": earlier}}
    answer = effect.receipt.get("response")
    params = {} if effect.snapshot.pruned else dict(effect.snapshot.params or {})
    if isinstance(answer, dict):
        params.update({name: answer[name] for name in tool.expect_fields if name in answer})
    fields = tool.unexpected(params, observed.response)
    return {"fields": fields} if fields else None

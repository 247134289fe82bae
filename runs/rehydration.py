"""Rehydration: the one document a paused run needs to resume (`rehydration_document(run)`),
read from its rows alone — current stage and step, the latest checkpoint, awaited events and
deadlines, the side effects with their keys and external ids, the human decisions, the
escalation — and what its workflow still plans after the recorded steps
(runs.workflows.pending_steps)."""

from __future__ import annotations

from runs.models import Run, SideEffect, Step, Wait
from runs.workflows import pending_steps


def _iso(value):
    return value.isoformat() if value else None


def rehydration_document(run: Run) -> dict:
    """The one document a paused run needs to resume, from the database alone (the third
    source article's fields): run id, current stage and step, latest checkpoint, input
    snapshot ref, awaited event and deadlines, external resource ids, idempotency keys of
    executed side effects, human decision records, failure count and escalation state, the
    recorded reads, and the steps its workflow still plans."""
    steps = list(
        run.steps.order_by("position").values(
            "id",
            "name",
            "iteration",
            "status",
            "kind",
            "stage",
            "tool",
            "finished_at",
            "attempts",
            "read_record",
        )
    )
    done = [s for s in steps if s["status"] in Step.DONE]
    current = next((s for s in steps if s["status"] in Step.UNFINISHED), None)
    waits = list(
        run.waits.filter(status=Wait.Status.PENDING).values(
            "kind", "event_type", "correlation_key", "due_at"
        )
    )
    event_wait = next((w for w in waits if w["kind"] == Wait.Kind.EVENT), None)
    deadlines = [w["due_at"] for w in waits if w["due_at"]]
    effects = list(
        run.side_effects.order_by("created_at").values(
            "idempotency_key",
            "tool",
            "target",
            "status",
            "external_id",
            "confirmed_by",
            "committed_at",
        )
    )
    decisions = list(
        run.decisions.order_by("created_at").values(
            "id", "verb", "user__username", "created_at", "comment", "proof", "step__name"
        )
    )
    last = done[-1] if done else None
    doc = _document(run, current, last, waits, event_wait, deadlines, effects, decisions)
    # What each recorded read was asked and answered (its response only as a summary).
    doc["reads"] = [
        {
            "step": s["name"],
            "iteration": s["iteration"],
            "stage": s["stage"],
            "tool": s["tool"],
            "status": s["status"],
            "params": s["read_record"].get("params"),
            "output": s["read_record"].get("output"),
        }
        for s in steps
        if s["read_record"]
    ]
    # What the workflow still plans after the recorded steps.
    doc.update(pending_steps(run, steps))
    return doc


def _document(run, current, last, waits, event_wait, deadlines, effects, decisions) -> dict:
    return {
        "run_id": str(run.pk),
        "workflow": run.workflow,
        "workflow_version": run.workflow_version,
        "status": run.status,
        "session_context_ref": run.session_context_ref,
        "current_stage": run.stage,
        "current_step": (
            {
                "name": current["name"],
                "iteration": current["iteration"],
                "status": current["status"],
                "kind": current["kind"],
                "attempts": current["attempts"],
            }
            if current
            else None
        ),
        "latest_checkpoint": (
            {
                "step": last["name"],
                "iteration": last["iteration"],
                "status": last["status"],
                "at": _iso(last["finished_at"]),
            }
            if last
            else None
        ),
        "input_snapshot_ref": f"sha256:{run.input_digest}",
        "awaited_event_type": event_wait["event_type"] if event_wait else None,
        "awaited_correlation_key": event_wait["correlation_key"] if event_wait else None,
        "waits": [
            {"kind": w["kind"], "event_type": w["event_type"] or None, "due_at": _iso(w["due_at"])}
            for w in waits
        ],
        "timer_deadline": _iso(min(deadlines)) if deadlines else None,
        "external_resource_ids": [
            {"tool": e["tool"], "target": e["target"], "external_id": e["external_id"]}
            for e in effects
            if e["external_id"]
        ],
        "executed_side_effect_keys": [
            e["idempotency_key"]
            for e in effects
            if e["status"] in (SideEffect.Status.COMMITTED, SideEffect.Status.COMPENSATED)
        ],
        "side_effects": [
            {
                "key": e["idempotency_key"],
                "tool": e["tool"],
                "status": e["status"],
                "external_id": e["external_id"],
                "confirmed_by": e["confirmed_by"],
                "committed_at": _iso(e["committed_at"]),
            }
            for e in effects
        ],
        "human_decisions": [
            {
                "id": d["id"],
                "verb": d["verb"],
                "by": d["user__username"],
                "at": _iso(d["created_at"]),
                "step": d["step__name"],
                "comment": d["comment"],
                "proof": d["proof"],
            }
            for d in decisions
        ],
        "failure_count": run.failure_count,
        "escalation": {
            "level": run.escalation_level,
            "queue": run.queue or None,
            "reason": run.attention_reason or None,
            "due_at": _iso(run.attention_due_at),
            "owner": run.owner.get_username() if run.owner_id else None,
        },
        "timeline_head": {"seq": run.event_seq, "hash": run.event_hash},
    }

"""The timeline's vocabulary: every verb a TimelineEvent may carry, in one place.

The engine and the model verbs write them, the metrics SQL and the drill count them, the console
and the audit pages label them. A verb is `<subject>.<what happened>`; values are stored in the
hash-chained timeline, so they never change once released (add, never rename).
"""

from __future__ import annotations

from enum import StrEnum


class Verb(StrEnum):
    # Runs
    RUN_CREATED = "run.created"
    RUN_STARTED = "run.started"
    RUN_WAITING = "run.waiting"
    RUN_RESUMED = "run.resumed"
    RUN_NEEDS_HUMAN = "run.needs_human"
    RUN_TAKEN_OVER = "run.taken_over"
    RUN_RELEASED = "run.released"
    RUN_COMPENSATING = "run.compensating"
    RUN_SUCCEEDED = "run.succeeded"
    RUN_FAILED = "run.failed"
    RUN_CANCELLED = "run.cancelled"
    RUN_COMPENSATED = "run.compensated"
    RUN_SLA_BREACHED = "run.sla_breached"
    RUN_REQUEUED = "run.requeued"
    # Steps
    STEP_STARTED = "step.started"
    STEP_LEASE_RECLAIMED = "step.lease_reclaimed"
    STEP_SUCCEEDED = "step.succeeded"
    STEP_DEGRADED = "step.degraded"
    STEP_DONE_BY_HAND = "step.done_by_hand"
    STEP_RETRY_SCHEDULED = "step.retry_scheduled"
    STEP_RETRY_REQUESTED = "step.retry_requested"
    STEP_WAITING = "step.waiting"
    STEP_WAITING_FOR_TOOL = "step.waiting_for_tool"
    STEP_TOOL_PAUSED = "step.tool_paused"
    STEP_ESCALATED = "step.escalated"
    STEP_UNKNOWN_OUTCOME = "step.unknown_outcome"
    STEP_FAILED = "step.failed"
    STEP_SKIPPED = "step.skipped"
    STEP_COMPENSATED = "step.compensated"
    STEP_OUTCOME_DISCARDED = "step.outcome_discarded"
    # The side-effect protocol
    SNAPSHOT_WRITTEN = "snapshot.written"
    SIDE_EFFECT_INTENDED = "side_effect.intended"
    SIDE_EFFECT_COMMITTED = "side_effect.committed"
    SIDE_EFFECT_UNKNOWN = "side_effect.unknown"
    SIDE_EFFECT_NOT_COMMITTED = "side_effect.not_committed"
    SIDE_EFFECT_COMPENSATED = "side_effect.compensated"
    SIDE_EFFECT_REUSED = "side_effect.reused"
    SIDE_EFFECT_KEY_CONFLICT = "side_effect.key_conflict"
    SIDE_EFFECT_LOOKUP_FAILED = "side_effect.lookup_failed"
    SIDE_EFFECT_RESEND_WITH_SAME_KEY = "side_effect.resend_with_same_key"
    SIDE_EFFECT_RECHECK_SCHEDULED = "side_effect.recheck_scheduled"
    SIDE_EFFECT_VERIFIED = "side_effect.verified"
    SIDE_EFFECT_VERIFY_FAILED = "side_effect.verify_failed"
    # Found by key, but not as recorded or as the snapshot expects (a person confirms), and
    # a committed effect the external system no longer shows as recorded (the consistency check)
    SIDE_EFFECT_RESULT_CHANGED = "side_effect.result_changed"
    SIDE_EFFECT_EXTERNAL_MISMATCH = "side_effect.external_mismatch"
    SIDE_EFFECT_EXTERNAL_MATCHED = "side_effect.external_matched"
    # Compensation
    COMPENSATION_PLANNED = "compensation.planned"
    COMPENSATION_NOT_AVAILABLE = "compensation.not_available"
    # Waits
    WAIT_OPENED = "wait.opened"
    WAIT_RESOLVED = "wait.resolved"
    WAIT_EXPIRED = "wait.expired"
    WAIT_CANCELLED = "wait.cancelled"
    # People
    APPROVAL_REQUESTED = "approval.requested"
    APPROVAL_APPROVED = "approval.approved"
    # A two-person approval's first approval (the request stays pending).
    APPROVAL_FIRST_APPROVED = "approval.first_approved"
    # The parameters being approved need more approvers than the request asked for (an edit
    # past a two-person threshold): runs.engine.gate's rules, counted on those parameters.
    APPROVAL_APPROVERS_RAISED = "approval.approvers_raised"
    APPROVAL_APPROVED_WITH_EDITS = "approval.approved_with_edits"
    APPROVAL_REJECTED = "approval.rejected"
    APPROVAL_EXPIRED = "approval.expired"
    APPROVAL_CANCELLED = "approval.cancelled"
    # A sealed row's digest (runs/seal.py): a decision, an approval, a takeover, a settlement.
    RECORD_SEALED = "record.sealed"
    TAKEOVER_STARTED = "takeover.started"
    TAKEOVER_ENDED = "takeover.ended"
    # One run's part of a bulk action (approvals/bulk.py), after the action's own events.
    BULK_ACTION_APPLIED = "bulk_action.applied"
    TOOL_RESUMED = "tool.resumed"
    # The engine paused a tool whose API drifted (runs.engine.routing); written on the run whose
    # call found it, and it notifies the admins.
    TOOL_PAUSED = "tool.paused"
    # Requests from API clients, recorded before the action they ask for
    API_CANCEL_REQUESTED = "api.cancel_requested"
    API_DECISION_REQUESTED = "api.decision_requested"
    API_OUTCOME_REQUESTED = "api.outcome_requested"

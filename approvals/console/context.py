"""What a run's page is built from (approvals/console/run_page.py builds it; next_action reads it):
its timeline items, the pending call, and the run's context for a person."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from approvals.console.labels import amount_of
from approvals.models import (
    ApprovalRequest,
    HumanDecision,
)
from runs.models import (
    Run,
    SideEffect,
    Snapshot,
    Step,
    Wait,
)


@dataclass
class TimelineItem:
    name: str
    kind: str
    stage: str
    tool: str
    state: str  # "done", "current", "failed", "skipped", "upcoming"
    step: Step | None = None
    effects: list[SideEffect] = field(default_factory=list)
    # Why a step failed or was skipped, as a person reads it (SafeString; empty when unknown).
    reason: str = ""
    # Set when the step's own status would mislead (a finished run's unfinished step).
    status_label: str = ""


@dataclass
class Pending:
    """What is about to be done: the snapshot of the call, or the approval's proposal."""

    tool: str
    target: str
    params: Any
    permissions: dict
    prior_results: Any
    idempotency_key: str = ""
    snapshot: Snapshot | None = None
    created_at: Any = None

    @property
    def amount(self) -> str:
        return amount_of(self.params)


@dataclass
class RunContext:
    run: Run
    steps: list[Step]
    timeline: list[TimelineItem]
    current: Step | None
    approval: ApprovalRequest | None
    pending: Pending | None
    effects: list[SideEffect]
    decisions: list[HumanDecision]
    routing: dict
    failure_class: str
    reason: str
    suggestion: str
    actions: set[str]
    edit_fields: dict | None
    to_compensate: list[SideEffect]
    wait: Wait | None
    can_act: bool
    viewer: Any = None
    # What is true when there is nothing to do (the actions panel says it).
    idle: str = ""
    # A result found by key that is not what the snapshot expected, side by side (changed_side).
    changed: dict | None = None
    # The committed side effects split by what cancelling or rejecting does to them: undone by
    # their tool's compensating tool, or left for a person to undo by hand (no such tool).
    to_undo: list[SideEffect] = field(default_factory=list)
    by_hand: list[SideEffect] = field(default_factory=list)
    by_hand_queue: str = ""
    # The run's trace when this deployment traces (run_page.trace_of): {"id", "url"}.
    trace: dict | None = None

"""What executing a step produced: one type per kind of outcome, recorded by runs.engine.record
in one transaction."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from runs.models import Receipt, SideEffect
from runs.people import Approval


@dataclass(frozen=True)
class Succeeded:
    result: Any = None
    # A side effect that landed: its ledger row commits with the step, with this receipt.
    committed: tuple[SideEffect, Receipt] | None = None
    # Served by the step's fallback tool: (failure class, error) of the tool that failed, and
    # what the step.degraded event says of the switch (rule, both tools, both keys).
    degraded: tuple[str, str] | None = None
    # A read's parameters and response summary (runs.models.read_record), kept on its step.
    read: dict | None = None
    degraded_details: dict | None = None
    events: list[tuple[str, dict]] = field(default_factory=list)


@dataclass(frozen=True)
class Failed:
    failure_class: str
    error: str
    # A side effect that is known not to have landed (the tool refused it).
    not_committed: SideEffect | None = None
    # Straight to a person, whatever the rules say (a broken approval condition): what the
    # step's routing records instead of a rule.
    to_person: dict | None = None
    events: list[tuple[str, dict]] = field(default_factory=list)

    def __post_init__(self) -> None:
        object.__setattr__(self, "error", self.error[:4000])


@dataclass(frozen=True)
class Recheck:
    """The outcome is unknown and the system has no record yet: ask again at `at`."""

    at: datetime
    error: str


@dataclass(frozen=True)
class UnknownOutcome:
    """The call may or may not have landed and nothing can tell: a person decides."""

    error: str


@dataclass(frozen=True)
class Park:
    """Wait for an event or a timer."""

    kind: str  # Wait.Kind.EVENT or TIMER
    due_at: datetime | None
    event_type: str = ""
    correlation_key: str = ""


@dataclass(frozen=True)
class AskApproval:
    approval: Approval


@dataclass(frozen=True)
class HeldByPause:
    """An admin paused the step's tool: nothing was called."""

    tool: str
    pause: int
    reason: str


Outcome = Succeeded | Failed | Recheck | UnknownOutcome | Park | AskApproval | HeldByPause

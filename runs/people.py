"""What the engine asks of people, and nothing more.

`runs` never imports `approvals`. The engine reaches the people's side — escalation rules, tool
pauses, approval requests, and the sweeps that watch people's deadlines and send notifications —
through this interface, which `approvals` registers when Django starts
(`approvals.apps.ApprovalsConfig.ready`). Without it (the core alone) no rule matches, so every
failure goes to a person; no tool is paused; and an approval step cannot be asked.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from runs.models import Run, Step


class Rule(Protocol):
    """An escalation rule as the router reads it (approvals.models.EscalationRule)."""

    action: str  # a runs.models.RouteAction
    queue: str
    max_attempts: int
    wait_window_seconds: int
    probe_interval_seconds: float
    approval_sla_seconds: int  # a person's SLA for what the rule hands them (0: none)
    escalate_to: str  # the queue an SLA breach moves the run to ("" keeps it)
    escalate_after_seconds: int  # the SLA after a breach (0: none)

    def approvers_for(self, params: Any) -> int: ...  # distinct approvers an approval needs

    def backoff(self, attempt: int) -> timedelta: ...

    def describe(self) -> dict[str, Any]: ...

    def matches(
        self, *, workflow: str, step: str, tool: str, failure_class: str, risk: str
    ) -> bool: ...


def first_matching(rules: Iterable[Rule], **match: str) -> Rule | None:
    """The rule that routes a failure: the first of `rules` (in routing order, enabled ones
    only) that matches it. The one definition of "first match": the engine's rules read from the
    database and a rule set tested against history (approvals.rules_history) both go through it."""
    return next((rule for rule in rules if rule.matches(**match)), None)


@dataclass(frozen=True)
class Pause:
    """An admin's pause of a tool: no call is made while it holds."""

    pk: int
    reason: str


@dataclass(frozen=True)
class Approval:
    """What a person is asked to approve, exactly as they will be shown it."""

    queue: str
    reason: str
    risk: str
    tool: str
    proposed_params: dict
    due_at: datetime | None
    approvals_required: int = 1  # distinct people who must approve (the matching rule's)


class People(Protocol):
    def rule_for(
        self, *, workflow: str, step: str, tool: str, failure_class: str, risk: str
    ) -> Rule | None:
        """The first enabled escalation rule that matches, read at routing time."""

    def pause_of(self, tool: str) -> Pause | None:
        """The admin's open pause of `tool`, if any (checked before every call)."""

    def pauses_statement(self) -> str | None:
        """Every open pause as one SQL value, a JSON object {tool: [id, reason]}, for the
        engine's one-round-trip claims (runs.engine.inline); None when no tool can be paused."""

    def pause_for_drift(self, tool: str, reason: str) -> tuple[Pause, bool] | None:
        """Open a pause of `tool` on the engine's behalf (its API drifted), in the engine's
        transaction, for the admins to resume: (pause, created); an open pause is kept. None
        when no tool can be paused."""

    def ask(self, run: Run, step: Step, approval: Approval) -> int:
        """Open the approval request, in the engine's transaction; returns its id."""

    def sweep(self, now: datetime, batch: int, hint: Callable[[Any], None]) -> dict[str, int]:
        """The people's side of a sweeper pass: escalate runs past a person's SLA, send due
        notifications. Calls `hint(run_id)` for runs that have work for a worker again."""


class NoPeople:
    """The core alone: no rules, no pauses, nobody to ask."""

    def rule_for(self, **match: str) -> None:
        return None

    def pause_of(self, tool: str) -> None:
        return None

    def pauses_statement(self) -> None:
        return None

    def pause_for_drift(self, tool: str, reason: str) -> None:
        return None

    def ask(self, run: Run, step: Step, approval: Approval) -> int:
        raise RuntimeError("approval steps need the approvals app (INSTALLED_APPS)")

    def sweep(self, now: datetime, batch: int, hint: Callable[[Any], None]) -> dict[str, int]:
        return {}


_people: People = NoPeople()


def register(people: People) -> None:
    global _people
    _people = people


def people() -> People:
    return _people

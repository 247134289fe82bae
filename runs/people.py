"""What the engine asks of people, and nothing more.

`runs` never imports `approvals`. The engine reaches the people's side — escalation rules, tool
pauses, approval requests, and the sweeps that watch people's deadlines and send notifications —
through this interface, which `approvals` registers when Django starts
(`approvals.apps.ApprovalsConfig.ready`). Without it (the core alone) no rule matches, so every
failure goes to a person; no tool is paused; an approval step cannot be asked; and every tool is
as its code registered it.
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

    def approvers_for(self, params: Any, tool: Any = None) -> int: ...  # approvers needed

    def backoff(self, attempt: int) -> timedelta: ...

    def describe(self) -> dict[str, Any]: ...

    def matches(
        self, *, workflow: str, step: str, tool: str, failure_class: str, risk: str
    ) -> bool: ...


def first_matching(rules: Iterable[Rule], **match: str) -> Rule | None:
    """The rule that routes a failure: the first of `rules` (in routing order, enabled ones
    only) that matches it. The one definition of "first match": the engine's rules read from the
    database and a rule set tested against history (approvals.rules_history) both go through it.
    Rules whose action is `approve` route nothing (they put calls behind approval:
    runs.engine.gate) and are passed over."""
    return next(
        (rule for rule in rules if rule.action != "approve" and rule.matches(**match)), None
    )


@dataclass(frozen=True)
class Pause:
    """An admin's pause of a tool: no call is made while it holds."""

    pk: int
    reason: str


@dataclass(frozen=True)
class Requirement:
    """How many distinct people must approve a call with these parameters, and why (the gate,
    runs.engine.gate). 0: no approval is needed."""

    approvers: int = 0
    # Why, for people: "the workflow asks for approval at approve_refund", a rule's name.
    reasons: tuple[str, ...] = ()
    # The rules that asked (their describe()), for the snapshot and the timeline.
    rules: tuple[dict, ...] = ()
    # Where a person is asked when no approval in force covers the call, and their SLA.
    queue: str = "support"
    sla_seconds: int = 0
    # When worked out from rules a process had cached: a parameterless SQL read and the value
    # it gives while those are still the rules in force (the hot path's statement checks it).
    guard: tuple[str, str] | None = None

    def record(self) -> dict[str, Any]:
        return {"required": self.approvers, "reasons": list(self.reasons)}


@dataclass(frozen=True)
class Grant:
    """A decided approval in force: who approved which parameters (their digest), under which
    conditions, and the decision a snapshot names when it executes it."""

    approval: int
    params: Any
    params_digest: str
    # The distinct authenticated people who approved (usernames), in order.
    approvers: tuple[str, ...]
    decision: dict[str, Any]
    conditions: tuple[dict, ...] = ()
    by: str = ""


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
    # The rules that asked for people, each {rule_id, rule, version, approvers, amount?,
    # records?}: what the run page shows as why (approvals.gate).
    because: tuple = ()


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

    def requirement(
        self,
        *,
        workflow: str,
        step: str,
        tool: Any,  # a runs.tools.Tool
        params: Any,
        declared: str = "",
        cached: bool = False,
    ) -> Requirement:
        """How many people must approve this call of `tool` with `params`: the rules' answer
        for exactly these parameters, at least one when the workflow declared an approval of
        the tool (`declared`: that approval step's name). `cached`: the rules as this process
        last read them, no query (the hot path; the answer's `guard` must then hold)."""

    def scopes_for(self, user: Any) -> frozenset[str]:
        """The API scopes a person's role allows their tokens (runs.api.auth)."""

    def rules_statement(self) -> str | None:
        """A SQL scalar: the stamp of the approval rules in force (a new value with every
        change), read by the engine's one-round-trip statements (runs.engine.inline) so the
        rules a worker has cached are those of its last statement; None when no rule can ask
        for approval."""

    def rules_seen(self, value: Any) -> None:
        """What `rules_statement` read: cached rules with another stamp are dropped."""

    def grants(self, run_id: Any, tools: tuple[str, ...], step_id: int) -> list[Grant]:
        """The run's decided approvals of `tools` that may still cover a call of step
        `step_id`, newest first: approved, and not executed by another step's call."""

    def local_metadata(self, tool: Any) -> Any:
        """The tool (a runs.tools.Tool: typed loosely, as runs.tools asks this module) as this
        deployment's admins decided it (the same object when nothing is
        overridden): runs.tools.get asks on every lookup, so it must be cheap (cached)."""

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

    def requirement(self, *, declared: str = "", **_: Any) -> Requirement:
        return Requirement(1, ("the workflow asks for approval",)) if declared else Requirement()

    def grants(self, run_id: Any, tools: tuple[str, ...], step_id: int) -> list[Grant]:
        return []

    def scopes_for(self, user: Any) -> frozenset[str]:
        # No roles without the people's side: a person reads runs, nothing more.
        return frozenset({"runs:read"}) if user.is_active else frozenset()

    def rules_statement(self) -> None:
        return None

    def rules_seen(self, value: Any) -> None:
        return None

    def local_metadata(self, tool: Any) -> Any:
        return tool  # as registered

    def sweep(self, now: datetime, batch: int, hint: Callable[[Any], None]) -> dict[str, int]:
        return {}


_people: People = NoPeople()


def register(people: People) -> None:
    global _people
    _people = people


def people() -> People:
    return _people

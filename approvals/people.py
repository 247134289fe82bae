"""The people's side of the engine (runs.people): escalation rules, tool pauses, approval
requests and the sweeps over people's deadlines, registered by ApprovalsConfig.ready."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from approvals import gate, local_metadata, permissions, sla
from approvals.models import ApprovalRequest, EscalationRule, ToolPause
from runs import people
from runs.models import Run, Step
from runs.tools import Tool


class People:
    def rule_for(
        self, *, workflow: str, step: str, tool: str, failure_class: str, risk: str
    ) -> EscalationRule | None:
        return EscalationRule.first_match(
            workflow=workflow, step=step, tool=tool, failure_class=failure_class, risk=risk
        )

    def pause_of(self, tool: str) -> people.Pause | None:
        pause = ToolPause.active_for(tool)
        return people.Pause(pause.pk, pause.reason) if pause is not None else None

    def pauses_statement(self) -> str:
        return ToolPause.open_statement()

    def pause_for_drift(self, tool: str, reason: str) -> tuple[people.Pause, bool]:
        pause, created = ToolPause.open_by_engine(tool, reason)
        return people.Pause(pause.pk, pause.reason), created

    def ask(self, run: Run, step: Step, approval: people.Approval) -> int:
        return ApprovalRequest.open(run, step, approval).pk

    def requirement(self, **call: Any) -> people.Requirement:
        return gate.requirement(**call)

    def grants(self, run_id: Any, tools: tuple[str, ...], step_id: int) -> list[people.Grant]:
        return gate.grants(run_id, tools, step_id)

    def scopes_for(self, user: Any) -> frozenset[str]:
        return permissions.api_scopes(user)

    def rules_statement(self) -> str:
        return gate.RULES_STAMP_SQL

    def rules_seen(self, value: Any) -> None:
        gate.rules_seen(value)

    def local_metadata(self, tool: Tool) -> Tool:
        return local_metadata.CACHE.apply(tool)

    def sweep(self, now: datetime, batch: int, hint: Callable[[Any], None]) -> dict[str, int]:
        breaches = 0
        for run_id in sla.overdue_runs(now, batch):
            if sla.escalate_overdue(run_id, now):
                breaches += 1
                hint(run_id)  # a rule that compensates has work for a worker
        # Notifications: record those new timeline events ask for, send what is due. Imported
        # here, not at start: behind them are the console's forms (approvals.tasks).
        from approvals import notifications

        return {"sla_breaches": breaches, "notifications_due": notifications.sweep(now, batch)}

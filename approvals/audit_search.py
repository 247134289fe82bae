"""Search across runs for auditors: the console's audit page and `export_audit` use the same
query, over the runs' records and the people's (approvals, decisions)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import Exists, OuterRef, Q

from approvals import viewer_time
from approvals.models import ApprovalRequest, HumanDecision
from runs.models import Run, SideEffect, Step, TimelineEvent

# Outcome filters: the run's final status, an open side effect nobody can vouch for, or how a
# person decided its approval.
OUTCOMES = (
    "succeeded",
    "failed",
    "cancelled",
    "compensated",
    "open",
    "needs_human",
    "unknown_outcome",
    "approved",
    "approved_with_edits",
    "rejected",
    "human_decision",
)


@dataclass
class AuditQuery:
    date_from: Any = None  # date: runs started on or after
    date_to: Any = None  # date: runs started on or before
    workflow: str = ""
    tool: str = ""
    target: str = ""  # target resource, prefix
    actor: str = ""  # "ada" means user:ada; "api:crm-bot" or "system" as written
    outcome: str = ""

    def as_dict(self) -> dict[str, str]:
        return {k: str(v) for k, v in self.__dict__.items() if v}

    def actor_values(self) -> list[str]:
        actor = self.actor.strip()
        if not actor:
            return []
        return [actor] if ":" in actor or actor == "system" else [f"user:{actor}", actor]

    def runs(self):
        """A Run queryset, newest first. Every filter is an indexed column or an EXISTS on an
        indexed foreign key, so a page costs the same few queries whatever matches."""
        runs = Run.objects.all()
        runs = viewer_time.filter_days(runs, self.date_from or None, self.date_to or None)
        if self.workflow:
            runs = runs.filter(workflow=self.workflow)
        if self.tool:
            runs = runs.filter(Exists(Step.objects.filter(run=OuterRef("pk"), tool=self.tool)))
        if self.target.strip():
            runs = runs.filter(
                Exists(
                    SideEffect.objects.filter(
                        run=OuterRef("pk"), target__startswith=self.target.strip()
                    )
                )
            )
        actors = self.actor_values()
        if actors:
            runs = runs.filter(
                Exists(TimelineEvent.objects.filter(run=OuterRef("pk"), actor__in=actors))
            )
        outcome = self.outcome
        if outcome in ("succeeded", "failed", "cancelled", "compensated", "needs_human"):
            runs = runs.filter(status=outcome)
        elif outcome == "open":
            runs = runs.exclude(status__in=Run.TERMINAL)
        elif outcome == "unknown_outcome":
            runs = runs.filter(
                Exists(SideEffect.objects.filter(run=OuterRef("pk"), status="unknown"))
                | Exists(Step.objects.filter(run=OuterRef("pk"), status="unknown_outcome"))
            )
        elif outcome in ("approved", "approved_with_edits", "rejected"):
            decided = ApprovalRequest.objects.filter(run=OuterRef("pk"), decision=outcome)
            users = [a.removeprefix("user:") for a in actors if a.startswith("user:")]
            if users:  # "approved by this user": the approver, not just anyone on the run
                decided = decided.filter(decided_by__username__in=users)
            runs = runs.filter(Exists(decided))
        elif outcome == "human_decision":
            decisions = HumanDecision.objects.filter(run=OuterRef("pk"))
            users = [a.removeprefix("user:") for a in actors if a.startswith("user:")]
            if users:
                decisions = decisions.filter(user__username__in=users)
            runs = runs.filter(Q(Exists(decisions)))
        return runs.order_by("-created_at", "-id")

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


# A request's decision → what the person who made it did (HumanDecision.verb).
PERSON_VERBS = {
    "approved": HumanDecision.Verb.APPROVE,
    "approved_with_edits": HumanDecision.Verb.APPROVE_WITH_EDITS,
    "rejected": HumanDecision.Verb.REJECT,
}


@dataclass
class AuditQuery:
    date_from: Any = None  # date: runs started on or after
    date_to: Any = None  # date: runs started on or before
    workflow: str = ""
    tool: str = ""
    target: str = ""  # target resource, prefix
    actor: str = ""  # "ada" means user:ada; "api:crm-bot" or "system" as written
    outcome: str = ""
    business_key: str = ""  # exact (the run_business_key unique index)

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
        if self.business_key.strip():
            runs = runs.filter(business_key=self.business_key.strip())
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
            runs = runs.filter(self._decided(outcome, actors))
        elif outcome == "human_decision":
            decisions = HumanDecision.objects.filter(run=OuterRef("pk"))
            users = [a.removeprefix("user:") for a in actors if a.startswith("user:")]
            if users:
                decisions = decisions.filter(user__username__in=users)
            runs = runs.filter(Q(Exists(decisions)))
        return runs.order_by("-created_at", "-id")

    @staticmethod
    def _decided(outcome: str, actors: list[str]) -> Exists:
        """Runs whose approval was decided so, or, with an actor, runs where that person
        decided so: their own decision counts, the first of a two-person approval included.
        (The request's `decided_by` is the second approver only, so it missed the first.)"""
        users = [a.removeprefix("user:") for a in actors if a.startswith("user:")]
        if not users:
            return Exists(ApprovalRequest.objects.filter(run=OuterRef("pk"), decision=outcome))
        return Exists(
            HumanDecision.objects.filter(
                run=OuterRef("pk"), user__username__in=users, verb=PERSON_VERBS[outcome]
            )
        )

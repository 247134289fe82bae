"""The inbox and run-list queries: the current step of each run, the reasons and filters, the
search by short id or business key."""

from __future__ import annotations

from django.db.models import Count, Exists, F, OuterRef, Q, QuerySet, Subquery
from django.db.models.fields.json import KT
from django.db.models.functions import JSONObject
from django.utils import timezone

from approvals import viewer_time
from approvals.console.labels import SECOND_APPROVAL
from approvals.models import (
    ApprovalRequest,
    SoftClaim,
    known_queues,
)
from runs import workflows as workflow_registry
from runs.models import (
    Run,
    Step,
)

# --------------------------------------------------------------------------------------------
# Inbox and run list


def _current_step_subquery():
    """The run's first unfinished step, as one JSON value (one subquery per page row)."""
    return Subquery(
        Step.objects.filter(run=OuterRef("pk"), status__in=Step.UNFINISHED)
        .order_by("position")
        .values(
            info=JSONObject(
                name="name",
                kind="kind",
                status="status",
                error_class="error_class",
                tool="tool",
                action=KT("routing__action"),
            )
        )[:1]
    )


def reason_of(step_info: dict | None) -> str:
    if not step_info:
        return ""
    if step_info.get("status") == "needs_human" and (
        step_info.get("kind") == "approval" or step_info.get("action") == "approve"
    ):
        return "approval"  # an approval step, or a call the gate stopped for approval
    return step_info.get("error_class") or ""


PARKED_STATUSES = (Step.Status.NEEDS_HUMAN, Step.Status.UNKNOWN_OUTCOME)


def _reason_filter(reason: str) -> Q:
    return reason_filter(reason)


def reason_filter(reason: str, tool: str = "") -> Q:
    """Runs with a step parked for a person for `reason` (a failure class or "approval"), and
    calling `tool` when given: what the inbox's Reason filter, its incident groups
    (approvals/incidents.py) and a bulk action started from the inbox all select by."""
    parked = Step.objects.filter(run=OuterRef("pk"), status__in=PARKED_STATUSES)
    if tool:
        parked = parked.filter(tool=tool)
    if reason == "approval":
        return Q(Exists(parked.filter(awaits_approval())))
    if reason == SECOND_APPROVAL:
        return Q(Exists(_two_person_pending().filter(first_approved_by__isnull=False)))
    return Q(Exists(parked.filter(error_class=reason).exclude(awaits_approval())))


def _two_person_pending() -> QuerySet[ApprovalRequest]:
    return ApprovalRequest.objects.filter(
        run=OuterRef("pk"), status=ApprovalRequest.Status.PENDING, approvals_required__gt=1
    )


def _approvals_given_subquery():
    """A pending two-person approval's progress as one JSON value ({required, first}; NULL
    when the run waits for no such approval): the inbox's "1 of 2 approvals"."""
    return Subquery(
        _two_person_pending().values(
            info=JSONObject(required="approvals_required", first="first_approved_by_id")
        )[:1]
    )


def unclaimed() -> Q:
    """Nobody said “I'll handle it” (approvals/live.py)."""
    claimed = SoftClaim.objects.filter(run=OuterRef("pk"), expires_at__gt=timezone.now())
    return ~Q(Exists(claimed))


def awaits_approval() -> Q:
    """A parked step that waits for people's approval: an approval step, or a side effect
    the gate stopped (runs.engine.gate: its routing's action is `approve`)."""
    # Containment, not a key lookup: a routing without an action is false here, never NULL
    # (which would drop it from an exclude() as well).
    return Q(kind="approval") | Q(routing__contains={"action": "approve"})


def inbox_queryset(user, *, queue="", workflow="", reason="", owner="") -> QuerySet[Run]:
    """Runs waiting for a person, most urgent SLA first (earliest due; no SLA last; then oldest).

    Served by the partial index run_inbox_idx (attention_due_at, created_at) on human statuses.
    """
    runs = Run.objects.filter(status__in=Run.HUMAN)
    if queue:
        runs = runs.filter(queue=queue)
    if workflow:
        runs = runs.filter(workflow=workflow)
    if reason:
        runs = runs.filter(_reason_filter(reason))
    if owner == "mine":
        runs = runs.filter(owner=user)
    elif owner == "unassigned":
        runs = runs.filter(owner__isnull=True)
    elif owner == "unclaimed":
        runs = runs.filter(unclaimed())
    return (
        runs.select_related("owner")
        .annotate(current=_current_step_subquery(), two_person=_approvals_given_subquery())
        .order_by(F("attention_due_at").asc(nulls_last=True), "created_at", "id")
    )


def inbox_counts(user, now=None) -> dict[str, int]:
    now = now or timezone.now()
    return Run.objects.filter(status__in=Run.HUMAN).aggregate(
        total=Count("id"),
        overdue=Count("id", filter=Q(attention_due_at__lt=now)),
        mine=Count("id", filter=Q(owner=user)),
        unassigned=Count("id", filter=Q(owner__isnull=True)),
    )


def filter_choices() -> dict[str, list[str]]:
    """Queues from the escalation rules (plus approval queues in use by workflows), workflows
    from the registry: no scan of the runs table."""
    workflows = {definition.name for definition in workflow_registry.all_workflows()}
    return {"queues": known_queues(), "workflows": sorted(workflows)}


def search_runs(*, q="", workflow="", status="", date_from=None, date_to=None) -> QuerySet[Run]:
    """The console's run search: the one run filter (Run.objects.filtered), with days in the
    viewer's zone as ranges of created_at."""
    after, before = viewer_time.day_range(date_from, date_to)
    return Run.objects.select_related("owner").filtered(
        search=q, workflow=workflow, status=status, created_after=after, created_before=before
    )

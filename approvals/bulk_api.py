"""The API's bulk actions (approvals/bulk.py): preview the action on the filtered runs as the
person who authenticated (a personal token or a delegation: runs.api.auth), execute the
preview, read where it stands. The console's rules apply (cancel is admin-only; per run, the
single action's rules, soft claims included), and each action needs the scopes of the single
action it performs: `approvals:write` to act as a person, and `runs:write` to cancel."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal
from uuid import UUID

from ninja import Field, Path, Router, Schema
from ninja.decorators import decorate_view

from approvals import actions, bulk, viewer_time
from approvals.api import PERSON_FIELD, acting_person
from approvals.models.bulk import BulkAction
from runs.api.auth import BearerAuth, Caller
from runs.api.base import (
    BODY_ERRORS,
    MAX_BIGINT,
    Identifier,
    StrictIn,
    api_client,
    errors,
    json_body,
)
from runs.api.errors import ApiError
from runs.api.models import ApiScope
from runs.api.schema import free_text
from runs.models import FailureClass, Run

# A calendar day whose UTC day has an end (0001-01-01 … 9999-12-30), or "" (no filter).
DAY = viewer_time.DAY_PATTERN
Reason = Literal[("", "approval", *FailureClass.values)]
Status = Literal[("", "inbox", *(s for s in Run.Status.values if s not in Run.TERMINAL))]

# A run id as lists show and APIs return it (hex digits, dashes optional).
RUN_ID = r"^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$"

router = Router()


class BulkFiltersIn(StrictIn):
    # Names: identifiers, like everywhere else (no invisible, control or format characters).
    workflow: Identifier = Field("", max_length=100)
    step: Identifier = Field("", max_length=100)
    tool: Identifier = Field("", max_length=200)
    reason: Reason = Field("", description="a failure class, or `approval`")
    queue: Identifier = Field("", max_length=100)
    status: Status = Field("", description="an unfinished run status, or `inbox`")
    owner: Literal["", "mine", "unassigned", "unclaimed"] = Field(
        "", description="`unclaimed`: nobody said they are handling it (a soft claim)"
    )
    date_from: str = Field("", pattern=DAY, description="YYYY-MM-DD: started on or after")
    date_to: str = Field("", pattern=DAY, description="YYYY-MM-DD: started on or before")
    runs: list[Annotated[str, Field(pattern=RUN_ID)]] = Field(
        default_factory=list,
        max_length=1000,
        description="only these runs (picked one by one): their ids",
    )

    def as_filters(self) -> dict:
        """As approvals/bulk.py takes them: the ids comma-separated (each checked there)."""
        found = self.model_dump()
        found["runs"] = ",".join(self.runs)
        return found


class BulkPreviewIn(StrictIn):
    user: Identifier | None = Field(None, min_length=1, max_length=150, description=PERSON_FIELD)
    action: Literal[
        "retry", "confirm_happened", "confirm_not_happened", "release", "reassign", "cancel"
    ]
    filters: BulkFiltersIn = Field(default_factory=BulkFiltersIn)
    comment: str = free_text("", max_length=4000)
    needed_engineer: bool | None = None
    to: Identifier | None = Field(
        None, max_length=150, description="reassign: the new owner (taken-over runs)"
    )
    to_queue: Identifier | None = Field(
        None, max_length=100, description="reassign: the new queue (runs waiting for a person)"
    )
    despite_claims: bool = Field(
        False,
        description="also act on runs someone else said they are handling (their soft claim); "
        "otherwise those runs are skipped, with who holds them",
    )


class BulkExecuteIn(StrictIn):
    user: Identifier | None = Field(None, min_length=1, max_length=150, description=PERSON_FIELD)


class BulkControlIn(StrictIn):
    user: Identifier | None = Field(None, min_length=1, max_length=150, description=PERSON_FIELD)
    move: Literal["pause", "resume", "stop"] = Field(
        ..., description="pause (resumable) or stop (for good) between runs, or resume"
    )


class BulkItemOut(Schema):
    run_id: UUID
    status: str
    plan: str
    reason: str
    expected_version: int
    evidence: dict


class BulkOut(Schema):
    id: int
    action: str
    status: str
    user: str
    matched: int
    capped: bool
    counts: dict[str, int]
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    tool_health: dict = Field(..., description="what the preview found of the tools a retry calls")
    retry_of: int | None = Field(..., description="the job whose failed runs this one retries")
    items: list[BulkItemOut] = Field(..., description="the first 100 runs, in order")


def bulk_out(job: BulkAction) -> dict:
    items = job.items.order_by("position")[:100]
    return {
        "id": job.pk,
        "action": job.action,
        "status": job.status,
        "user": job.user.get_username(),
        "matched": job.matched,
        "capped": job.capped,
        "counts": job.counts(),
        "created_at": job.created_at,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
        "tool_health": job.tool_health,
        "retry_of": job.retry_of_id,
        "items": [
            {
                "run_id": i.run_id,
                "status": i.status,
                "plan": i.plan,
                "reason": i.reason,
                "expected_version": i.expected_version,
                "evidence": i.evidence,
            }
            for i in items
        ],
    }


# The scope of the single action each bulk action performs, beyond approvals:write (acting as
# a person): cancelling runs is runs:write, as POST /runs/{id}/cancel.
ACTION_SCOPES = {"cancel": ApiScope.RUNS_WRITE}


def _require_action_scopes(caller: Caller, action: str) -> None:
    scope = ACTION_SCOPES.get(action)
    if scope and not caller.has_scope(scope):
        raise ApiError(
            403,
            "missing_scope",
            f"A bulk {action} needs the {scope} scope, as the single action does.",
            field="action",
        )


def _job(bulk_id: int) -> BulkAction:
    job = BulkAction.objects.select_related("user").filter(pk=bulk_id).first()
    if job is None:
        raise ApiError(404, "not_found", f"No bulk action {bulk_id}.", field="bulk_id")
    return job


@router.post(
    "/bulk-actions/preview",
    auth=BearerAuth(ApiScope.APPROVALS_WRITE),
    response={200: BulkOut, **errors(403, *BODY_ERRORS)},
    summary="Preview a bulk action on the runs the filters match",
    description=(
        "Freezes the set (at most 1000 runs, oldest first): per run its version, what the "
        "action will do, or why it is skipped. Nothing is done to any run until it is executed."
    ),
    tags=["bulk actions"],
)
@decorate_view(json_body)
def preview(request, body: BulkPreviewIn):
    caller = api_client(request)
    user = acting_person(caller, body.user)
    _require_action_scopes(caller, body.action)
    params = {
        "comment": body.comment,
        "needed_engineer": body.needed_engineer,
        "to": body.to,
        "to_queue": body.to_queue,
        "despite_claims": body.despite_claims,
    }
    try:
        job = bulk.preview(user, body.action, body.filters.as_filters(), params)
    except bulk.BulkError as exc:
        field = f"filters.{exc.field}" if exc.field in bulk.FILTERS else exc.field
        raise ApiError(422, exc.code, str(exc), field=field) from None
    except actions.ActionForbidden as exc:
        raise ApiError(403, exc.code, str(exc), field="user") from None
    caller.touch()
    return bulk_out(job)


@router.post(
    "/bulk-actions/{bulk_id}/execute",
    auth=BearerAuth(ApiScope.APPROVALS_WRITE),
    response={200: BulkOut, **errors(403, 404, 409, *BODY_ERRORS)},
    summary="Execute a previewed bulk action (in the background)",
    tags=["bulk actions"],
)
@decorate_view(json_body)
def execute(request, body: BulkExecuteIn, bulk_id: int = Path(..., ge=1, le=MAX_BIGINT)):
    caller = api_client(request)
    user = acting_person(caller, body.user)
    job = _job(bulk_id)
    _require_action_scopes(caller, job.action)
    try:
        job = bulk.start(job, user)
    except actions.ActionForbidden as exc:
        raise ApiError(403, exc.code, str(exc), field="user") from None
    except actions.DecisionConflict as exc:
        raise ApiError(409, "conflict", str(exc)) from None
    caller.touch()
    return bulk_out(job)


@router.post(
    "/bulk-actions/{bulk_id}/control",
    auth=BearerAuth(ApiScope.APPROVALS_WRITE),
    response={200: BulkOut, **errors(403, 404, 409, *BODY_ERRORS)},
    summary="Pause, resume or stop a running bulk action (its owner or an admin)",
    description="The worker reads the job's status before each run: the run in hand finishes.",
    tags=["bulk actions"],
)
@decorate_view(json_body)
def control(request, body: BulkControlIn, bulk_id: int = Path(..., ge=1, le=MAX_BIGINT)):
    caller = api_client(request)
    user = acting_person(caller, body.user)
    job = _job(bulk_id)
    try:
        job = bulk.control(job, user, body.move)
    except actions.ActionForbidden as exc:
        raise ApiError(403, exc.code, str(exc), field="user") from None
    except actions.DecisionConflict as exc:
        raise ApiError(409, "conflict", str(exc)) from None
    caller.touch()
    return bulk_out(job)


@router.post(
    "/bulk-actions/{bulk_id}/retry-failed",
    auth=BearerAuth(ApiScope.APPROVALS_WRITE),
    response={200: BulkOut, **errors(403, 404, 409, *BODY_ERRORS)},
    summary="Preview the same action again over the runs that failed or went back to a person",
    tags=["bulk actions"],
)
@decorate_view(json_body)
def retry_failed(request, body: BulkExecuteIn, bulk_id: int = Path(..., ge=1, le=MAX_BIGINT)):
    caller = api_client(request)
    user = acting_person(caller, body.user)
    job = _job(bulk_id)
    _require_action_scopes(caller, job.action)
    if job.status in (BulkAction.Status.PREVIEWED, BulkAction.Status.RUNNING):
        raise ApiError(409, "conflict", "Pause, stop or let it finish first.")
    try:
        retry = bulk.retry_failed(job, user)
    except bulk.BulkError as exc:
        raise ApiError(409, "conflict", str(exc)) from None
    except actions.ActionForbidden as exc:
        raise ApiError(403, exc.code, str(exc), field="user") from None
    caller.touch()
    return bulk_out(retry)


@router.get(
    "/bulk-actions/{bulk_id}",
    auth=BearerAuth(ApiScope.RUNS_READ),
    response={200: BulkOut, **errors(404)},
    summary="A bulk action: its status, counts and first runs",
    tags=["bulk actions"],
)
def get_bulk(request, bulk_id: int = Path(..., ge=1, le=MAX_BIGINT)):
    return bulk_out(_job(bulk_id))

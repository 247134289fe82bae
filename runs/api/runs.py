"""The API's run endpoints: start a run (idempotent by business key), read one, list them with
cursor pagination, deliver an event."""

from __future__ import annotations

from datetime import datetime
from typing import Literal
from uuid import UUID

from django.conf import settings
from django.db import transaction
from ninja import Field, Query, Router, Schema, Status
from ninja.decorators import decorate_view

from runs import engine
from runs import workflows as workflow_registry
from runs.api import schema as api_schema
from runs.api.auth import BearerAuth, SignatureAuth
from runs.api.base import (
    BODY_ERRORS,
    EVENTS_STRICT,
    Cursor,
    Identifier,
    RunOut,
    RunSummary,
    StrictIn,
    WorkflowVersion,
    api_client,
    errors,
    json_body,
    run_out,
    run_summary,
)
from runs.api.errors import ApiError
from runs.api.models import ApiClient, ApiScope
from runs.api.schema import IsoDateTime, JsonObject
from runs.models import InboundEvent, Run, RunStatus

router = Router()


def _events_strict() -> bool:
    return bool(getattr(settings, "TASKPILOTS", {}).get("EVENTS_STRICT", EVENTS_STRICT))


class StartRunIn(StrictIn):
    workflow: Identifier = Field(..., min_length=1, max_length=100)
    version: WorkflowVersion | None = None
    input: JsonObject
    business_key: Identifier = Field(..., min_length=1, max_length=200)
    session_context_ref: Identifier = Field(
        "",
        max_length=200,
        description="optional opaque reference to the conversation or session that asked for "
        "the run; kept on the run and in every snapshot (empty: the snapshots name it missing)",
    )


class RunPage(Schema):
    items: list[RunSummary]
    next_cursor: str | None = Field(
        None, description="Pass as `cursor` to get the next page; null on the last page."
    )


class RunFilters(Schema):
    workflow: Identifier | None = Field(None, max_length=100)
    status: RunStatus | None = None
    business_key: Identifier | None = Field(None, max_length=200)
    created_after: IsoDateTime | None = Field(
        None, description="inclusive; ISO 8601 (without an offset: UTC)"
    )
    created_before: IsoDateTime | None = Field(
        None, description="exclusive; ISO 8601 (without an offset: UTC)"
    )
    cursor: Cursor | None = Field(
        None, max_length=200, description="`next_cursor` of the previous page"
    )
    limit: int = Field(50, ge=1, le=100)


class EventIn(StrictIn):
    event_id: Identifier = Field(..., min_length=1, max_length=200)
    event_type: Identifier = Field(..., min_length=1, max_length=150)
    correlation_key: Identifier = Field(..., min_length=1, max_length=255)
    payload: JsonObject = Field(default_factory=dict)


class EventOut(Schema):
    status: Literal["resumed", "stored", "duplicate"]
    event_id: str
    run_id: UUID | None = Field(None, description="the run the event resumed, once matched")


def _encode_cursor(run: Run) -> str:
    return api_schema.encode_cursor(run.created_at, run.pk)


def _decode_cursor(cursor: str) -> tuple[datetime, UUID]:
    position = api_schema.decode_cursor(cursor)
    if position is None:
        raise ApiError(
            400, "invalid_cursor", "The cursor is not one this API gave out.", field="cursor"
        )
    return position


@router.post(
    "/runs",
    auth=BearerAuth(ApiScope.RUNS_WRITE),
    response={201: RunOut, 200: RunOut, **errors(409, *BODY_ERRORS)},
    summary="Start a run (idempotent by business_key)",
    description=(
        "201 with the new run. The same business_key with the same workflow and input again: "
        "200 with the existing run (safe to retry, also concurrently). The same key with another "
        "workflow or other input: 409. A client without runs:read gets 409 instead of a run "
        "another client started; `run_id` is only given for runs the client may read."
    ),
    tags=["runs"],
)
@decorate_view(json_body)
def start_run(request, body: StartRunIn):
    client = api_client(request)
    try:
        workflow_registry.get(body.workflow, body.version)
    except workflow_registry.UnknownWorkflow as exc:
        field = "version" if body.version is not None else "workflow"
        try:
            workflow_registry.get(body.workflow)
        except workflow_registry.UnknownWorkflow:
            field = "workflow"
        raise ApiError(422, "unknown_workflow", str(exc), field=field) from None
    try:
        run, created = engine.start_run(
            body.workflow,
            body.input,
            version=body.version,
            business_key=body.business_key,
            principal=client.actor,
            session_context_ref=body.session_context_ref,
            actor=client.actor,
        )
    except engine.BusinessKeyConflict as exc:
        raise _key_conflict(client, body.business_key, exc.run, exc.why) from None
    except engine.StartError as exc:
        raise ApiError(422, "invalid_input", str(exc), field="input") from None
    if not created and not _may_read(client, run):
        # Resending someone else's key and input must not hand their run to a client that
        # cannot read runs.
        raise _key_conflict(client, body.business_key, run, "taken")
    client.touch()
    return Status(201 if created else 200, run_out(run))


def _may_read(client: ApiClient, run: Run) -> bool:
    """A client reads every run with runs:read, and otherwise only the runs it started."""
    return client.has_scope(ApiScope.RUNS_READ) or run.principal == client.actor


def _key_conflict(client: ApiClient, key: str, run: Run, why: str) -> ApiError:
    if not _may_read(client, run):
        # One answer whatever differs (another client's key, its workflow or its input): a
        # client that may not read the run must not learn, by trying inputs, what it holds.
        return ApiError(
            409,
            "business_key_conflict",
            f"business_key {key!r} is already in use; use a new business_key for a different "
            "request.",
            field="business_key",
        )
    what = {
        "workflow": "for another workflow",
        "input": "with different input",
        "taken": "by another client",
    }[why]
    return ApiError(
        409,
        "business_key_conflict",
        f"business_key {key!r} was already used {what} (run {run.pk}); use a new business_key "
        "for a different request.",
        field="business_key",
        run_id=str(run.pk),
    )


@router.get(
    "/runs/{run_id}",
    auth=BearerAuth(ApiScope.RUNS_READ),
    response={200: RunOut, **errors(404)},
    summary="A run's status and its rehydration document",
    tags=["runs"],
)
def get_run(request, run_id: UUID):
    run = Run.objects.filter(pk=run_id).first()
    if run is None:
        raise ApiError(404, "not_found", f"No run {run_id}.", field="run_id")
    api_client(request).touch()
    return run_out(run)


@router.get(
    "/runs",
    auth=BearerAuth(ApiScope.RUNS_READ),
    response={200: RunPage, **errors()},
    summary="List runs, newest first, with cursor pagination",
    tags=["runs"],
)
def list_runs(request, filters: Query[RunFilters]):
    runs = Run.objects.only(*(f for f in RunSummary.model_fields if f != "id")).filtered(
        workflow=filters.workflow or "",
        status=filters.status or "",
        business_key=filters.business_key or "",
        created_after=filters.created_after or None,
        created_before=filters.created_before or None,
    )
    if filters.cursor is not None:  # an empty cursor is not the first page, but a mistake
        runs = api_schema.older_than(runs, *_decode_cursor(filters.cursor))
    page = list(runs.order_by("-created_at", "-id")[: filters.limit + 1])
    more = len(page) > filters.limit
    page = page[: filters.limit]
    api_client(request).touch()
    return {
        "items": [run_summary(run) for run in page],
        "next_cursor": _encode_cursor(page[-1]) if more else None,
    }


@router.post(
    "/events",
    auth=[SignatureAuth(ApiScope.EVENTS_WRITE), BearerAuth(ApiScope.EVENTS_WRITE)],
    response={202: EventOut, **errors(404, *BODY_ERRORS)},
    summary="Deliver an event (webhook); resumes the run waiting for it",
    description=(
        "Resolves the wait for (event_type, correlation_key) and resumes its run. The same "
        "event_id again is acknowledged (`duplicate`) and changes nothing. An event nobody "
        "waits for yet is kept (`stored`) and matched when the wait appears — or, when the "
        "server runs with TASKPILOTS_EVENTS_STRICT=1, refused with 404 and not kept."
    ),
    tags=["events"],
)
@decorate_view(json_body)
def deliver_event(request, body: EventIn):
    client = api_client(request)

    class NobodyWaits(Exception):
        pass

    try:
        with transaction.atomic():
            outcome = engine.deliver_event(
                body.event_id,
                body.event_type,
                body.correlation_key,
                body.payload,
                source=client.actor,
            )
            if outcome == "stored" and _events_strict():
                raise NobodyWaits
    except NobodyWaits:
        raise ApiError(
            404,
            "no_matching_wait",
            f"No run waits for {body.event_type} with correlation key {body.correlation_key!r}.",
            field="correlation_key",
        ) from None
    run_id = (
        InboundEvent.objects.filter(event_id=body.event_id)
        .values_list("matched_wait__run_id", flat=True)
        .first()
    )
    client.touch()
    return Status(202, {"status": outcome, "event_id": body.event_id, "run_id": run_id})

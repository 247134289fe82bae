"""The JSON API's frame (docs/api.md): the NinjaAPI with its schema refinements, the guarded
body parser and error handlers, and what every endpoint shares (identifier types, the error
shape, run renderings). The endpoints are routers: runs.api.runs (runs and events) and
approvals.api (what people do: cancel, settle, decide); taskpilots/api.py puts them together.

Thin by design: each endpoint authenticates its client (runs/api/auth.py), validates the request
(runs/api/errors.py guards the raw body; the schemas guard each field), then calls one engine or
action function and renders the result. Every call is attributed to its client on the run's
timeline as `api:<client name>`.
"""

from __future__ import annotations

from datetime import datetime
from functools import wraps
from typing import Annotated, Any
from uuid import UUID

from django.http import JsonResponse
from ninja import Field, NinjaAPI, Schema
from pydantic import AfterValidator, BeforeValidator, ConfigDict

from runs import workflows as workflow_registry
from runs.api import schema as api_schema
from runs.api.auth import Caller
from runs.api.docs import ReadableDocs
from runs.api.errors import (
    IDENTIFIER_PATTERN,
    ApiError,
    GuardedParser,
    check_identifier,
    guard_json_body,
    install_handlers,
)
from runs.api.schema import CURSOR_PATTERN, integral
from runs.models import Run, RunStatus
from runs.rehydration import rehydration_document
from taskpilots.env import env_bool

EVENTS_STRICT = env_bool("TASKPILOTS_EVENTS_STRICT", False)


MAX_BIGINT = 2**63 - 1


MAX_VERSION = 2**31 - 1


class TaskPilotsApi(NinjaAPI):
    def get_openapi_schema(self, *, path_prefix=None, path_params=None):
        schema = super().get_openapi_schema(path_prefix=path_prefix, path_params=path_params)
        return api_schema.refine(schema, workflows=_registered_workflows())


def _registered_workflows() -> dict[str, list[int]]:
    """Every workflow a start may name, with its versions (lazily registered ones included)."""
    found: dict[str, list[int]] = {}
    for workflow in workflow_registry.all_workflows():
        found.setdefault(workflow.name, []).append(workflow.version)
    return found


def make_api() -> TaskPilotsApi:
    """The API under /api/v1/, without endpoints (routers add them)."""
    api = TaskPilotsApi(
        title="TaskPilots API",
        version="1",
        description=(
            "Start runs, read their state, deliver events and act on runs from agents and "
            "external systems. Authenticate with `Authorization: Bearer <client_id>.<secret>`; "
            "event webhooks may instead be signed with HMAC-SHA256 (X-TaskPilots-Client, "
            "X-TaskPilots-Timestamp, X-TaskPilots-Signature: sha256=<hex> over "
            '"<timestamp>.<raw body>"). Errors: `{"error": {"code", "message", "field"}}`.'
        ),
        urls_namespace="api-v1",
        docs=ReadableDocs(),
        docs_url="/docs",
        parser=GuardedParser(),
    )
    install_handlers(api)
    return api


def json_body(run_operation):
    """Wrap an operation with a JSON body: size and media type are refused (413/415) before
    authentication (a signed webhook's check reads the body) and before ninja reads the body."""

    @wraps(run_operation)
    def guarded(request, *args, **kwargs):
        try:
            guard_json_body(request)
        except ApiError as error:
            return JsonResponse(error.body(), status=error.status)
        return run_operation(request, *args, **kwargs)

    return guarded


# Keys, names and references: no NUL (400), no control or format characters (422).
Identifier = Annotated[
    str,
    AfterValidator(check_identifier),
    Field(json_schema_extra={"pattern": IDENTIFIER_PATTERN}),
]


# JSON numbers without a fraction (3.0 too), in range; never strings.
# (Constraints before the validator, so that the schema states them as minimum/maximum.)
WorkflowVersion = Annotated[int, Field(ge=1, le=MAX_VERSION), BeforeValidator(integral)]


RunVersion = Annotated[int, Field(ge=0, le=MAX_VERSION), BeforeValidator(integral)]


# A cursor is checked like an identifier (422 for invisible characters), then for its form (400).
Cursor = Annotated[
    str, AfterValidator(check_identifier), Field(json_schema_extra={"pattern": CURSOR_PATTERN})
]


class StrictIn(Schema):
    model_config = ConfigDict(extra="forbid", strict=True)


class ErrorDetail(Schema):
    code: str
    message: str
    field: str | None = None
    run_id: UUID | None = None


class ErrorOut(Schema):
    error: ErrorDetail


class RunSummary(Schema):
    id: UUID
    workflow: str
    workflow_version: int
    status: RunStatus
    stage: str
    business_key: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None


class RunOut(RunSummary):
    input: dict[str, Any]
    session_context_ref: str = Field(
        "", description="the opaque session reference the run was started with (empty: none)"
    )
    result: Any = None
    rehydration: dict[str, Any]


# What every endpoint may answer besides its own codes: bad request, credentials, scope, a method
# it does not have, validation, oversized headers (runs/api/middleware.py).
COMMON_ERRORS = (400, 401, 403, 405, 422, 431)


# And every endpoint with a JSON body: its length, size and media type (runs/api/errors.py).
BODY_ERRORS = (411, 413, 415)


def errors(*codes: int) -> dict:
    return dict.fromkeys(sorted({*COMMON_ERRORS, *codes}), ErrorOut)


def api_client(request) -> Caller:
    """Who made the call (runs.api.auth.Caller): a client, a person, or a client for a person."""
    return request.auth


def run_summary(run: Run) -> dict:
    return {
        "id": run.pk,
        "workflow": run.workflow,
        "workflow_version": run.workflow_version,
        "status": run.status,
        "stage": run.stage,
        "business_key": run.business_key,
        "created_at": run.created_at,
        "updated_at": run.updated_at,
        "finished_at": run.finished_at,
    }


def run_out(run: Run) -> dict:
    run = Run.objects.select_related("owner").get(pk=run.pk)
    return {
        **run_summary(run),
        "input": run.input,
        "session_context_ref": run.session_context_ref,
        "result": run.result,
        "rehydration": rehydration_document(run),
    }

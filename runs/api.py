"""The HTTP API for agents and external systems, under /api/v1/ (docs: docs/api.md).

Thin by design: each endpoint authenticates its client (runs/api_auth.py), validates the request
(runs/api_errors.py guards the raw body; the schemas below guard each field), then calls one
engine or action function and renders the result. Every call is attributed to its client on the
run's timeline as `api:<client name>`.
"""

from __future__ import annotations

import contextlib
from datetime import datetime
from functools import wraps
from typing import Annotated, Any, Literal
from uuid import UUID

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from ninja import Field, NinjaAPI, Path, Query, Schema, Status
from ninja.decorators import decorate_view
from pydantic import AfterValidator, BeforeValidator, ConfigDict

from approvals import actions
from approvals.models import ApprovalRequest
from runs import api_schema, engine
from runs import workflows as workflow_registry
from runs.api_auth import BearerAuth, SignatureAuth
from runs.api_docs import ReadableDocs
from runs.api_errors import (
    IDENTIFIER_PATTERN,
    ApiError,
    GuardedParser,
    check_identifier,
    guard_json_body,
    install_handlers,
)
from runs.api_models import ApiClient, ApiScope
from runs.api_schema import CURSOR_PATTERN, IsoDateTime, JsonObject, free_text, integral
from runs.models import InboundEvent, Run, RunStatus, Step, TimelineEvent
from runs.verbs import Verb
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
    for name in settings.TASKPILOTS.get("LAZY_MODULES", {}):
        if not name.endswith("."):
            # Importing may fail where an optional dependency is missing; the schema must not.
            with contextlib.suppress(Exception):
                workflow_registry.get(name)
    found: dict[str, list[int]] = {}
    for workflow in workflow_registry.all_workflows():
        found.setdefault(workflow.name, []).append(workflow.version)
    return found


api = TaskPilotsApi(
    title="TaskPilots API",
    version="1",
    description=(
        "Start runs, read their state, deliver events and act on runs from agents and external "
        "systems. Authenticate with `Authorization: Bearer <client_id>.<secret>`; event "
        "webhooks may instead be signed with HMAC-SHA256 (X-TaskPilots-Client, "
        "X-TaskPilots-Timestamp, X-TaskPilots-Signature: sha256=<hex> over "
        '"<timestamp>.<raw body>"). Errors: `{"error": {"code", "message", "field"}}`.'
    ),
    urls_namespace="api-v1",
    docs=ReadableDocs(),
    docs_url="/docs",
    parser=GuardedParser(),
)
install_handlers(api)


def json_body(run_operation):
    """Wrap an operation with a JSON body: size and media type are refused (413/415) before
    authentication (a signed webhook's check reads the body) and before ninja reads the body."""

    @wraps(run_operation)
    def guarded(request, *args, **kwargs):
        try:
            guard_json_body(request)
        except ApiError as error:
            return api.create_response(request, error.body(), status=error.status)
        return run_operation(request, *args, **kwargs)

    return guarded


def _events_strict() -> bool:
    return bool(getattr(settings, "TASKPILOTS", {}).get("EVENTS_STRICT", EVENTS_STRICT))


# --------------------------------------------------------------------------------------------
# Schemas

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


class StartRunIn(StrictIn):
    workflow: Identifier = Field(..., min_length=1, max_length=100)
    version: WorkflowVersion | None = None
    input: JsonObject
    business_key: Identifier = Field(..., min_length=1, max_length=200)
    session_context_ref: Identifier = Field("", max_length=200)


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
    result: Any = None
    rehydration: dict[str, Any]


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


class CancelIn(StrictIn):
    reason: str = free_text(min_length=1, max_length=2000, blank=False)
    user: Identifier | None = Field(
        None, min_length=1, max_length=150, description="act as this support/admin user"
    )
    compensate: bool = True
    expected_version: RunVersion | None = None


class DecisionIn(StrictIn):
    user: Identifier = Field(..., min_length=1, max_length=150, description="support or admin user")
    decision: Literal["approved", "approved_with_edits", "rejected"]
    edited_params: JsonObject | None = None
    comment: str = free_text("", max_length=4000)
    expected_version: RunVersion | None = None


class ApprovalOut(Schema):
    id: int
    run_id: UUID
    run_status: RunStatus
    status: str
    decision: str
    decided_by: str | None
    decided_at: datetime | None
    comment: str


class OutcomeIn(StrictIn):
    user: Identifier = Field(..., min_length=1, max_length=150, description="support or admin user")
    happened: bool = Field(..., description="true: it happened (give `proof`); false: it did not")
    proof: str = free_text(
        "",
        max_length=2000,
        description="required when happened: the external reference that proves it (message id, "
        "record id, transaction id); it becomes the side effect's receipt",
    )
    comment: str = free_text("", max_length=4000)
    idempotency_key: Identifier | None = Field(
        None,
        max_length=255,
        description="the key you looked up in the external system; 409 when the run's unknown "
        "outcome is another one",
    )
    expected_version: RunVersion | None = None


class OutcomeOut(Schema):
    run_id: UUID
    run_status: RunStatus
    step: str
    idempotency_key: str
    happened: bool
    side_effect_status: Literal["committed", "not_committed"]
    result: Any = Field(
        None,
        description="what the step now returns to the rest of the run (and, for an agent's tool "
        "call, to the model): {id, external_id, confirmed_by} when it happened; null when it did "
        "not (the step is tried again with the same key, and returns the tool's answer)",
    )


# What every endpoint may answer besides its own codes: bad request, credentials, scope, a method
# it does not have, validation, oversized headers (runs/api_middleware.py).
COMMON_ERRORS = (400, 401, 403, 405, 422, 431)
# And every endpoint with a JSON body: its length, size and media type (runs/api_errors.py).
BODY_ERRORS = (411, 413, 415)


def _errors(*codes: int) -> dict:
    return dict.fromkeys(sorted({*COMMON_ERRORS, *codes}), ErrorOut)


# --------------------------------------------------------------------------------------------
# Helpers


def _client(request) -> ApiClient:
    return request.auth


def _run_summary(run: Run) -> dict:
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


def _run_out(run: Run) -> dict:
    run = Run.objects.select_related("owner").get(pk=run.pk)
    return {
        **_run_summary(run),
        "input": run.input,
        "result": run.result,
        "rehydration": run.rehydration(),
    }


def _encode_cursor(run: Run) -> str:
    return api_schema.encode_cursor(run.created_at, run.pk)


def _decode_cursor(cursor: str) -> tuple[datetime, UUID]:
    position = api_schema.decode_cursor(cursor)
    if position is None:
        raise ApiError(400, "invalid_cursor", "The cursor is not one this API gave out.",
                       field="cursor")  # fmt: skip
    return position


def _acting_user(username: str | None):
    """The named user an action is taken as (None: the client on its own account)."""
    if username is None:
        return None
    user = get_user_model().objects.filter(username=username, is_active=True).first()
    if user is None:
        raise ApiError(422, "unknown_user", f"No active user {username!r}.", field="user")
    return user


def _check_may_act(run: Run, user, action: str) -> None:
    """The console's rule (approvals/permissions.py), checked first so that a user who may not
    act hears that before anything about the body; the action checks it again under the lock."""
    try:
        actions.check_may_act(run, user, action)
    except actions.ActionForbidden as exc:
        raise _action_error(exc) from None


def _action_error(exc: Exception) -> ApiError:
    if isinstance(exc, actions.ActionForbidden):
        return ApiError(403, exc.code, str(exc), field="user")
    code = "conflict" if isinstance(exc, actions.DecisionConflict) else "refused"
    return ApiError(409, code, str(exc))


# --------------------------------------------------------------------------------------------
# Runs


@api.post(
    "/runs",
    auth=BearerAuth(ApiScope.RUNS_WRITE),
    response={201: RunOut, 200: RunOut, **_errors(409, *BODY_ERRORS)},
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
    client = _client(request)
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
    return Status(201 if created else 200, _run_out(run))


def _may_read(client: ApiClient, run: Run) -> bool:
    """A client reads every run with runs:read, and otherwise only the runs it started."""
    return client.has_scope(ApiScope.RUNS_READ) or run.principal == client.actor


def _key_conflict(client: ApiClient, key: str, run: Run, why: str) -> ApiError:
    what = {
        "workflow": "for another workflow",
        "input": "with different input",
        "taken": "by another client",
    }[why]
    extra = {"run_id": str(run.pk)} if _may_read(client, run) else {}
    shown = f" (run {run.pk})" if extra else ""
    return ApiError(
        409,
        "business_key_conflict",
        f"business_key {key!r} was already used {what}{shown}; use a new business_key for a "
        "different request.",
        field="business_key",
        **extra,
    )


@api.get(
    "/runs/{run_id}",
    auth=BearerAuth(ApiScope.RUNS_READ),
    response={200: RunOut, **_errors(404)},
    summary="A run's status and its rehydration document",
    tags=["runs"],
)
def get_run(request, run_id: UUID):
    run = Run.objects.filter(pk=run_id).first()
    if run is None:
        raise ApiError(404, "not_found", f"No run {run_id}.", field="run_id")
    _client(request).touch()
    return _run_out(run)


@api.get(
    "/runs",
    auth=BearerAuth(ApiScope.RUNS_READ),
    response={200: RunPage, **_errors()},
    summary="List runs, newest first, with cursor pagination",
    tags=["runs"],
)
def list_runs(request, filters: Query[RunFilters]):
    runs = Run.objects.only(*(f for f in RunSummary.model_fields if f != "id"))
    if filters.workflow:
        runs = runs.filter(workflow=filters.workflow)
    if filters.status:
        runs = runs.filter(status=filters.status)
    if filters.business_key:
        runs = runs.filter(business_key=filters.business_key)
    if filters.created_after:
        runs = runs.filter(created_at__gte=filters.created_after)
    if filters.created_before:
        runs = runs.filter(created_at__lt=filters.created_before)
    if filters.cursor is not None:  # an empty cursor is not the first page, but a mistake
        created_at, run_id = _decode_cursor(filters.cursor)
        # (created_at, id) < cursor, with the redundant bound that lets the index do the work.
        runs = runs.filter(created_at__lte=created_at).exclude(
            created_at=created_at, id__gte=run_id
        )
    page = list(runs.order_by("-created_at", "-id")[: filters.limit + 1])
    more = len(page) > filters.limit
    page = page[: filters.limit]
    _client(request).touch()
    return {
        "items": [_run_summary(run) for run in page],
        "next_cursor": _encode_cursor(page[-1]) if more else None,
    }


@api.post(
    "/runs/{run_id}/cancel",
    auth=BearerAuth(ApiScope.RUNS_WRITE),
    response={200: RunOut, **_errors(404, 409, *BODY_ERRORS)},
    summary="Cancel a run (committed side effects are compensated unless compensate=false)",
    description=(
        "As a named support/admin `user`, or without one on the client's own account. The "
        "console's rules apply: a taken-over run is cancelled only by its owner or an admin "
        "(403 `taken_over`, also when no `user` is named)."
    ),
    tags=["runs"],
)
@decorate_view(json_body)
def cancel_run(request, run_id: UUID, body: CancelIn):
    client = _client(request)
    run = Run.objects.select_related("owner").filter(pk=run_id).first()
    if run is None:
        raise ApiError(404, "not_found", f"No run {run_id}.", field="run_id")
    user = _acting_user(body.user)
    _check_may_act(run, user, "cancel")
    try:
        with transaction.atomic():
            TimelineEvent.append(
                run_id,
                Verb.API_CANCEL_REQUESTED,
                {"client": client.name, "user": body.user, "reason": body.reason},
                actor=client.actor,
            )
            run = actions.cancel_run(
                run_id,
                user,
                reason=body.reason,
                compensate=body.compensate,
                expected_version=body.expected_version,
                actor=client.actor,
            )
    except (actions.DecisionConflict, actions.ActionRefused, actions.ActionForbidden) as exc:
        raise _action_error(exc) from None
    client.touch()
    return _run_out(run)


# --------------------------------------------------------------------------------------------
# Events


@api.post(
    "/events",
    auth=[SignatureAuth(ApiScope.EVENTS_WRITE), BearerAuth(ApiScope.EVENTS_WRITE)],
    response={202: EventOut, **_errors(404, *BODY_ERRORS)},
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
    client = _client(request)

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


@api.post(
    "/runs/{run_id}/outcome",
    auth=BearerAuth(ApiScope.APPROVALS_WRITE),
    response={200: OutcomeOut, **_errors(404, 409, *BODY_ERRORS)},
    summary="Settle a run's unknown outcome as a named support/admin user",
    description=(
        "When a side effect may or may not have happened (the run waits with an unknown "
        "outcome), a person checks the external system by its idempotency key and says which: "
        "`happened` with the external reference as `proof` (recorded as the commit proof; the "
        "run goes on), or not (the step is tried again with the same idempotency key). The "
        "console's rules apply (role, takeover owner); 409 when the run has no unknown outcome, "
        "it was settled already, or `idempotency_key` names another call."
    ),
    tags=["runs"],
)
@decorate_view(json_body)
def settle_outcome(request, run_id: UUID, body: OutcomeIn):
    client = _client(request)
    run = Run.objects.select_related("owner").filter(pk=run_id).first()
    if run is None:
        raise ApiError(404, "not_found", f"No run {run_id}.", field="run_id")
    user = _acting_user(body.user)
    _check_may_act(run, user, "settle an outcome of")
    proof = body.proof.strip()
    if body.happened and not proof:
        message = (
            "proof is required when it happened: give the external reference (message, record "
            "or transaction id)."
        )
        raise ApiError(422, "missing_field", message, field="proof")
    step = run.steps.filter(status=Step.Status.UNKNOWN_OUTCOME).order_by("position").first()
    if step is None:
        raise ApiError(409, "refused", f"Run {run.pk} has no unknown outcome to settle (it is "
                       f"{run.status}).")  # fmt: skip
    if body.idempotency_key is not None and body.idempotency_key != step.idempotency_key:
        raise ApiError(409, "conflict", f"The run's unknown outcome is the call with key "
                       f"{step.idempotency_key}, not {body.idempotency_key}.",
                       field="idempotency_key")  # fmt: skip
    try:
        with transaction.atomic():
            TimelineEvent.append(
                run.pk,
                Verb.API_OUTCOME_REQUESTED,
                {"client": client.name, "user": user.get_username(), "step": step.name,
                 "key": step.idempotency_key, "happened": body.happened},
                actor=client.actor,
            )  # fmt: skip
            step = actions.confirm_outcome(
                step.pk,
                user,
                happened=body.happened,
                proof=proof,
                comment=body.comment,
                expected_version=body.expected_version,
            )
    except (actions.DecisionConflict, actions.ActionRefused, actions.ActionForbidden) as exc:
        raise _action_error(exc) from None
    client.touch()
    run.refresh_from_db(fields=["status"])
    step.refresh_from_db(fields=["status", "result"])
    return {
        "run_id": run.pk,
        "run_status": run.status,
        "step": step.name,
        "idempotency_key": step.idempotency_key,
        "happened": body.happened,
        "side_effect_status": "committed" if body.happened else "not_committed",
        "result": step.result if body.happened else None,
    }


# --------------------------------------------------------------------------------------------
# Approvals


@api.post(
    "/approvals/{approval_id}/decision",
    auth=BearerAuth(ApiScope.APPROVALS_WRITE),
    response={200: ApprovalOut, **_errors(404, 409, *BODY_ERRORS)},
    summary="Decide an approval as a named support/admin user (approving from another tool)",
    description=(
        "The decision is recorded as that user's, with their permissions: they must be in the "
        "support or admin group, and only the owner or an admin decides a taken-over run. "
        "A request that was already decided answers 409 naming who decided."
    ),
    tags=["approvals"],
)
@decorate_view(json_body)
def decide_approval(request, body: DecisionIn, approval_id: int = Path(..., ge=1, le=MAX_BIGINT)):
    client = _client(request)
    approvals = ApprovalRequest.objects.select_related("run", "run__owner")
    approval = approvals.filter(pk=approval_id).first()
    if approval is None:
        raise ApiError(404, "not_found", f"No approval {approval_id}.", field="approval_id")
    user = _acting_user(body.user)
    run = approval.run
    _check_may_act(run, user, "decide")
    if body.decision == "approved_with_edits":
        if body.edited_params is None:
            raise ApiError(422, "missing_field", "edited_params is required for "
                           "approved_with_edits.", field="edited_params")  # fmt: skip
        try:
            actions.validate_params(
                approval.tool, body.edited_params, proposed=approval.proposed_params
            )
        except actions.InvalidParams as exc:
            field = f"edited_params.{exc.field}" if exc.field else "edited_params"
            raise ApiError(422, "invalid_params", str(exc), field=field) from None
    try:
        with transaction.atomic():
            TimelineEvent.append(
                run.pk,
                Verb.API_DECISION_REQUESTED,
                {"client": client.name, "user": user.get_username(), "approval": approval.pk,
                 "decision": body.decision},
                actor=client.actor,
            )  # fmt: skip
            approval = actions.decide_approval(
                approval.pk,
                user,
                body.decision,
                edited_params=body.edited_params,
                comment=body.comment,
                expected_version=body.expected_version,
            )
    except (actions.DecisionConflict, actions.ActionRefused, actions.ActionForbidden) as exc:
        raise _action_error(exc) from None
    client.touch()
    run.refresh_from_db(fields=["status"])
    return {
        "id": approval.pk,
        "run_id": approval.run_id,
        "run_status": run.status,
        "status": approval.status,
        "decision": approval.decision,
        "decided_by": approval.decided_by.get_username() if approval.decided_by else None,
        "decided_at": approval.decided_at,
        "comment": approval.comment,
    }

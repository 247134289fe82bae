"""The API's people endpoints: cancel a run, settle an unknown outcome, decide an approval — as
the person who authenticated (a personal token, or a client presenting that person's
delegation: runs.api.auth), with exactly the console's rules (approvals.permissions), through
the same actions the console calls (approvals.actions). A name in the body is never an
identity: `user`, where it is still accepted, must name the authenticated person."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal
from uuid import UUID

from django.db import transaction
from ninja import Field, Path, Router, Schema
from ninja.decorators import decorate_view

from approvals import actions
from approvals.models import ApprovalRequest
from runs.api.auth import BearerAuth, Caller
from runs.api.base import (
    BODY_ERRORS,
    MAX_BIGINT,
    Identifier,
    RunOut,
    RunVersion,
    StrictIn,
    api_client,
    errors,
    json_body,
    run_out,
)
from runs.api.errors import ApiError
from runs.api.models import ApiScope
from runs.api.schema import JsonObject, free_text
from runs.conditions import ConditionError
from runs.conditions import validate as validate_conditions
from runs.models import Run, RunStatus, Step, TimelineEvent
from runs.verbs import Verb

router = Router()


PERSON_FIELD = (
    "optional: the username of the person the credentials authenticate (a personal token, or "
    "a delegation in X-TaskPilots-On-Behalf-Of); any other name is refused with 403"
)


class CancelIn(StrictIn):
    reason: str = free_text(min_length=1, max_length=2000, blank=False)
    user: Identifier | None = Field(None, min_length=1, max_length=150, description=PERSON_FIELD)
    compensate: bool = True
    expected_version: RunVersion | None = None


ConditionScalar = int | float | Annotated[str, Field(max_length=200)] | bool


class ConditionIn(StrictIn):
    param: Identifier = Field(
        ..., min_length=1, max_length=150, description="a parameter of the call"
    )
    op: Literal["<=", "<", ">=", ">", "==", "in"]
    value: (
        ConditionScalar | Annotated[list[ConditionScalar], Field(min_length=1, max_length=50)]
    ) = Field(..., description="a number for <, <=, >, >=; a list of allowed values for `in`")


class DecisionIn(StrictIn):
    user: Identifier | None = Field(None, min_length=1, max_length=150, description=PERSON_FIELD)
    decision: Literal["approved", "approved_with_edits", "rejected"]
    edited_params: JsonObject | None = None
    conditions: Annotated[list[ConditionIn], Field(max_length=20)] | None = Field(
        None,
        description="approve only if the call's parameters meet these when it is made; the "
        "engine checks them right before the call and hands the run to a person instead",
    )
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
    conditions: list[dict[str, Any]] = []
    approvals_required: int = 1
    # Still needed before the run goes on (0 once decided), and who approved so far.
    approvals_needed: int = 0
    approved_by: list[str] = []
    # The rules that asked for approvers when the request opened (or an edit raised the
    # number): {rule_id, rule, version, approvers, amount?, records?}.
    approvers_because: list[dict[str, Any]] = []


class OutcomeIn(StrictIn):
    user: Identifier | None = Field(None, min_length=1, max_length=150, description=PERSON_FIELD)
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


def acting_person(caller: Caller, named: str | None, *, required: bool = True):
    """The person the call acts for: the one its credentials authenticate, never a name in the
    body. `named` (the body's `user`) must be that person; without a person behind the
    credentials, a call that needs one — or names one — is refused (403)."""
    person = caller.person
    if person is None:
        if required or named is not None:
            raise ApiError(
                403,
                "person_required",
                "This acts as a person, and these credentials are an API client's own: "
                "authenticate with the person's personal token, or send their delegation to "
                "this client in X-TaskPilots-On-Behalf-Of (docs/api.md, People). Naming a "
                "user in the body does not make the call theirs.",
                field="user" if named is not None else None,
            )
        return None
    if named is not None and named != person.get_username():
        raise ApiError(
            403,
            "not_this_person",
            f"These credentials act for {person.get_username()}, not {named}.",
            field="user",
        )
    return person


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


def _perform(caller: Caller, run: Run, verb: Verb, request: dict, action):
    """Record the caller's request on the run's timeline and carry out the person's action in
    the same transaction: both land or neither does. Refusals become the API's errors."""
    try:
        with transaction.atomic():
            TimelineEvent.append(run.pk, verb, {**caller.describe(), **request}, actor=caller.actor)
            result = action()
    except (actions.DecisionConflict, actions.ActionRefused, actions.ActionForbidden) as exc:
        raise _action_error(exc) from None
    caller.touch()
    return result


def _run_to_act_on(
    caller: Caller, run_id, named: str | None, action: str, *, required: bool = True
) -> tuple[Run, object]:
    """The run (404 if none), the person the credentials act for (403 without one, when one
    is needed) and the console's rule (403)."""
    run = Run.objects.select_related("owner").filter(pk=run_id).first()
    if run is None:
        raise ApiError(404, "not_found", f"No run {run_id}.", field="run_id")
    user = acting_person(caller, named, required=required)
    _check_may_act(run, user, action)
    return run, user


@router.post(
    "/runs/{run_id}/cancel",
    auth=BearerAuth(ApiScope.RUNS_WRITE),
    response={200: RunOut, **errors(404, 409, *BODY_ERRORS)},
    summary=(
        "Cancel a run (committed side effects whose tool can undo them are compensated unless "
        "compensate=false; the others are left for a person)"
    ),
    description=(
        "As the person the credentials authenticate (a personal token, or a client with that "
        "person's delegation), or by an API client on its own account. The console's rules "
        "apply: a taken-over run is cancelled only by its owner or an admin (403 `taken_over`, "
        "also for a client on its own account)."
    ),
    tags=["runs"],
)
@decorate_view(json_body)
def cancel_run(request, run_id: UUID, body: CancelIn):
    caller = api_client(request)
    run, user = _run_to_act_on(caller, run_id, body.user, "cancel", required=False)
    run = _perform(
        caller,
        run,
        Verb.API_CANCEL_REQUESTED,
        {"reason": body.reason},
        lambda: actions.cancel_run(
            run_id,
            user,
            reason=body.reason,
            compensate=body.compensate,
            expected_version=body.expected_version,
            actor=caller.actor,
        ),
    )
    return run_out(run)


@router.post(
    "/runs/{run_id}/outcome",
    auth=BearerAuth(ApiScope.APPROVALS_WRITE),
    response={200: OutcomeOut, **errors(404, 409, *BODY_ERRORS)},
    summary="Settle a run's unknown outcome (a person: personal token or delegation)",
    description=(
        "When a side effect may or may not have happened (the run waits with an unknown "
        "outcome), a person checks the external system by its idempotency key and says which: "
        "`happened` with the external reference as `proof` (recorded as the commit proof; the "
        "run goes on), or not (the step is tried again with the same idempotency key). The "
        "console's rules apply (role, takeover owner); 403 `person_required` for a client "
        "without a person behind it; 409 when the run has no unknown outcome, it was settled "
        "already, or `idempotency_key` names another call."
    ),
    tags=["runs"],
)
@decorate_view(json_body)
def settle_outcome(request, run_id: UUID, body: OutcomeIn):
    caller = api_client(request)
    run, user = _run_to_act_on(caller, run_id, body.user, "settle an outcome of")
    proof = body.proof.strip()
    if body.happened and not proof:
        message = (
            "proof is required when it happened: give the external reference (message, record "
            "or transaction id)."
        )
        raise ApiError(422, "missing_field", message, field="proof")
    step = run.steps.filter(status=Step.Status.UNKNOWN_OUTCOME).order_by("position").first()
    if step is None:
        raise ApiError(
            409, "refused", f"Run {run.pk} has no unknown outcome to settle (it is {run.status})."
        )
    if body.idempotency_key is not None and body.idempotency_key != step.idempotency_key:
        raise ApiError(
            409,
            "conflict",
            f"The run's unknown outcome is the call with key "
            f"{step.idempotency_key}, not {body.idempotency_key}.",
            field="idempotency_key",
        )
    request_data = {"step": step.name, "key": step.idempotency_key, "happened": body.happened}
    step = _perform(
        caller,
        run,
        Verb.API_OUTCOME_REQUESTED,
        request_data,
        lambda: actions.confirm_outcome(
            step.pk,
            user,
            happened=body.happened,
            proof=proof,
            comment=body.comment,
            expected_version=body.expected_version,
        ),
    )
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


@router.post(
    "/approvals/{approval_id}/decision",
    auth=BearerAuth(ApiScope.APPROVALS_WRITE),
    response={200: ApprovalOut, **errors(404, 409, *BODY_ERRORS)},
    summary="Decide an approval as the person who authenticated (approving from another tool)",
    description=(
        "The decision is that person's — the one a personal token or a delegation (header "
        "X-TaskPilots-On-Behalf-Of) authenticates; an API client on its own account is refused "
        "(403 `person_required`). They must be in the support or admin group, and only the "
        "owner or an admin decides a taken-over run. A two-person approval answers the first "
        "approval with status `pending`, `approvals_needed` 1 and `approved_by`; the run goes "
        "on after a second, different person approves (the same person again, the run's starter "
        "and anyone who took it over are refused, 409). The number of approvers is counted on "
        "the parameters approved: edits past a rule's threshold ask for a second person. A "
        "request that was already decided answers 409 naming who decided."
    ),
    tags=["approvals"],
)
@decorate_view(json_body)
def decide_approval(request, body: DecisionIn, approval_id: int = Path(..., ge=1, le=MAX_BIGINT)):
    caller = api_client(request)
    approvals = ApprovalRequest.objects.select_related("run", "run__owner")
    approval = approvals.filter(pk=approval_id).first()
    if approval is None:
        raise ApiError(404, "not_found", f"No approval {approval_id}.", field="approval_id")
    user = acting_person(caller, body.user)
    run = approval.run
    _check_may_act(run, user, "decide")
    if body.decision == "approved_with_edits":
        if body.edited_params is None:
            raise ApiError(
                422,
                "missing_field",
                "edited_params is required for approved_with_edits.",
                field="edited_params",
            )
        try:
            actions.validate_params(
                approval.tool, body.edited_params, proposed=approval.proposed_params
            )
        except actions.InvalidParams as exc:
            field = f"edited_params.{exc.field}" if exc.field else "edited_params"
            raise ApiError(422, "invalid_params", str(exc), field=field) from None
    conditions = [c.model_dump() for c in body.conditions] if body.conditions else None
    if conditions:
        if body.decision == "rejected":
            raise ApiError(
                422, "invalid_conditions", "A rejection takes no conditions.", field="conditions"
            )
        shown = body.edited_params if body.edited_params is not None else approval.proposed_params
        try:
            validate_conditions(conditions, shown)
        except ConditionError as exc:
            field = "conditions" if exc.index is None else f"conditions[{exc.index}]"
            raise ApiError(422, "invalid_conditions", str(exc), field=field) from None
    request_data = {"approval": approval.pk, "decision": body.decision}
    approval = _perform(
        caller,
        run,
        Verb.API_DECISION_REQUESTED,
        request_data,
        lambda: actions.decide_approval(
            approval.pk,
            user,
            body.decision,
            edited_params=body.edited_params,
            comment=body.comment,
            expected_version=body.expected_version,
            conditions=conditions,
        ),
    )
    run.refresh_from_db(fields=["status"])
    return {
        "conditions": approval.conditions,
        "id": approval.pk,
        "run_id": approval.run_id,
        "run_status": run.status,
        "status": approval.status,
        "decision": approval.decision,
        "decided_by": approval.decided_by.get_username() if approval.decided_by else None,
        "decided_at": approval.decided_at,
        "comment": approval.comment,
        **_approvers(approval),
    }


def _approvers(approval: ApprovalRequest) -> dict[str, Any]:
    """How many approvals the request needs, how many are still missing and who gave them."""
    approved = [u.get_username() for u in (approval.first_approved_by, approval.decided_by) if u]
    if approval.decision == ApprovalRequest.Decision.REJECTED:
        approved = approved[:-1]
    pending = approval.status == ApprovalRequest.Status.PENDING
    return {
        "approvals_required": approval.approvals_required,
        "approvals_needed": approval.approvals_required - len(approved) if pending else 0,
        "approved_by": approved,
        "approvers_because": approval.approvers_because,
    }

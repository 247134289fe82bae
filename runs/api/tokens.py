"""People's credentials over the API: who am I, delegate to an integration, revoke a token.

A person creates their personal tokens in the console (`/console/tokens/`) or an admin with
`manage.py create_personal_token`; with one of them, the person can delegate to an API client
here: a token bound to that person and that client, for at most an hour, with at most the
scopes both hold. The client then acts for the person by sending it in
`X-TaskPilots-On-Behalf-Of` beside its own bearer token (runs.api.auth). The client cannot make
one for anyone else: only a person's own credentials issue it.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Literal

from django.utils import timezone
from ninja import Field, Router, Schema
from ninja.decorators import decorate_view
from pydantic import BeforeValidator

from runs.api.auth import BearerAuth, Caller
from runs.api.base import BODY_ERRORS, Identifier, StrictIn, api_client, errors, json_body
from runs.api.errors import ApiError
from runs.api.models import (
    DELEGATION_MAX_MINUTES,
    DELEGATION_MINUTES,
    ApiClient,
    ApiScope,
    PersonalToken,
)
from runs.api.schema import integral

router = Router(tags=["people"])

Scope = Literal[tuple(ApiScope.values)]


class MeOut(Schema):
    user: str | None = Field(None, description="the person the credentials act for, if any")
    client: str | None = Field(None, description="the API client whose credentials came")
    scopes: list[str]
    token: str | None = Field(None, description="the personal token or delegation's id")
    expires_at: datetime | None = None


class DelegationIn(StrictIn):
    client: Identifier = Field(
        ..., min_length=1, max_length=100, description="the API client (its name) to act for you"
    )
    scopes: Annotated[list[Scope], Field(min_length=1, max_length=4)] = Field(
        ..., description="at most the scopes your token and the client both hold"
    )
    # 10.0 is the integer 10 in JSON (runs.api.schema.integral); 10.5 and "10" are refused.
    minutes: Annotated[int, BeforeValidator(integral)] = Field(
        DELEGATION_MINUTES,
        ge=1,
        le=DELEGATION_MAX_MINUTES,
        description=f"how long it lasts (at most {DELEGATION_MAX_MINUTES})",
    )


class DelegationOut(Schema):
    token: str = Field(..., description="send it as X-TaskPilots-On-Behalf-Of; shown once")
    token_id: str
    client: str
    user: str
    scopes: list[str]
    expires_at: datetime


class RevokedOut(Schema):
    token_id: str
    revoked: bool = Field(..., description="false when it was revoked already")


@router.get(
    "/me",
    auth=BearerAuth(None),
    response={200: MeOut, **errors()},
    summary="Who these credentials are: the client, the person they act for, the scopes",
)
def me(request):
    caller: Caller = api_client(request)
    return {
        "user": caller.person.get_username() if caller.person is not None else None,
        "client": caller.client.name if caller.client is not None else None,
        "scopes": sorted(caller.scopes),
        "token": caller.token.token_id if caller.token is not None else None,
        "expires_at": caller.token.expires_at if caller.token is not None else None,
    }


@router.post(
    "/delegations",
    auth=BearerAuth(None),
    response={201: DelegationOut, **errors(404, *BODY_ERRORS)},
    summary="Let an integration act for you for a while (a delegation, shown once)",
    description=(
        "Only with your personal token (403 `person_required` for a client's own credentials "
        "or another delegation). The delegation is bound to you and to the client: only that "
        "client may present it, in X-TaskPilots-On-Behalf-Of beside its own bearer token, "
        "and it acts with the scopes both hold, within your role. 404 for an unknown or "
        "revoked client; 403 `missing_scope` for a scope you do not hold."
    ),
)
@decorate_view(json_body)
def delegate(request, body: DelegationIn):
    caller: Caller = api_client(request)
    if caller.client is not None or caller.person is None:
        raise ApiError(
            403,
            "person_required",
            "A delegation is issued by a person with their own personal token.",
        )
    client = ApiClient.objects.active().filter(name=body.client).first()
    if client is None:
        raise ApiError(404, "not_found", f"No active API client {body.client!r}.", field="client")
    wanted = sorted({str(scope) for scope in body.scopes})
    missing = [scope for scope in wanted if not caller.has_scope(scope)]
    if missing:
        raise ApiError(
            403,
            "missing_scope",
            f"You cannot delegate what your token does not hold: {', '.join(missing)}.",
            field="scopes",
        )
    expires_at = timezone.now() + timedelta(minutes=body.minutes)
    token, issued = PersonalToken.issue(
        caller.person,
        f"delegation to {client.name}",
        wanted,
        created_by=caller.person,
        expires_at=expires_at,
        client=client,
    )
    caller.touch()
    return 201, {
        "token": issued.token,
        "token_id": token.token_id,
        "client": client.name,
        "user": caller.person.get_username(),
        "scopes": token.scopes,
        "expires_at": expires_at,
    }


@router.delete(
    "/tokens/{token_id}",
    auth=BearerAuth(None),
    response={200: RevokedOut, **errors(404)},
    summary="Revoke one of your tokens or delegations (with your personal token)",
)
def revoke(request, token_id: Identifier):
    caller: Caller = api_client(request)
    if caller.client is not None or caller.person is None:
        raise ApiError(403, "person_required", "Only a person revokes their own tokens.")
    token = PersonalToken.objects.filter(token_id=token_id[:40], user=caller.person).first()
    if token is None:
        raise ApiError(404, "not_found", f"You have no token {token_id}.", field="token_id")
    return {"token_id": token.token_id, "revoked": token.revoke()}

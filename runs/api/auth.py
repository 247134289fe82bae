"""Authentication of API callers: bearer tokens for calls, HMAC signatures for webhooks.

Bearer, one of:
- an API client's token `<client_id>.<secret>` (`tpc_…`): the client acts on its own account;
- a person's personal token `tpu_….<secret>`: the person acts, with the token's scopes (as far
  as the person's role still allows them);
- an API client's token plus `X-TaskPilots-On-Behalf-Of: tpd_….<secret>`, a delegation the
  person issued to that very client: the client acts for the person, with the scopes both hold.
Every secret's SHA-256 is compared in constant time with the stored one. The result is a
`Caller`: who the call is attributed to, and which person (if any) it acts for. A name in a
request body is never an identity.

Signed webhook (POST /api/v1/events):
    X-TaskPilots-Client:    <client_id>
    X-TaskPilots-Timestamp: <unix seconds>
    X-TaskPilots-Signature: sha256=<hex HMAC-SHA256(signing secret, f"{timestamp}.{raw body}")>
A timestamp more than TASKPILOTS_WEBHOOK_TOLERANCE_SECONDS (300) away from now is refused, so a
captured request cannot be replayed later; inside the window a replay is harmless because events
are idempotent by event_id. Every refusal is logged with its reason.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
from dataclasses import dataclass
from typing import Any

from django.http import HttpRequest
from ninja.security import HttpBearer
from ninja.security.base import AuthBase

from runs.api.errors import ApiError, read_body
from runs.api.models import ApiClient, PersonalToken, TokenKind
from runs.people import people
from taskpilots.env import env_int

logger = logging.getLogger("taskpilots.api")

SIGNATURE_TOLERANCE_SECONDS = env_int("TASKPILOTS_WEBHOOK_TOLERANCE_SECONDS", 300, minimum=1)
CLIENT_HEADER = "X-TaskPilots-Client"
TIMESTAMP_HEADER = "X-TaskPilots-Timestamp"
SIGNATURE_HEADER = "X-TaskPilots-Signature"
DELEGATION_HEADER = "X-TaskPilots-On-Behalf-Of"

# Compared against when the client id is unknown, so a miss costs the same as a wrong secret.
_DUMMY = ApiClient(secret_hash="0" * 64)
_DUMMY_TOKEN = PersonalToken(secret_hash="0" * 64)


@dataclass(frozen=True)
class Caller:
    """Who made an API call. `client`: the API client whose credentials came with it (None
    for a personal token). `person`: the user the call acts for — through a personal token or a
    delegation — or None (the client on its own account). `scopes`: what it may do."""

    client: ApiClient | None
    person: Any = None
    token: PersonalToken | None = None
    scopes: frozenset[str] = frozenset()

    @property
    def actor(self) -> str:
        """How the call appears on timelines: the client, or the person with their own token."""
        if self.client is not None:
            return self.client.actor
        return f"user:{self.person.get_username()}"

    @property
    def name(self) -> str:
        return self.client.name if self.client is not None else self.person.get_username()

    def has_scope(self, scope: str) -> bool:
        return scope in self.scopes

    def describe(self) -> dict[str, str]:
        """Who, for a request's timeline event: the client, the person, the token."""
        found = {}
        if self.client is not None:
            found["client"] = self.client.name
        if self.person is not None:
            found["user"] = self.person.get_username()
        if self.token is not None:
            found["token"] = self.token.token_id
        return found

    def touch(self) -> None:
        if self.client is not None:
            self.client.touch()
        if self.token is not None:
            self.token.touch()


def _person_scopes(token: PersonalToken) -> frozenset[str]:
    """The token's scopes, as far as its person's role allows them today."""
    allowed = people().scopes_for(token.user)
    return frozenset(token.scopes or ()) & allowed


def _usable_token(token_id: str, secret: str, kind: str) -> PersonalToken | None:
    token = None
    if token_id and secret and len(token_id) <= 40:
        token = (
            PersonalToken.objects.usable()
            .select_related("user", "client")
            .filter(token_id=token_id, kind=kind)
            .first()
        )
    if not (token or _DUMMY_TOKEN).check_secret(secret) or token is None:
        return None
    return token


def _refuse(request: HttpRequest, reason: str, client_id: str = "") -> None:
    logger.warning(
        "api: refused %s %s from %s (client %r): %s",
        request.method,
        request.path,
        request.META.get("REMOTE_ADDR"),
        client_id[:40],
        reason,
    )


def _require_scope(caller: Caller, scope: str | None) -> Caller:
    """The caller, if it holds `scope` (None: any authenticated caller)."""
    if scope is not None and not caller.has_scope(scope):
        who = "This token" if caller.client is None else "This client"
        if caller.token is not None and caller.client is not None:
            who = "This client acting for its person"
        raise ApiError(403, "missing_scope", f"{who} lacks the {scope} scope.")
    return caller


def sign(signing_secret: str, timestamp: int | str, body: bytes) -> str:
    """The signature header value for a body (what a webhook sender computes)."""
    mac = hmac.new(signing_secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"sha256={mac.hexdigest()}"


class BearerAuth(HttpBearer):
    def __init__(self, scope: str | None):
        self.scope = scope
        super().__init__()

    def authenticate(self, request: HttpRequest, token: str) -> Caller | None:
        token_id, _, secret = token.partition(".")
        if len(token) > 200:
            token_id = secret = ""
        if token_id.startswith("tpu_"):
            personal = _usable_token(token_id, secret, TokenKind.PERSONAL)
            if personal is None:
                _refuse(request, "bad, expired or revoked personal token", token_id)
                return None
            caller = Caller(None, personal.user, personal, _person_scopes(personal))
            return _require_scope(caller, self.scope)
        client = None
        if token_id and secret:
            client = ApiClient.objects.active().filter(client_id=token_id).first()
        if not (client or _DUMMY).check_secret(secret) or client is None:
            _refuse(request, "bad or revoked bearer token", token_id)
            return None
        return _require_scope(_on_behalf(request, client), self.scope)


def _on_behalf(request: HttpRequest, client: ApiClient) -> Caller:
    """The client on its own account, or — with a delegation header — for the person who
    issued that delegation to this very client (401 for any other delegation)."""
    sent = request.headers.get(DELEGATION_HEADER)
    if sent is None:
        return Caller(client, scopes=frozenset(client.scopes or ()))
    token_id, _, secret = sent.strip().partition(".")
    delegation = _usable_token(token_id[:40], secret[:100], TokenKind.DELEGATION)
    if delegation is None or delegation.client_id != client.pk:
        _refuse(request, "bad, expired, revoked or another client's delegation", token_id)
        raise ApiError(
            401,
            "invalid_delegation",
            f"{DELEGATION_HEADER} is not a delegation issued to this client that is still in "
            "force: ask the person to issue a new one (docs/api.md, People).",
        )
    scopes = frozenset(client.scopes or ()) & _person_scopes(delegation)
    return Caller(client, delegation.user, delegation, scopes)


class SignatureAuth(AuthBase):
    """HMAC-signed webhook; declared in OpenAPI as the signature header."""

    openapi_type = "apiKey"
    openapi_in = "header"
    openapi_name = SIGNATURE_HEADER

    def __init__(self, scope: str):
        self.scope = scope
        super().__init__()

    def __call__(self, request: HttpRequest) -> Caller | None:
        client_id = request.headers.get(CLIENT_HEADER, "")
        timestamp = request.headers.get(TIMESTAMP_HEADER, "")
        signature = request.headers.get(SIGNATURE_HEADER, "")
        if not any(
            name in request.headers for name in (CLIENT_HEADER, TIMESTAMP_HEADER, SIGNATURE_HEADER)
        ):
            return None  # not a signed request: let bearer authentication try
        # A request that sends any signature header (even empty) is a signed request: a bad
        # signature is refused, never rescued by a bearer token sent alongside.
        if not (client_id and timestamp and signature):
            return self._fail(request, "incomplete signature headers", client_id)
        try:
            sent_at = int(timestamp)
        except ValueError:
            return self._fail(request, "timestamp is not an integer", client_id)
        if abs(time.time() - sent_at) > SIGNATURE_TOLERANCE_SECONDS:
            return self._fail(request, "stale or future timestamp", client_id)
        client = ApiClient.objects.active().filter(client_id=client_id[:40]).first()
        if client is None:
            return self._fail(request, "unknown or revoked client", client_id)
        body = read_body(request)
        sent = signature.encode("utf-8", "replace")
        if not any(
            hmac.compare_digest(sign(secret, timestamp, body).encode(), sent)
            for secret in client.signing_secrets()
        ):
            return self._fail(request, "signature does not match", client_id)
        return _require_scope(Caller(client, scopes=frozenset(client.scopes or ())), self.scope)

    def _fail(self, request: HttpRequest, reason: str, client_id: str):
        _refuse(request, reason, client_id)
        raise ApiError(401, "invalid_signature", f"Webhook signature refused: {reason}.")

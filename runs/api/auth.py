"""Authentication of API clients: bearer tokens for calls, HMAC signatures for webhooks.

Bearer: `Authorization: Bearer <client_id>.<secret>`; the secret's SHA-256 is compared in
constant time with the stored one.

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

from django.http import HttpRequest
from ninja.security import HttpBearer
from ninja.security.base import AuthBase

from runs.api.errors import ApiError, read_body
from runs.api.models import ApiClient
from taskpilots.env import env_int

logger = logging.getLogger("taskpilots.api")

SIGNATURE_TOLERANCE_SECONDS = env_int("TASKPILOTS_WEBHOOK_TOLERANCE_SECONDS", 300, minimum=1)
CLIENT_HEADER = "X-TaskPilots-Client"
TIMESTAMP_HEADER = "X-TaskPilots-Timestamp"
SIGNATURE_HEADER = "X-TaskPilots-Signature"

# Compared against when the client id is unknown, so a miss costs the same as a wrong secret.
_DUMMY = ApiClient(secret_hash="0" * 64)


def _refuse(request: HttpRequest, reason: str, client_id: str = "") -> None:
    logger.warning(
        "api: refused %s %s from %s (client %r): %s",
        request.method,
        request.path,
        request.META.get("REMOTE_ADDR"),
        client_id[:40],
        reason,
    )


def _require_scope(client: ApiClient, scope: str) -> ApiClient:
    if not client.has_scope(scope):
        raise ApiError(403, "missing_scope", f"This client lacks the {scope} scope.")
    return client


def sign(signing_secret: str, timestamp: int | str, body: bytes) -> str:
    """The signature header value for a body (what a webhook sender computes)."""
    mac = hmac.new(signing_secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"sha256={mac.hexdigest()}"


class BearerAuth(HttpBearer):
    def __init__(self, scope: str):
        self.scope = scope
        super().__init__()

    def authenticate(self, request: HttpRequest, token: str) -> ApiClient | None:
        client_id, _, secret = token.partition(".")
        client = None
        if client_id and secret and len(token) <= 200:
            client = ApiClient.objects.active().filter(client_id=client_id).first()
        if not (client or _DUMMY).check_secret(secret) or client is None:
            _refuse(request, "bad or revoked bearer token", client_id)
            return None
        return _require_scope(client, self.scope)


class SignatureAuth(AuthBase):
    """HMAC-signed webhook; declared in OpenAPI as the signature header."""

    openapi_type = "apiKey"
    openapi_in = "header"
    openapi_name = SIGNATURE_HEADER

    def __init__(self, scope: str):
        self.scope = scope
        super().__init__()

    def __call__(self, request: HttpRequest) -> ApiClient | None:
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
        return _require_scope(client, self.scope)

    def _fail(self, request: HttpRequest, reason: str, client_id: str):
        _refuse(request, reason, client_id)
        raise ApiError(401, "invalid_signature", f"Webhook signature refused: {reason}.")

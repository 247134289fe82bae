"""Webhook signing secrets: derived with salted_hmac, while clients issued before keep verifying.

The secret is shown once and never stored, so a client made before the switch to salted_hmac
holds a secret only the old derivation reproduces. The migration marks existing clients with
that derivation (signing_version 1); rotating their credentials moves them to the new one.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time

import pytest
from django.conf import settings
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import Client

from runs.api.auth import sign
from runs.api.models import SIGNING_VERSION, ApiClient, ApiScope
from tests.dbroles import as_owner

pytestmark = pytest.mark.django_db

BODY = json.dumps({"event_id": "evt-sig", "event_type": "order.paid", "correlation_key": "o-1"})
BEFORE = ("runs", "0008_decisions_name_what_was_shown")
AFTER = ("runs", "0009_apiclient_signing_version")


def post_signed(client_id: str, secret: str) -> int:
    timestamp = int(time.time())
    headers = {
        "X-TaskPilots-Client": client_id,
        "X-TaskPilots-Timestamp": str(timestamp),
        "X-TaskPilots-Signature": sign(secret, timestamp, BODY.encode()),
    }
    response = Client().post(
        "/api/v1/events", BODY, content_type="application/json", headers=headers
    )
    return response.status_code


def legacy_secret(client_id: str, salt: str) -> str:
    """The secret a client was shown before salted_hmac (written out, not imported)."""
    material = f"taskpilots.webhook:{client_id}:{salt}".encode()
    return "whsec_" + hmac.new(settings.SECRET_KEY.encode(), material, hashlib.sha256).hexdigest()


def migrate(target: tuple[str, str]) -> None:
    with as_owner():  # migrations are the owner's (tests/dbroles.py)
        executor = MigrationExecutor(connection)
        executor.migrate([target])


def test_a_client_issued_before_salted_hmac_still_verifies_after_the_migration():
    # The client as it was stored before the migration (the test's transaction undoes all this).
    migrate(BEFORE)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO runs_apiclient (name, client_id, secret_hash, signing_salt, scopes,"
            " description, created_at) VALUES ('old-agent', 'tpc_0ld', %s, 'salt-1', %s, '',"
            " now())",
            ["0" * 64, json.dumps([ApiScope.EVENTS_WRITE])],
        )
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
    migrate(AFTER)

    old = ApiClient.objects.get(client_id="tpc_0ld")
    assert old.signing_version == 1
    assert post_signed("tpc_0ld", legacy_secret("tpc_0ld", "salt-1")) == 202
    # Rotating moves it to salted_hmac: the old secret stops working, the new one works.
    credentials = old.rotate_credentials()
    old.refresh_from_db()
    assert old.signing_version == SIGNING_VERSION
    assert post_signed("tpc_0ld", legacy_secret("tpc_0ld", "salt-1")) == 401
    assert post_signed("tpc_0ld", credentials.signing_secret) == 202


def test_a_new_client_signs_with_the_salted_hmac_derivation():
    client, credentials = ApiClient.issue("new-agent", [ApiScope.EVENTS_WRITE])

    assert client.signing_version == SIGNING_VERSION
    assert post_signed(client.client_id, credentials.signing_secret) == 202
    # The old derivation is not accepted for a client issued under the new one.
    assert (
        post_signed(client.client_id, legacy_secret(client.client_id, client.signing_salt)) == 401
    )

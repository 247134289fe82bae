"""People's API credentials (runs.api.models.PersonalToken, runs.api.auth): a personal token is
its person, within their role; a delegation lets one client act for the person who issued it,
for a short while; nothing else makes a call a person's. Tokens are stored hashed and shown
once."""

from __future__ import annotations

import hashlib
import io
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse
from django.utils import timezone

from approvals.models import ApprovalRequest
from runs import engine
from runs.api.models import ApiClient, ApiScope, PersonalToken
from tests.approvals.console_helpers import fast_passwords  # noqa: F401  (autouse)
from tests.factories import UserFactory
from tests.runs.test_api import Api, bearer

pytestmark = pytest.mark.django_db

ALL = ApiScope.values


@pytest.fixture
def bot(db):
    client, credentials = ApiClient.issue("slack-bot", ALL)
    client.token = credentials.token
    return client


def waiting_approval() -> ApprovalRequest:
    run, _ = engine.start_run("test.refund", {"amount": 150, "payment": "pay_1"})
    engine.run_until_quiet(run.pk)
    return ApprovalRequest.objects.get(run=run)


def delegation(user, client, *, minutes=5, scopes=ALL):
    return PersonalToken.issue(
        user, "d", scopes, client=client, expires_at=timezone.now() + timedelta(minutes=minutes)
    )


def test_a_personal_token_is_its_person_and_is_stored_hashed(support_user):
    token, issued = PersonalToken.issue(support_user, "laptop", ALL)
    secret = issued.token.split(".", 1)[1]
    assert token.secret_hash == hashlib.sha256(secret.encode()).hexdigest()
    assert secret not in str(PersonalToken.objects.filter(pk=token.pk).values().get())
    status, me = Api(bearer(issued.token)).get("/me")
    assert status == 200
    assert me["user"] == "sam-support" and me["client"] is None
    assert me["token"] == token.token_id and set(me["scopes"]) == set(ALL)


def test_a_token_acts_only_within_its_person_s_role_today(support_user):
    _, issued = PersonalToken.issue(support_user, "laptop", ALL)
    api = Api(bearer(issued.token))
    approval = waiting_approval()
    support_user.groups.clear()  # moved to another team: their tokens lose what the role gave
    status, data = api.post(f"/approvals/{approval.pk}/decision", {"decision": "approved"})
    assert (status, data["error"]["code"]) == (403, "missing_scope")
    assert api.get("/me")[1]["scopes"] == []


@pytest.mark.parametrize("state", ["revoked", "expired", "inactive", "wrong secret"])
def test_a_dead_token_authenticates_nobody(support_user, state):
    token, issued = PersonalToken.issue(support_user, "laptop", ALL)
    sent = issued.token
    if state == "revoked":
        token.revoke()
    elif state == "expired":
        PersonalToken.objects.filter(pk=token.pk).update(expires_at=timezone.now())
    elif state == "inactive":
        support_user.is_active = False
        support_user.save()
    else:
        sent = issued.token[:-2] + "xx"
    assert Api(bearer(sent)).get("/me")[0] == 401


def test_a_client_acts_for_a_person_only_with_their_delegation_to_it(bot, support_user):
    approval = waiting_approval()
    url = f"/approvals/{approval.pk}/decision"
    _, issued = delegation(support_user, bot)
    headers = {"X-TaskPilots-On-Behalf-Of": issued.token}
    status, me = Api(bearer(bot.token)).get("/me", headers=headers)
    assert (me["user"], me["client"]) == ("sam-support", "slack-bot")
    status, data = Api(bearer(bot.token)).post(url, {"decision": "approved"}, headers=headers)
    assert status == 200 and data["decided_by"] == "sam-support", data
    approval.refresh_from_db()
    assert approval.decided_by == support_user


def test_a_delegation_is_useless_to_anyone_else(bot, support_user):
    other, other_credentials = ApiClient.issue("mail-bot", ALL)
    _, to_bot = delegation(support_user, bot)
    # Another client presenting it; the delegation as a bearer token; an expired one.
    api = Api(bearer(other_credentials.token))
    status, data = api.get("/me", headers={"X-TaskPilots-On-Behalf-Of": to_bot.token})
    assert (status, data["error"]["code"]) == (401, "invalid_delegation")
    assert Api(bearer(to_bot.token)).get("/me")[0] == 401
    token, old = delegation(support_user, bot)
    PersonalToken.objects.filter(pk=token.pk).update(expires_at=timezone.now())
    status, _ = Api(bearer(bot.token)).get("/me", headers={"X-TaskPilots-On-Behalf-Of": old.token})
    assert status == 401


def test_a_delegation_carries_only_what_both_hold(support_user):
    narrow, credentials = ApiClient.issue("reader-bot", [ApiScope.RUNS_READ])
    _, issued = delegation(support_user, narrow)
    headers = {"X-TaskPilots-On-Behalf-Of": issued.token}
    _, me = Api(bearer(credentials.token)).get("/me", headers=headers)
    assert me["scopes"] == ["runs:read"]


def test_a_person_issues_a_delegation_over_the_api(bot, support_user):
    _, issued = PersonalToken.issue(support_user, "laptop", [ApiScope.APPROVALS_WRITE])
    api = Api(bearer(issued.token))
    status, data = api.post(
        "/delegations", {"client": "slack-bot", "scopes": ["approvals:write"], "minutes": 10}
    )
    assert status == 201, data
    assert (data["client"], data["user"], data["scopes"]) == (
        "slack-bot",
        "sam-support",
        ["approvals:write"],
    )
    token = PersonalToken.objects.get(token_id=data["token_id"])
    assert token.client == bot and token.expires_at <= timezone.now() + timedelta(minutes=10)
    # Not more than the token holds, not longer than an hour, not by a client for anyone.
    status, data = api.post("/delegations", {"client": "slack-bot", "scopes": ["runs:write"]})
    assert (status, data["error"]["code"]) == (403, "missing_scope")
    body = {"client": "slack-bot", "scopes": ["approvals:write"], "minutes": 61}
    assert api.post("/delegations", body)[0] == 422
    assert api.post("/delegations", {**body, "client": "nobody", "minutes": 5})[0] == 404
    # JSON has one number type: 5.0 minutes is 5 minutes (as the schema says); 5.5 and "5" are not.
    status, data = api.post("/delegations", {**body, "minutes": 5.0})
    assert status == 201, data
    for minutes in (5.5, "5"):
        assert api.post("/delegations", {**body, "minutes": minutes})[0] == 422, minutes
    status, data = Api(bearer(bot.token)).post(
        "/delegations", {"client": "slack-bot", "scopes": ["approvals:write"]}
    )
    assert (status, data["error"]["code"]) == (403, "person_required")
    # A person revokes their own token, and it stops at once.
    status, data = api.call("delete", f"/tokens/{token.token_id}")
    assert status == 200 and data["revoked"] is True
    headers = {"X-TaskPilots-On-Behalf-Of": "x"}
    assert Api(bearer(bot.token)).get("/me", headers=headers)[0] == 401


def test_the_console_shows_a_new_token_once_and_revokes_it(client, support_user):
    client.force_login(support_user)
    page = client.get(reverse("console:tokens"))
    assert page.status_code == 200 and page["Cache-Control"].startswith("no-store")
    body = {"kind": "personal", "name": "my scripts", "scopes": ["runs:read"], "days": 30}
    created = client.post(reverse("console:tokens"), body)
    assert created.status_code == 201
    token = PersonalToken.objects.get(user=support_user)
    text = created.content.decode()
    secret_line = next(line for line in text.splitlines() if token.token_id + "." in line)
    assert "Copy it now" in text and secret_line
    assert token.token_id + "." not in client.get(reverse("console:tokens")).content.decode()
    revoke = client.post(reverse("console:token-revoke", args=[token.token_id]))
    assert revoke.status_code == 302
    token.refresh_from_db()
    assert token.revoked_at is not None


def test_the_console_offers_only_the_scopes_a_role_allows(client, auditor_user):
    client.force_login(auditor_user)
    body = {"kind": "personal", "name": "audit", "scopes": ["approvals:write"], "days": 30}
    response = client.post(reverse("console:tokens"), body)
    assert response.status_code == 422 and not PersonalToken.objects.exists()
    body["scopes"] = ["runs:read"]
    assert client.post(reverse("console:tokens"), body).status_code == 201


def test_someone_else_s_token_cannot_be_revoked(client, support_user):
    token, _ = PersonalToken.issue(UserFactory(username="pat", groups=["support"]), "x", ALL)
    client.force_login(support_user)
    assert client.post(reverse("console:token-revoke", args=[token.token_id])).status_code == 404
    token.refresh_from_db()
    assert token.revoked_at is None


def test_an_admin_creates_a_token_for_a_person_with_the_command(support_user, auditor_user):
    out = io.StringIO()
    call_command("create_personal_token", "sam-support", "--scopes", "approvals:write", stdout=out)
    token = PersonalToken.objects.get(user=support_user)
    assert f"token:      {token.token_id}." in out.getvalue()
    with pytest.raises(CommandError, match="does not allow approvals:write"):
        call_command("create_personal_token", "ada-auditor", "--scopes", "approvals:write")
    call_command("create_personal_token", "--revoke", token.token_id, stdout=io.StringIO())
    token.refresh_from_db()
    assert token.revoked_at is not None

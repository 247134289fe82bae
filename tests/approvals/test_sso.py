"""Single sign-on below the browser (tests/browser/test_oidc_browser.py has the whole path):
the settings from the environment, the group → role mapping at each sign-in, matching on the
stored `sub` only, tokens the provider did not sign, the session renewal's exemptions, and the
login page with local passwords off."""

from __future__ import annotations

import time

import jwt
import pytest
import requests
from cryptography.hazmat.primitives.asymmetric import rsa
from django.contrib.auth.models import Group, User
from django.core.exceptions import ImproperlyConfigured, SuspiciousOperation
from django.test import RequestFactory, override_settings

from approvals.sso import conf, oidc, roles
from approvals.sso.models import OidcIdentity
from tests.factories import UserFactory
from tests.oidc_provider import OidcProvider

ISSUER = "https://idp.example.test/realms/staff"
MAPPING = {"tp-support": "support", "tp-auditors": "auditor", "tp-admins": "admin"}
ENDPOINTS = {
    "authorization": f"{ISSUER}/auth",
    "token": f"{ISSUER}/token",
    "userinfo": f"{ISSUER}/userinfo",
    "jwks": f"{ISSUER}/jwks",
}


def sso_settings(**changes) -> dict:
    settings = {
        "ENABLED": True,
        "LOCAL_PASSWORDS": True,
        "ISSUER": ISSUER,
        "CLIENT_ID": "taskpilots",
        "CLIENT_SECRET": "a-client-secret-of-the-tests",
        "PROVIDER_NAME": "Example IdP",
        "SCOPES": "openid email profile groups",
        "SIGN_ALGO": "RS256",
        "ENDPOINTS": dict(ENDPOINTS),
        "ROLES_CLAIM": "groups",
        "ROLES": dict(MAPPING),
        "RENEW_SECONDS": 900,
        "TIMEOUT": 5,
    }
    return {**settings, **changes}


def sso_on(**changes):
    return override_settings(
        TASKPILOTS_SSO=sso_settings(**changes),
        AUTHENTICATION_BACKENDS=conf.authentication_backends(sso_settings(**changes)),
    )


# --- Settings from the environment -----------------------------------------------------------


def test_roles_mapping_is_parsed_and_checked():
    assert conf.parse_roles(" tp-support=support, /staff/audit=auditor ,x=admin,y=admin") == {
        "tp-support": "support",
        "/staff/audit": "auditor",
        "x": "admin",
        "y": "admin",
    }
    with pytest.raises(ImproperlyConfigured, match="among support, auditor, admin"):
        conf.parse_roles("tp-support=superuser")
    with pytest.raises(ImproperlyConfigured, match="is mapped twice"):
        conf.parse_roles("g=support,g=admin")
    with pytest.raises(ImproperlyConfigured):
        conf.parse_roles("=support")


OIDC_ENV = {
    "TASKPILOTS_OIDC_ISSUER": "https://idp.example.test/",
    "TASKPILOTS_OIDC_CLIENT_ID": "taskpilots",
    "TASKPILOTS_OIDC_CLIENT_SECRET": "secret",
    "TASKPILOTS_OIDC_ROLES": "tp-support=support",
}


def test_off_unless_an_issuer_is_set_and_then_complete(monkeypatch):
    for name in [*OIDC_ENV, "TASKPILOTS_LOCAL_PASSWORDS", *conf.ENDPOINTS.values()]:
        monkeypatch.delenv(name, raising=False)
    assert conf.from_environment() == {"ENABLED": False, "LOCAL_PASSWORDS": True}
    assert conf.authentication_backends(conf.OFF) == [conf.PASSWORD_BACKEND]
    assert conf.middleware(conf.OFF) == []

    monkeypatch.setenv("TASKPILOTS_LOCAL_PASSWORDS", "0")
    with pytest.raises(ImproperlyConfigured, match="nobody could sign in"):
        conf.from_environment()
    monkeypatch.setenv("TASKPILOTS_OIDC_TOKEN_ENDPOINT", "https://idp.example.test/token")
    with pytest.raises(ImproperlyConfigured, match="TASKPILOTS_OIDC_ISSUER"):
        conf.from_environment()

    for name, value in OIDC_ENV.items():
        monkeypatch.setenv(name, value)
    sso = conf.from_environment()
    assert sso["ISSUER"] == "https://idp.example.test"  # the trailing slash is not the issuer's
    assert sso["PROVIDER_NAME"] == "idp.example.test"
    assert sso["ENDPOINTS"] == {"token": "https://idp.example.test/token"}
    assert conf.authentication_backends(sso) == [conf.OIDC_BACKEND]  # no password backend
    assert conf.middleware(sso) == [conf.OIDC_MIDDLEWARE]

    monkeypatch.setenv("TASKPILOTS_LOCAL_PASSWORDS", "1")
    assert conf.authentication_backends(conf.from_environment()) == [
        conf.OIDC_BACKEND,
        conf.PASSWORD_BACKEND,
    ]
    monkeypatch.setenv("TASKPILOTS_OIDC_SIGN_ALGO", "HS256")
    with pytest.raises(ImproperlyConfigured, match="JWKS"):
        conf.from_environment()
    monkeypatch.delenv("TASKPILOTS_OIDC_SIGN_ALGO")
    monkeypatch.delenv("TASKPILOTS_OIDC_CLIENT_SECRET")
    with pytest.raises(ImproperlyConfigured, match="TASKPILOTS_OIDC_CLIENT_SECRET is required"):
        conf.from_environment()


# --- Groups → roles, users by sub ------------------------------------------------------------


def test_claim_values_read_lists_strings_and_nested_claims():
    assert roles.claim_values({"groups": ["a", "b", 3, None]}, "groups") == ["a", "b", "3"]
    assert roles.claim_values({"groups": "a"}, "groups") == ["a"]
    assert roles.claim_values({"realm_access": {"roles": ["x"]}}, "realm_access.roles") == ["x"]
    assert roles.claim_values({"groups": {"a": 1}}, "groups") == []
    assert roles.claim_values({}, "groups") == []


def _backend(userinfo: dict, payload: dict | None = None):
    backend = oidc.RoleMappingBackend()
    backend.request = RequestFactory().get("/oidc/callback/")
    backend.get_userinfo = lambda access_token, id_token, payload: dict(userinfo)
    payload = payload or {"iss": ISSUER, "sub": userinfo["sub"]}
    return backend, (lambda: backend.get_or_create_user("access", "id", payload))


def _roles(user) -> set[str]:
    return set(user.groups.filter(name__in=conf.ROLE_NAMES).values_list("name", flat=True))


@pytest.mark.django_db
def test_each_sign_in_sets_the_roles_from_the_groups_and_leaves_other_groups_alone():
    claims = {"sub": "s-1", "preferred_username": "ann", "email": "ann@corp.test"}
    with sso_on():
        _, sign_in = _backend({**claims, "groups": ["tp-support", "everyone"]})
        user = sign_in()
        assert (user.username, user.email) == ("ann", "ann@corp.test")
        assert _roles(user) == {"support"}
        user.groups.add(Group.objects.get_or_create(name="on-call")[0])  # not a role

        _, sign_in = _backend({**claims, "groups": ["tp-auditors", "tp-admins"]})
        again = sign_in()
    assert again.pk == user.pk
    assert _roles(again) == {"auditor", "admin"}
    assert set(again.groups.values_list("name", flat=True)) == {"auditor", "admin", "on-call"}
    assert not again.is_superuser and not again.is_staff


@pytest.mark.django_db
def test_a_person_whose_groups_no_longer_map_loses_every_role_and_is_refused():
    claims = {"sub": "s-2", "preferred_username": "bo"}
    with sso_on():
        _, sign_in = _backend({**claims, "groups": ["tp-admins"]})
        user = sign_in()
        user.groups.add(Group.objects.get_or_create(name="on-call")[0])
        backend, sign_in = _backend({**claims, "groups": ["everyone"]})
        assert sign_in() is None
    assert backend.request.sso_refusal == "no_role"
    user.refresh_from_db()
    assert _roles(user) == set()
    assert set(user.groups.values_list("name", flat=True)) == {"on-call"}


@pytest.mark.django_db
def test_a_newcomer_with_no_role_gets_no_account():
    with sso_on():
        backend, sign_in = _backend({"sub": "s-3", "preferred_username": "cy", "groups": []})
        assert sign_in() is None
    assert backend.request.sso_refusal == "no_role"
    assert not User.objects.filter(username="cy").exists()
    assert not OidcIdentity.objects.exists()


@pytest.mark.django_db
def test_users_are_matched_on_the_stored_sub_never_on_email_or_username():
    local = UserFactory(username="dee", email="dee@corp.test", groups=["admin"])
    # Someone at the provider who calls themselves dee, with dee's address: a new account.
    claims = {"sub": "s-4", "preferred_username": "dee", "email": "dee@corp.test"}
    with sso_on():
        _, sign_in = _backend({**claims, "groups": ["tp-support"]})
        other = sign_in()
        assert other.pk != local.pk
        assert other.username.startswith("dee-") and len(other.username) == len("dee-") + 8
        # The same sub, renamed at the provider with a new address: still the same account.
        renamed = {"sub": "s-4", "preferred_username": "dee2", "email": "d2@corp.test"}
        _, sign_in = _backend({**renamed, "groups": ["tp-support"]})
        assert sign_in().pk == other.pk
        # filter_users_by_claims (the library's hook) answers by sub too.
        backend = oidc.RoleMappingBackend()
        assert list(backend.filter_users_by_claims({"email": "dee@corp.test"})) == []
        assert list(backend.filter_users_by_claims({"sub": "s-4"})) == [other]
    local.refresh_from_db()
    assert _roles(local) == {"admin"} and local.email == "dee@corp.test"
    assert OidcIdentity.objects.get(subject="s-4").user == other


@pytest.mark.django_db
def test_a_deactivated_account_is_refused_and_a_userinfo_about_someone_else_too():
    with sso_on():
        _, sign_in = _backend({"sub": "s-5", "preferred_username": "eve", "groups": ["tp-support"]})
        user = sign_in()
        User.objects.filter(pk=user.pk).update(is_active=False)
        backend, sign_in = _backend({"sub": "s-5", "groups": ["tp-support"]})
        assert sign_in() is None
        assert backend.request.sso_refusal == "inactive"

        someone_else = {"sub": "s-6", "groups": ["tp-admins"]}
        _, sign_in = _backend(someone_else, {"iss": ISSUER, "sub": "s-5"})
        with pytest.raises(SuspiciousOperation, match="another subject"):
            sign_in()


def test_a_password_form_is_never_taken_for_a_callback():
    request = RequestFactory().get("/accounts/login/", {"code": "c", "state": "s"})
    with sso_on():
        backend = oidc.RoleMappingBackend()
        assert backend.authenticate(request, username="x", password="y") is None
        assert backend.authenticate(request) is None


# --- Tokens: the provider's signature, issuer and audience -----------------------------------


@pytest.fixture(scope="module")
def provider():
    with OidcProvider(redirect_uris=["http://testserver/oidc/callback/"]) as running:
        yield running


def _token(key, algorithm="RS256", kid="test-key-1", **claims) -> str:
    now = int(time.time())
    payload = {"sub": "s-7", "iat": now, "exp": now + 300, "nonce": "n", **claims}
    return jwt.encode(payload, key, algorithm=algorithm, headers={"kid": kid} if kid else None)


def test_a_token_not_signed_by_the_provider_is_refused(provider):
    jwks = requests.get(f"{provider.issuer}/jwks", timeout=5).json()
    assert [key["kid"] for key in jwks["keys"]] == ["test-key-1"]
    claims = {"iss": provider.issuer, "aud": provider.client_id}
    another_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    settings = {
        "ISSUER": provider.issuer,
        "CLIENT_ID": provider.client_id,
        "CLIENT_SECRET": provider.client_secret,
        "ENDPOINTS": {},  # discovery: the provider's own JWKS
    }
    with sso_on(**settings):
        backend = oidc.RoleMappingBackend()
        # Another key under the provider's key id.
        with pytest.raises(SuspiciousOperation, match="verification failed"):
            backend.verify_token(_token(another_key, **claims), nonce="n")
        with pytest.raises(SuspiciousOperation, match="not valid"):  # and with no key id
            backend.verify_token(_token(another_key, kid=None, **claims), nonce="n")
        # Unsigned, and "signed" with the client secret (HS256): not the configured RS256.
        with pytest.raises(SuspiciousOperation, match="does not match"):
            backend.verify_token(_token(None, algorithm="none", kid=None, **claims), nonce="n")
        hs = _token(provider.client_secret, algorithm="HS256", **claims)
        with pytest.raises(SuspiciousOperation, match="does not match"):
            backend.verify_token(hs, nonce="n")


def test_the_issuer_audience_and_nonce_are_checked(monkeypatch):
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    monkeypatch.setattr(
        oidc.RoleMappingBackend, "retrieve_matching_jwk", lambda self, token: key.public_key()
    )
    good = {"iss": ISSUER, "aud": "taskpilots"}
    with sso_on():
        backend = oidc.RoleMappingBackend()
        assert backend.verify_token(_token(key, **good), nonce="n")["sub"] == "s-7"
        assert backend.verify_token(
            _token(key, iss=ISSUER, aud=["taskpilots", "api"], azp="taskpilots"), nonce="n"
        )
        refusals = {
            "another issuer": _token(key, iss="https://evil.example.test", aud="taskpilots"),
            "another client": _token(key, iss=ISSUER, aud="someone-else"),
            "another party": _token(key, iss=ISSUER, aud=["taskpilots", "api"], azp="api"),
        }
        for message, token in refusals.items():
            with pytest.raises(SuspiciousOperation, match=message):
                backend.verify_token(token, nonce="n")
        with pytest.raises(SuspiciousOperation, match="Nonce"):
            backend.verify_token(_token(key, **good), nonce="another")
        with pytest.raises(SuspiciousOperation, match="Expired"):
            backend.verify_token(_token(key, **good, exp=int(time.time()) - 60), nonce="n")


# --- The session renewal and the login page --------------------------------------------------


def renewal_on():
    from django.conf import settings

    return override_settings(
        TASKPILOTS_SSO=sso_settings(),
        AUTHENTICATION_BACKENDS=conf.authentication_backends(sso_settings()),
        MIDDLEWARE=[*settings.MIDDLEWARE, conf.OIDC_MIDDLEWARE],
    )


@pytest.mark.django_db
def test_a_due_session_goes_by_the_provider_except_the_api_health_and_htmx(client):
    user = UserFactory(username="fay", groups=["support"])
    with renewal_on():
        client.force_login(user, backend=conf.OIDC_BACKEND)
        session = client.session
        session["oidc_id_token_expiration"] = time.time() + 600
        session.save()
        assert client.get("/console/").status_code == 200  # not due yet

        session["oidc_id_token_expiration"] = time.time() - 1
        session.save()
        response = client.get("/console/")
        assert response.status_code == 302
        assert response["Location"].startswith(f"{ISSUER}/auth?")
        assert "prompt=none" in response["Location"] and "code_challenge=" in response["Location"]
        # A fragment cannot follow the provider's pages: the page reloads instead.
        fragment = client.get("/console/live/inbox/", headers={"HX-Request": "true"})
        assert fragment.status_code == 204 and fragment["HX-Refresh"] == "true"
        for path in ("/api/v1/runs", "/healthz", "/metrics", "/oidc/callback/"):
            response = client.get(path)
            assert response.status_code != 302 or ISSUER not in response["Location"], path


@pytest.mark.django_db
def test_a_password_session_is_never_sent_to_the_provider(client):
    user = UserFactory(username="gus", groups=["support"])
    with renewal_on():
        client.force_login(user, backend=conf.PASSWORD_BACKEND)
        assert client.get("/console/").status_code == 200


@pytest.mark.django_db
def test_the_login_page_offers_the_provider_and_refuses_passwords_when_they_are_off(client):
    UserFactory(username="hal", groups=["support"])
    with sso_on():
        page = client.get("/accounts/login/?next=/console/runs/").content.decode()
        assert "Sign in with Example IdP" in page
        assert 'href="/oidc/authenticate/?next=/console/runs/"' in page
        assert 'name="password"' in page  # both, while local passwords are on
    with sso_on(LOCAL_PASSWORDS=False):
        page = client.get("/accounts/login/").content.decode()
        assert "Sign in with Example IdP" in page and 'name="password"' not in page
        response = client.post(
            "/accounts/login/", {"username": "hal", "password": "correct horse battery"}
        )
        assert response.status_code == 403
        assert "Passwords are turned off here" in response.content.decode()
        assert "_auth_user_id" not in client.session


@pytest.mark.django_db
def test_without_single_sign_on_its_pages_are_not_there(client):
    page = client.get("/accounts/login/").content.decode()
    assert "Sign in with" not in page and 'name="password"' in page
    assert client.get("/oidc/authenticate/").status_code == 404
    assert client.get("/oidc/callback/?code=c&state=s").status_code == 404


@pytest.mark.django_db
def test_the_sign_in_goes_to_the_provider_with_state_nonce_and_pkce(client):
    with sso_on():
        response = client.get("/oidc/authenticate/?next=/console/runs/")
    assert response.status_code == 302
    location = response["Location"]
    assert location.startswith(f"{ISSUER}/auth?")
    for part in ("client_id=taskpilots", "response_type=code", "code_challenge_method=S256",
                 "scope=openid+email+profile+groups", "nonce=", "state="):  # fmt: skip
        assert part in location
    assert client.session["oidc_login_next"] == "/console/runs/"


@pytest.mark.django_db
def test_a_callback_with_an_unknown_state_says_so(client):
    with sso_on():
        client.get("/oidc/authenticate/")
        response = client.get("/oidc/callback/?code=c&state=not-ours")
    assert response.status_code == 400
    assert "could not be verified" in response.content.decode()


@pytest.mark.django_db
def test_signing_out_ends_the_provider_session_too_or_at_least_this_one(client):
    user = UserFactory(username="ivy", groups=["support"])
    end_session = f"{ISSUER}/logout"

    def signed_in(backend=conf.OIDC_BACKEND):
        client.force_login(user, backend=backend)
        session = client.session
        if backend == conf.OIDC_BACKEND:
            session["oidc_id_token"] = "the.id.token"
        session.save()

    with sso_on(ENDPOINTS={**ENDPOINTS, "end_session": end_session}):
        signed_in()
        response = client.post("/accounts/logout/")
        assert response.status_code == 302
        location = response["Location"]
        assert location.startswith(f"{end_session}?id_token_hint=the.id.token&")
        assert "post_logout_redirect_uri=http%3A%2F%2Ftestserver%2Faccounts%2Flogin%2F" in location
        assert "client_id=taskpilots" in location
        assert "_auth_user_id" not in client.session  # signed out here first
        # Signed in with a password: only here.
        signed_in(conf.PASSWORD_BACKEND)
        assert client.post("/accounts/logout/")["Location"] == "/accounts/login/"
    # Turned off, or a provider with no end_session_endpoint, or one that does not answer:
    # the session here ends all the same.
    with sso_on(SIGN_OUT_AT_PROVIDER=False, ENDPOINTS={**ENDPOINTS, "end_session": end_session}):
        signed_in()
        assert client.post("/accounts/logout/")["Location"] == "/accounts/login/"
        assert "_auth_user_id" not in client.session
    with sso_on(ISSUER="http://127.0.0.1:9", TIMEOUT=1):  # nothing listens on port 9
        signed_in()
        assert client.post("/accounts/logout/")["Location"] == "/accounts/login/"
        assert "_auth_user_id" not in client.session


def test_the_sign_out_redirect_is_allowed_by_the_content_security_policy():
    assert conf.sign_out_origins(sso_settings()) == ["https://idp.example.test"]
    ends = {**ENDPOINTS, "end_session": "https://login.example.test/oidc/logout"}
    assert conf.sign_out_origins(sso_settings(ENDPOINTS=ends)) == ["https://login.example.test"]
    assert conf.sign_out_origins(sso_settings(SIGN_OUT_AT_PROVIDER=False)) == []
    assert conf.sign_out_origins(conf.OFF) == []

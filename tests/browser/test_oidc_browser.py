"""Single sign-on end to end: Chromium, TaskPilots as production serves it (gunicorn, configured
only by its environment: issuer, client, role mapping, local passwords off) and a real OpenID
Connect provider (the npm `oidc-provider`, tests/oidc_provider/) with discovery, JWKS, its own
login page, token and userinfo endpoints, whose people's groups the test changes.

A support person signs in and gets the inbox's actions; moved to the auditors' group at the
provider, they are an auditor after their session's silent renewal; signing out ends their
session at the provider too (the next sign-in asks for the password again) and reads the groups
again; a person in no mapped group is refused with a page that says why, and no account
is made for them.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest
from django.contrib.auth.models import User
from django.contrib.sessions.backends.db import SessionStore
from playwright.sync_api import expect

from approvals.sso.models import OidcIdentity
from taskpilots.evidence.workers import ROOT, database_url
from tests.approvals.console_helpers import approval_run
from tests.oidc_provider import OidcProvider

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PROVIDER_NAME = "Example IdP"
ROLES = "tp-support=support,tp-auditors=auditor,tp-admins=admin"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for_port(process: subprocess.Popen, port: int) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"gunicorn did not start:\n{process.communicate()[0]}") from None
            time.sleep(0.1)


@pytest.fixture(scope="module")
def sso(django_db_setup):
    """(provider, TaskPilots' base URL): gunicorn on a free port with single sign-on on."""
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    with OidcProvider(
        redirect_uris=[f"{base}/oidc/callback/"],
        post_logout_redirect_uris=[f"{base}/accounts/login/"],
    ) as provider:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
        env.update(
            DATABASE_URL=database_url(),
            TASKPILOTS_TESTING="1",
            DEBUG="1",  # static files from the finders, as under make run
            TASKPILOTS_DISPATCH="none",
            TASKPILOTS_WORKFLOW_MODULES="taskpilots.demo.tools,tests.runs.flows",
            TASKPILOTS_OIDC_ISSUER=provider.issuer,
            TASKPILOTS_OIDC_CLIENT_ID=provider.client_id,
            TASKPILOTS_OIDC_CLIENT_SECRET=provider.client_secret,
            TASKPILOTS_OIDC_PROVIDER_NAME=PROVIDER_NAME,
            TASKPILOTS_OIDC_SCOPES="openid email profile groups",
            TASKPILOTS_OIDC_ROLES=ROLES,
            TASKPILOTS_LOCAL_PASSWORDS="0",
        )
        process = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "taskpilots.wsgi", "--bind", f"127.0.0.1:{port}",
             "--config", "python:taskpilots.gunicorn_conf", "--workers", "1", "--threads", "4",
             "--worker-class", "taskpilots.gunicorn_conf.JsonErrorThreadWorker",
             "--no-control-socket"],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        )  # fmt: skip
        try:
            _wait_for_port(process, port)
            yield provider, base
        finally:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()


@pytest.fixture
def browser_page(chromium, sso):
    _, base = sso
    context = chromium.new_context(
        base_url=base, locale="en-US", viewport={"width": 1280, "height": 900}
    )
    context.set_default_timeout(15_000)
    page = context.new_page()
    yield page
    context.close()


def _sign_in(page, login: str | None, password: str = "") -> None:
    """From the console to the provider and back; `login` None: the provider remembers us."""
    page.goto("/console/")
    page.wait_for_url("**/accounts/login/?next=/console/")
    page.get_by_role("link", name=f"Sign in with {PROVIDER_NAME}").click()
    if login is not None:
        expect(page.get_by_role("heading", name="Test identity provider")).to_be_visible()
        page.fill("#login", login)
        page.fill("#password", password)
        page.get_by_role("button", name="Continue").click()


def _roles(username: str) -> set[str]:
    names = User.objects.get(username=username).groups.values_list("name", flat=True)
    return set(names) & {"support", "auditor", "admin"}


def test_sign_in_maps_groups_to_roles_and_roles_follow_the_provider(browser_page, sso):
    provider, _ = sso
    page = browser_page
    run = approval_run()
    sub = provider.set_person("alice", password="alice-pw", groups=["tp-support", "staff"])

    # Local passwords are off: the login page has only the provider's button.
    page.goto("/accounts/login/")
    expect(page.get_by_role("link", name=f"Sign in with {PROVIDER_NAME}")).to_be_visible()
    assert page.locator("input[name=password]").count() == 0

    _sign_in(page, "alice", "alice-pw")
    page.wait_for_url("**/console/")
    expect(page.locator(".who")).to_have_text("alice")
    expect(page.locator(f"input[name=runs][value='{run.pk}']")).to_be_visible()  # may act
    expect(page.get_by_role("link", name="Audit")).to_have_count(0)
    assert _roles("alice") == {"support"}
    identity = OidcIdentity.objects.get(subject=sub)
    assert identity.issuer == provider.issuer and identity.user.username == "alice"
    assert identity.user.email == "alice@example.test"

    # Moved to the auditors at the provider. Her session renews itself silently when due
    # (prompt=none: the provider still knows her): the next page has the auditor's console.
    provider.set_person("alice", password="alice-pw", groups=["tp-auditors"])
    session_key = next(c["value"] for c in page.context.cookies() if c["name"] == "sessionid")
    session = SessionStore(session_key)
    session["oidc_id_token_expiration"] = 0
    session.save()
    page.goto("/console/runs/")
    page.wait_for_url("**/console/runs/")
    expect(page.get_by_role("link", name="Audit")).to_be_visible()
    assert _roles("alice") == {"auditor"}
    page.goto("/console/")
    expect(page.locator(f"input[name=runs][value='{run.pk}']")).to_have_count(0)
    expect(page.locator(".bulk-link-row")).to_have_count(0)

    # Back to support, then sign out and in again: the new sign-in reads the groups again.
    provider.set_person("alice", password="alice-pw", groups=["tp-support", "tp-admins"])
    page.get_by_role("button", name="Log out").click()
    # Signing out of TaskPilots ends her session at the provider too (it asks to confirm),
    # then comes back to the login page.
    page.wait_for_url(f"{provider.issuer}/session/end**")
    page.get_by_role("button", name="Yes, sign me out").click()
    page.wait_for_url("**/accounts/login/")
    page.goto("/console/")
    page.wait_for_url("**/accounts/login/?next=/console/")  # signed out here
    # The provider asks for her password again: nobody at this computer signs in as her.
    _sign_in(page, "alice", "alice-pw")
    page.wait_for_url("**/console/")
    expect(page.get_by_role("link", name="Rules")).to_be_visible()  # admins' page
    assert _roles("alice") == {"support", "admin"}
    # The same person, matched by sub: no second account.
    assert User.objects.filter(oidc_identities__subject=sub).count() == 1


def test_a_person_in_no_mapped_group_is_refused_and_gets_no_account(browser_page, sso):
    provider, _ = sso
    page = browser_page
    provider.set_person("mallory", password="mallory-pw", groups=["tp-everyone", "support"])

    _sign_in(page, "mallory", "mallory-pw")
    page.wait_for_url("**/oidc/callback/**")
    expect(page.get_by_role("heading", name="Sign-in refused")).to_be_visible()
    expect(page.get_by_role("alert")).to_contain_text(
        f"Your account at {PROVIDER_NAME} is in no group that has a TaskPilots role"
    )
    assert not User.objects.filter(email="mallory@example.test").exists()
    assert not OidcIdentity.objects.exists()

    page.goto("/console/")
    page.wait_for_url("**/accounts/login/?next=/console/")


def test_a_wrong_password_at_the_provider_never_reaches_the_console(browser_page, sso):
    provider, _ = sso
    page = browser_page
    provider.set_person("bob", password="bob-pw", groups=["tp-support"])
    _sign_in(page, "bob", "not-bobs-password")
    expect(page.get_by_role("alert")).to_contain_text("Unknown login or wrong password")
    assert not User.objects.filter(username="bob").exists()

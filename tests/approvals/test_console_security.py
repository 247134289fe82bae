"""Agent and tool data is rendered as inert text, big values are clipped, the CSP holds, the
login resists guessing, and the console speaks the user's language."""

from __future__ import annotations

import pytest
from django.core.cache import cache
from django.urls import reverse

from approvals.auth import LOGIN_MAX_FAILURES
from tests.approvals.console_helpers import (  # noqa: F401  (fast_passwords is autouse)
    approval_run,
    fast_passwords,
    start,
)

pytestmark = pytest.mark.django_db

PAYLOADS = [
    "<script>alert(1)</script>",
    '<img src=x onerror="alert(2)">',
    '" hx-post="/console/runs/" hx-trigger="load',
    "javascript:alert(3)",
    "</pre><button hx-get='/admin/'>x</button>",
]


def test_untrusted_data_is_escaped_everywhere(client, sandbox, support_user):
    hostile = " ".join(PAYLOADS)
    run = start("test.refund", {"amount": 150, "payment": hostile, "note": hostile},
                business_key="<b>key</b>")  # fmt: skip
    client.force_login(support_user)
    for path in (
        reverse("console:run-detail", args=[run.pk]),
        reverse("console:run-detail", args=[run.pk]) + "?tab=events",
        reverse("console:run-detail", args=[run.pk]) + "?tab=rehydration",
        "/console/",
        "/console/runs/?q=%3Cb%3Ekey%3C/b%3E",
    ):
        text = client.get(path).content.decode()
        assert "<script>alert" not in text, path
        assert "<img src=x" not in text and "<button hx-get='/admin/'" not in text, path
        assert 'hx-post="/console/runs/"' not in text, path
        assert 'href="javascript:' not in text, path
        assert "<b>key</b>" not in text, path
    detail = client.get(reverse("console:run-detail", args=[run.pk])).content.decode()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in detail
    # Untrusted blocks sit under hx-disable, so htmx ignores attributes that slip into them.
    assert detail.count("hx-disable") >= 5


def test_the_page_allows_no_inline_script_or_style(client, sandbox, support_user):
    run = approval_run()
    client.force_login(support_user)
    response = client.get(reverse("console:run-detail", args=[run.pk]))
    csp = response["Content-Security-Policy"]
    assert "script-src 'self' 'nonce-" in csp and "style-src 'self'" in csp
    text = response.content.decode()
    assert " style=" not in text and "<style" not in text
    nonce = csp.split("'nonce-")[1].split("'")[0]
    scripts = text.count("<script")
    assert scripts == text.count(f'nonce="{nonce}"') and scripts >= 1
    assert "onclick=" not in text and "hx-on" not in text


def test_huge_and_deep_parameters_are_clipped_with_a_raw_link(client, sandbox, support_user):
    deep: dict = {"leaf": "end"}
    for level in range(30):
        deep = {f"level{level}": deep}
    run = start("test.refund", {"amount": 150, "payment": "pay_1", "blob": "x" * 50_000,
                                "deep": deep})  # fmt: skip
    client.force_login(support_user)
    response = client.get(reverse("console:run-detail", args=[run.pk]))
    text = response.content.decode()
    assert "Shortened: this value is too large" in text
    assert "x" * 5000 not in text
    raw_url = reverse("console:run-raw", args=[run.pk, "input"])
    assert raw_url in text
    raw = client.get(raw_url)
    assert raw["Content-Type"] == "application/json"
    assert raw.json()["blob"] == "x" * 50_000


def test_the_console_speaks_simplified_chinese(client, sandbox, support_user):
    run = approval_run()
    client.force_login(support_user)
    response = client.get("/console/", HTTP_ACCEPT_LANGUAGE="zh-Hans,zh;q=0.9")
    text = response.content.decode()
    assert '<html lang="zh-hans">' in text
    assert "等待处理的运行" in text and "审批" in text
    detail = client.get(reverse("console:run-detail", args=[run.pk]),
                        HTTP_ACCEPT_LANGUAGE="zh-Hans").content.decode()  # fmt: skip
    assert "建议的下一步" in detail and "payments.refund" in detail


def test_the_language_switcher_sets_the_users_choice(client, support_user):
    client.force_login(support_user)
    response = client.post("/i18n/setlang/", {"language": "zh-hans", "next": "/console/"})
    assert response.status_code == 302
    assert "等待处理的运行" in client.get("/console/").content.decode()
    client.post("/i18n/setlang/", {"language": "en", "next": "/console/"})
    assert "Runs waiting for a person" in client.get("/console/").content.decode()


@pytest.fixture
def clean_cache():
    cache.clear()
    yield
    cache.clear()


def test_login_locks_out_after_repeated_failures(client, clean_cache, support_user, caplog):
    login = reverse("login")
    for _ in range(LOGIN_MAX_FAILURES - 1):
        assert (
            client.post(login, {"username": "sam-support", "password": "nope"}).status_code == 200
        )
    with caplog.at_level("WARNING", logger="taskpilots.console"):
        locked = client.post(login, {"username": "sam-support", "password": "nope"})
    assert locked.status_code == 429
    assert "Too many failed attempts" in locked.content.decode()
    assert "login failed: username='sam-support'" in caplog.text
    # Even the right password is refused while locked out...
    right = client.post(login, {"username": "sam-support", "password": "correct horse battery"})
    assert right.status_code == 429 and "_auth_user_id" not in client.session
    # ...but another username from the same address is not.
    other = client.post(login, {"username": "someone", "password": "nope"})
    assert other.status_code == 200


def test_a_good_login_resets_the_count(client, clean_cache, support_user):
    login = reverse("login")
    for _ in range(LOGIN_MAX_FAILURES - 1):
        client.post(login, {"username": "sam-support", "password": "nope"})
    ok = client.post(login, {"username": "sam-support", "password": "correct horse battery"})
    assert ok.status_code == 302 and ok["Location"] == "/console/"
    client.logout()
    assert client.post(login, {"username": "sam-support", "password": "nope"}).status_code == 200

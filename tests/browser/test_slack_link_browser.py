"""Linking one's own Slack account in a real browser, at a desk's, a laptop's and a phone's
width, in English and in Chinese: the confirmation page, a refusal (someone else's Slack
account, a forged link), the tokens page's "Your Slack account" with Unlink, and "already
linked" fit without sideways scrolling, have no script error, and link and unlink
(tests/approvals/test_slack_link.py covers every refusal). Screenshots go to /tmp/slack-link/.
"""

from __future__ import annotations

import time
from pathlib import Path
from unittest import mock

import pytest
from django.contrib.auth.models import Group
from django.urls import reverse
from playwright.sync_api import expect

from approvals import slack_link
from approvals.models import SlackIdentity
from tests.approvals.test_slack import TEAM, fake_slack  # noqa: F401  (the fixture)
from tests.browser.conftest import log_in
from tests.factories import UserFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SHOTS = Path("/tmp/slack-link")
FITS = "document.documentElement.scrollWidth <= window.innerWidth + 1"
WORDS = {
    "en": {
        "confirm": "Link your Slack account?",
        "button": "Link this Slack account to me",
        "refused": "This link cannot be used",
        "section": "Your Slack account",
        "unlink": "Unlink",
        "already": "Your Slack account is linked",
    },
    "zh-hans": {
        "confirm": "关联你的 Slack 账号？",
        "button": "把这个 Slack 账号关联到我",
        "refused": "此链接无法使用",
        "section": "你的 Slack 账号",
        "unlink": "取消关联",
        "already": "你的 Slack 账号已关联",
    },
}


def _shot(page, language: str, width: int, name: str) -> None:
    SHOTS.mkdir(exist_ok=True)
    assert page.evaluate(FITS), (name, language, width)
    page.screenshot(path=SHOTS / f"{name}-{language}-{width}.png", full_page=True)


def _link(slack_user: str) -> str:
    return reverse("console:slack-link", args=[slack_link.sign(TEAM, slack_user)])


@pytest.mark.parametrize("language", ["en", "zh-hans"])
@pytest.mark.parametrize("width", [1440, 1024, 390])
def test_the_link_pages_fit_and_link_and_unlink(page, support_user, fake_slack, width, language):  # noqa: F811
    words = WORDS[language]
    fake_slack.emails["USAM0001"] = support_user.email  # Slack's profile has Sam's address
    other = UserFactory(username="ann", groups=["support"])
    SlackIdentity.objects.create(user=other, team_id=TEAM, slack_user_id="UANN")
    page.set_viewport_size({"width": width, "height": 844})
    log_in(page, support_user.username)
    if language == "zh-hans":
        page.click(".lang-switch button[value=zh-hans]")
        page.wait_for_load_state()

    mine = _link("USAM0001")
    page.goto(mine)
    expect(page.get_by_role("heading", name=words["confirm"])).to_be_visible()
    expect(page.locator(".slack-link .slack-who")).to_contain_text(support_user.username)
    _shot(page, language, width, "confirm")

    assert page.goto(_link("UANN")).status == 409  # someone else's Slack account
    expect(page.get_by_role("heading", name=words["refused"])).to_be_visible()
    _shot(page, language, width, "taken")
    assert page.goto("/console/slack/link/not-a-token/").status == 400
    _shot(page, language, width, "forged")
    assert page.goto(_link("UEVE0001")).status == 403  # a Slack account with another address
    expect(page.get_by_role("heading", name=words["refused"])).to_be_visible()
    _shot(page, language, width, "mismatch")

    page.goto(mine)
    page.get_by_role("button", name=words["button"]).click()
    page.wait_for_url("**/console/tokens/")
    section = page.locator("#slack")
    expect(section.get_by_role("heading", name=words["section"])).to_be_visible()
    expect(section).to_contain_text("USAM0001")
    assert SlackIdentity.objects.get(slack_user_id="USAM0001").user == support_user
    _shot(page, language, width, "tokens-linked")

    page.goto(mine)
    expect(page.get_by_role("heading", name=words["already"])).to_be_visible()
    _shot(page, language, width, "already")

    page.goto("/console/tokens/")
    page.locator("#slack").get_by_role("button", name=words["unlink"]).click()
    page.wait_for_url("**/console/tokens/")
    assert not SlackIdentity.objects.filter(slack_user_id="USAM0001").exists()
    _shot(page, language, width, "tokens-unlinked")
    if language == "zh-hans":
        assert "No Slack account is linked" not in page.content()
    # The refusals' own statuses (409, 400, 403) are logged as failed loads; nothing else may be.
    expected = ("409 (Conflict)", "400 (Bad Request)", "403 (Forbidden)")
    assert [e for e in page.console_errors if not e.endswith(expected)] == []


@pytest.mark.parametrize("language", ["en", "zh-hans"])
@pytest.mark.parametrize("width", [1440, 1024, 390])
def test_the_role_and_expired_refusals_fit(page, auditor_user, width, language):
    page.set_viewport_size({"width": width, "height": 844})
    log_in(page, auditor_user.username)
    if language == "zh-hans":
        page.click(".lang-switch button[value=zh-hans]")
        page.wait_for_load_state()
    assert page.goto(_link("UADA0001")).status == 403  # an auditor does not decide
    expect(page.get_by_role("heading", name=WORDS[language]["refused"])).to_be_visible()
    _shot(page, language, width, "role")
    with mock.patch("time.time", return_value=time.time() - 31 * 60):
        expired = _link("UADA0001")
    auditor_user.groups.add(Group.objects.get_or_create(name="support")[0])
    assert page.goto(expired).status == 410
    _shot(page, language, width, "expired")
    assert not SlackIdentity.objects.exists()

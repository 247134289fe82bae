"""People link their own Slack account (approvals/slack_link.py): an unlinked press in Slack is
answered with a signed, short-lived link; the console's page confirms on GET and links on POST.
Forged, expired, someone else's Slack account, a role that does not decide, a missing CSRF
token: refused with a page, nothing written. Unlinking counts from the next press.

The fake Slack, the signed presses and the people come from tests/approvals/test_slack.py."""

from __future__ import annotations

import re
import time
from unittest import mock
from urllib.parse import unquote, urlsplit

import pytest
from django.core import signing
from django.test import Client

from approvals import slack_link
from approvals.models import ApprovalRequest, HumanDecision, SlackIdentity
from tests.approvals.console_helpers import fast_passwords  # noqa: F401
from tests.approvals.test_slack import (  # noqa: F401  (fixtures)
    TEAM,
    block_actions,
    fake_slack,
    people,
    posted,
    press,
    signed,
    written,
)
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

LINK = re.compile(
    r"<(https://tp\.example\.com(/console/slack/link/[^|>]+/))\|Link your Slack account>"
)


def link_for(slack_api, message, slack_user: str) -> str:
    """Press Approve as `slack_user` and return the path of the link the answer carries."""
    assert press(signed(block_actions(message, "approve", slack_user))).status_code == 200
    told = slack_api.of("chat.postEphemeral")[-1]
    assert told["user"] == slack_user
    found = LINK.search(told["text"])
    assert found, told["text"]
    return found[2]


def signed_in(user, **kwargs) -> Client:
    client = Client(**kwargs)
    client.force_login(user)
    return client


def state() -> tuple:
    return tuple(
        SlackIdentity.objects.order_by("pk").values_list(
            "pk", "user_id", "team_id", "slack_user_id"
        )
    )


def test_an_unlinked_person_links_themselves_and_their_next_press_decides(posted, fake_slack):  # noqa: F811
    run, message = posted
    dan = UserFactory(username="dan", groups=["support"])
    before = written(run)
    path = link_for(fake_slack, message, "UDAN")
    told = fake_slack.of("chat.postEphemeral")[-1]["text"]
    assert "not linked to a TaskPilots user" in told and "30 minutes" in told
    assert written(run) == before

    # Signed out: the login page, which comes back here.
    answer = Client().get(path)
    assert answer.status_code == 302 and f"next={path}" in unquote(answer["Location"])

    client = signed_in(dan)
    page = client.get(path)
    assert page.status_code == 200 and "no-store" in page["Cache-Control"]
    text = page.content.decode()
    assert "UDAN" in text and TEAM in text and "<strong><bdi>dan</bdi></strong>" in text
    assert "will act as you" in text and "Link only a Slack account that is yours." in text
    assert 'name="csrfmiddlewaretoken"' in text
    assert SlackIdentity.user_for(TEAM, "UDAN") is None  # GET writes nothing

    linked = client.post(path)
    assert linked.status_code == 302 and linked["Location"] == "/console/tokens/"
    identity = SlackIdentity.objects.get(team_id=TEAM, slack_user_id="UDAN")
    assert identity.user == dan and identity.linked_by == "console:dan"
    tokens = client.get("/console/tokens/").content.decode()
    assert "is linked to you" in tokens and "UDAN" in tokens and "Unlink" in tokens

    # The next press decides as dan, through the console's action.
    press(signed(block_actions(message, "approve", "UDAN")))
    approval = ApprovalRequest.objects.get(run=run)
    assert approval.status == "decided" and approval.decided_by == dan
    assert HumanDecision.objects.get(run=run).user == dan
    assert fake_slack.of("chat.postEphemeral")[-1]["text"].startswith("Approved.")


def test_a_forged_or_tampered_token_is_refused(posted, fake_slack, people):  # noqa: F811
    _, message = posted
    dan = UserFactory(username="dan", groups=["support"])
    path = link_for(fake_slack, message, "UDAN")
    client = signed_in(dan)
    token = path.rstrip("/").rsplit("/", 1)[1]
    other_salt = signing.dumps({"t": TEAM, "u": "UDAN"}, salt="taskpilots.approvals.mail-decision")
    bad_ids = signing.dumps({"t": TEAM, "u": "<script>"}, salt=slack_link.SALT)
    forged = [token[:-2] + ("AA" if not token.endswith("AA") else "BB"), other_salt, bad_ids, "x"]
    before = state()
    for value in forged:
        for method in (client.get, client.post):
            answer = method(f"/console/slack/link/{value}/")
            assert answer.status_code == 400, value
            assert "not one TaskPilots made" in answer.content.decode()
    assert state() == before


def test_an_expired_link_is_refused(fake_slack, people):  # noqa: F811
    dan = UserFactory(username="dan", groups=["support"])
    with mock.patch("time.time", return_value=time.time() - 31 * 60):
        token = slack_link.sign(TEAM, "UDAN")
    client = signed_in(dan)
    before = state()
    for method in (client.get, client.post):
        answer = method(f"/console/slack/link/{token}/")
        assert answer.status_code == 410
        assert "expired" in answer.content.decode()
    assert state() == before


def test_someone_elses_slack_account_is_refused_and_sent_to_an_admin(fake_slack, people):  # noqa: F811
    dan = UserFactory(username="dan", groups=["support"])
    path = urlsplit(slack_link.url_for(TEAM, "UANN")).path  # ann's Slack account
    client = signed_in(dan)
    before = state()
    for method in (client.get, client.post):
        answer = method(path)
        assert answer.status_code == 409
        text = answer.content.decode()
        assert "already linked to another person" in text and "ask an admin" in text
        assert not re.search(r"\bann\b", text)  # who it is linked to is not told
    assert state() == before
    assert SlackIdentity.user_for(TEAM, "UANN") == people["ann"]


def test_a_role_that_does_not_decide_cannot_link(fake_slack, people):  # noqa: F811
    path = urlsplit(slack_link.url_for(TEAM, "UNEW")).path
    nobody = UserFactory(username="nobody", groups=[])
    before = state()
    for user, why in (
        (people["audrey"], "Your role may not act on runs."),
        (nobody, "You have no console role; ask an admin for access."),
    ):
        client = signed_in(user)
        for method in (client.get, client.post):
            answer = method(path)
            assert answer.status_code == 403
            text = answer.content.decode()
            assert why in text and "only for people who decide" in text
    assert state() == before


def test_already_linked_to_the_same_person_says_so_and_writes_nothing(fake_slack, people):  # noqa: F811
    path = urlsplit(slack_link.url_for(TEAM, "UANN")).path
    client = signed_in(people["ann"])
    before = state()
    for method in (client.get, client.post):
        answer = method(path)
        assert answer.status_code == 200
        assert "is already linked to you" in answer.content.decode()
    assert state() == before


def test_unlinking_counts_from_the_next_press_and_only_for_ones_own(posted, fake_slack, people):  # noqa: F811
    run, message = posted
    ann, bob = people["ann"], people["bob"]
    ann_link = SlackIdentity.objects.get(user=ann)
    before = state()
    # Someone else's link: not found, kept; GET does nothing.
    assert (
        signed_in(bob).post(f"/console/slack/identities/{ann_link.pk}/unlink/").status_code == 404
    )
    assert signed_in(ann).get(f"/console/slack/identities/{ann_link.pk}/unlink/").status_code == 405
    assert state() == before

    client = signed_in(ann)
    answer = client.post(f"/console/slack/identities/{ann_link.pk}/unlink/")
    assert answer.status_code == 302 and answer["Location"] == "/console/tokens/"
    assert not SlackIdentity.objects.filter(pk=ann_link.pk).exists()
    page = client.get("/console/tokens/").content.decode()
    assert "no longer linked to you" in page and "No Slack account is linked to you." in page

    decided = written(run)
    path = link_for(fake_slack, message, "UANN")  # her press now decides nothing
    assert written(run) == decided
    assert path.startswith("/console/slack/link/")


def test_without_the_csrf_token_nothing_is_linked_or_unlinked(fake_slack, people):  # noqa: F811
    dan = UserFactory(username="dan", groups=["support"])
    path = urlsplit(slack_link.url_for(TEAM, "UDAN")).path
    ann_link = SlackIdentity.objects.get(user=people["ann"])
    before = state()
    assert signed_in(dan, enforce_csrf_checks=True).post(path).status_code == 403
    ann = signed_in(people["ann"], enforce_csrf_checks=True)
    assert ann.post(f"/console/slack/identities/{ann_link.pk}/unlink/").status_code == 403
    assert state() == before


def test_without_a_public_address_the_answer_has_no_link(posted, fake_slack, settings):  # noqa: F811
    _, message = posted
    settings.TASKPILOTS = {**settings.TASKPILOTS, "PUBLIC_URL": ""}
    press(signed(block_actions(message, "approve", "UDAN")))
    told = fake_slack.of("chat.postEphemeral")[-1]["text"]
    assert "Ask an admin to link it (manage.py link_slack_user)" in told
    assert "/console/slack/link/" not in told
    assert slack_link.url_for(TEAM, "UDAN") == ""
    settings.TASKPILOTS = {**settings.TASKPILOTS, "PUBLIC_URL": "https://tp.example.com"}
    assert slack_link.url_for("", "UDAN") == "" and slack_link.url_for(TEAM, "<b>") == ""


def test_the_answer_and_its_link_are_in_the_persons_slack_language(posted, fake_slack):  # noqa: F811
    _, message = posted
    fake_slack.locales["UDAN"] = "zh-CN"
    press(signed(block_actions(message, "approve", "UDAN")))
    told = fake_slack.of("chat.postEphemeral")[-1]["text"]
    assert "你的 Slack 账号尚未关联 TaskPilots 用户" in told and "30 分钟" in told
    assert re.search(
        r"<https://tp\.example\.com/console/slack/link/[^|>]+/\|关联你的 Slack 账号>", told
    )


def test_a_link_made_between_the_page_and_the_press_is_not_made_twice(fake_slack, people):  # noqa: F811
    dan = UserFactory(username="dan", groups=["support"])
    client = signed_in(dan)
    SlackIdentity.objects.create(user=dan, team_id=TEAM, slack_user_id="UDAN")
    fake_slack.emails["UANN"] = dan.email  # past the address check: the race is what is tested
    before = state()
    # Linked in another tab (dan's own) or by an admin (ann's) after the page was read: the
    # unique constraint answers, and the page says which.
    for slack_user, status, says in (
        ("UDAN", 200, "is already linked to you"),
        ("UANN", 409, "already linked to another person"),
    ):
        linked = SlackIdentity.objects.get(team_id=TEAM, slack_user_id=slack_user)
        with mock.patch.object(slack_link, "_existing", side_effect=[None, linked]):
            answer = client.post(urlsplit(slack_link.url_for(TEAM, slack_user)).path)
        assert answer.status_code == status and says in answer.content.decode()
    assert state() == before


def test_a_slack_account_whose_email_is_not_the_persons_is_not_linked(posted, fake_slack):  # noqa: F811
    """Eve presses in Slack and sends her link to Dan: opened and pressed by Dan, it would make
    Eve's presses decide as Dan. Her Slack profile's address is not his: refused, nothing
    written; the same when Slack does not say the address (no users:read.email scope)."""
    run, message = posted
    dan = UserFactory(username="dan", groups=["support"])
    path = link_for(fake_slack, message, "UEVE")
    client = signed_in(dan, enforce_csrf_checks=True)
    before = (state(), written(run))
    page = client.get(path)
    assert page.status_code == 403
    assert "is not your address in TaskPilots" in page.content.decode()
    assert client.post(path, {}).status_code == 403  # CSRF-checked POST: refused all the same
    assert (state(), written(run)) == before

    fake_slack.emails["UEVE"] = None
    page = client.get(path)
    assert page.status_code == 403
    assert "users:read.email" in page.content.decode()
    assert (state(), written(run)) == before

    # Dan's own Slack account, whose profile has his address: linked.
    own = link_for(fake_slack, message, "UDAN")
    plain = signed_in(dan)
    assert plain.post(own).status_code == 302
    assert SlackIdentity.objects.get(slack_user_id="UDAN").user == dan

"""Deciding an approval in Slack, end to end, without the network: a fake Slack Web API server
started here records what TaskPilots posts and updates (chat.postMessage, chat.update,
chat.postEphemeral, views.open) and answers with Slack's documented shapes; the test presses
the buttons by POSTing Slack's documented block_actions / view_submission payloads, signed as
Slack signs them (v0 HMAC-SHA256 of "v0:{timestamp}:{body}").

A press goes through the console's own action (the same decision rows and timeline events as
the console's); a forged, replayed, expired or wrong person's press writes nothing."""

from __future__ import annotations

import hashlib
import hmac
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from io import StringIO
from urllib.parse import parse_qs, urlencode

import pytest
from django.core.cache import cache
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from approvals import actions, notifications
from approvals.models import (
    ApprovalRequest,
    EscalationRule,
    HumanDecision,
    NotificationChannel,
    NotificationDelivery,
    SlackIdentity,
    SlackMessage,
    SoftClaim,
)
from approvals.notifications import ChannelForm
from runs import engine
from runs.models import Run, TimelineEvent
from tests.approvals.console_helpers import approval_run, fast_passwords  # noqa: F401
from tests.approvals.test_two_person import PAID, waiting
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
TEAM = "T0TEAM0001"
CHANNEL = "C0SUPPORT1"
URL = "/slack/interactivity/"


class FakeSlack:
    """Slack's Web API on a free local port: every call recorded as (method, body, headers)."""

    def __init__(self):
        self.calls: list[tuple[str, dict, dict]] = []
        self.down = False
        self._ts = 0
        # Each Slack user's locale as users.info tells it (None: the app lacks users:read),
        # and their profile's email (None: it lacks users:read.email); by default UANN's is
        # ann@example.com, the address the tests' people have.
        self.locales: dict[str, str | None] = {}
        self.emails: dict[str, str | None] = {}
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # users.info: its arguments in the query string
                path, _, query = self.path.partition("?")
                self.reply(path.rsplit("/", 1)[-1], {k: v[0] for k, v in parse_qs(query).items()})

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
                if "json" in (self.headers.get("Content-Type") or ""):
                    body = json.loads(raw or "{}")
                else:
                    body = {k: v[0] for k, v in parse_qs(raw).items()}
                self.reply(self.path.rsplit("/", 1)[-1], body)

            def reply(self, method: str, body: dict):
                fake.calls.append((method, body, dict(self.headers)))
                status, answer = fake.answer(method, body)
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/api/"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def answer(self, method: str, body: dict) -> tuple[int, dict]:
        if self.down:
            return 503, {"ok": False, "error": "service_unavailable"}
        if method == "chat.postMessage":
            self._ts += 1
            ts = f"1700000000.{self._ts:06d}"
            return 200, {"ok": True, "channel": body["channel"], "ts": ts, "message": body}
        if method in ("chat.update", "chat.delete"):
            return 200, {"ok": True, "channel": body["channel"], "ts": body["ts"]}
        if method == "chat.postEphemeral":
            return 200, {"ok": True, "message_ts": "1700000099.000001"}
        if method == "users.info":
            locale = self.locales.get(body["user"], "en-US")
            if locale is None:
                return 200, {"ok": False, "error": "missing_scope", "needed": "users:read"}
            user = {"id": body["user"], "locale": locale, "profile": {}}
            email = self.emails.get(body["user"], f"{body['user'][1:].lower()}@example.com")
            if email is not None:
                user["profile"]["email"] = email
            return 200, {"ok": True, "user": user}
        if method == "views.open":
            return 200, {"ok": True, "view": {"id": "V0MODAL001", **body["view"]}}
        return 200, {"ok": False, "error": "unknown_method"}

    def of(self, method: str) -> list[dict]:
        return [body for name, body, _ in self.calls if name == method]


@pytest.fixture
def fake_slack(settings):
    fake = FakeSlack()
    fake.thread.start()
    cache.clear()  # the people's Slack languages (slack.language_of) from any earlier test
    settings.TASKPILOTS = {
        **settings.TASKPILOTS,
        "PUBLIC_URL": "https://tp.example.com",
        "SLACK_BOT_TOKEN": "xoxb-test-token",
        "SLACK_SIGNING_SECRET": SECRET,
        "SLACK_API_URL": fake.url,
    }
    yield fake
    fake.server.shutdown()
    fake.server.server_close()


@pytest.fixture
def people(db):
    found = {n: UserFactory(username=n, groups=["support"]) for n in ("ann", "bob", "cat")}
    found["audrey"] = UserFactory(username="audrey", groups=["auditor"])
    for name, user in found.items():
        SlackIdentity.objects.create(user=user, team_id=TEAM, slack_user_id=f"U{name.upper()}")
    return found


def slack_channel(queue: str = "support") -> NotificationChannel:
    return NotificationChannel.objects.create(queue=queue, kind="slack", target=CHANNEL)


def written(run) -> tuple:
    """Everything a decision writes: decisions, timeline events, the request and the run."""
    approval = ApprovalRequest.objects.filter(run=run).order_by("-id").first()
    fresh = Run.objects.get(pk=run.pk)
    return (
        HumanDecision.objects.count(),
        TimelineEvent.objects.filter(run=run).count(),
        (approval.status, approval.first_approved_by_id) if approval else None,
        fresh.status,
        fresh.lock_version,
    )


def buttons(message: dict) -> dict[str, dict]:
    """The buttons of a posted or updated message, by action_id."""
    found = {}
    for block in message["blocks"]:
        if block["type"] == "actions":
            found.update({e["action_id"]: e for e in block["elements"]})
    return found


def texts(message: dict) -> str:
    """Every text a person reads in the message."""
    out = []
    for block in message["blocks"]:
        for part in [block.get("text")] + block.get("fields", []):
            if part:
                out.append(part["text"])
    return "\n".join(out)


def block_actions(message: dict, verb: str, slack_user: str, team: str = TEAM) -> dict:
    """Slack's block_actions payload for pressing `verb` on `message` (its documented shape)."""
    button = buttons(message)[verb]
    return {
        "type": "block_actions",
        "team": {"id": team, "domain": "example"},
        "user": {"id": slack_user, "username": slack_user.lower(), "team_id": team},
        "api_app_id": "A0APP00001",
        "token": "legacy-verification-token",
        "container": {"type": "message", "message_ts": "1700000000.000001",
                      "channel_id": CHANNEL, "is_ephemeral": False},
        "trigger_id": "13345224609.738474920.8088930838d88f008e0",
        "channel": {"id": CHANNEL, "name": "support"},
        "message": {"type": "message", "ts": "1700000000.000001", "blocks": message["blocks"]},
        "response_url": "https://hooks.slack.com/actions/T0TEAM0001/1/xyz",
        "actions": [{"action_id": verb, "block_id": "decide", "text": button["text"],
                     "value": button.get("value", ""), "type": "button",
                     "action_ts": "1700000001.000001"}],
    }  # fmt: skip


def view_submission(opened: dict, reason: str, slack_user: str) -> dict:
    view = opened["view"]
    return {
        "type": "view_submission",
        "team": {"id": TEAM, "domain": "example"},
        "user": {"id": slack_user, "username": slack_user.lower(), "team_id": TEAM},
        "api_app_id": "A0APP00001",
        "trigger_id": "13345224609.738474920.8088930838d88f008e1",
        "view": {
            "id": "V0MODAL001",
            "type": "modal",
            "callback_id": view["callback_id"],
            "private_metadata": view["private_metadata"],
            "state": {"values": {"reason": {"reason": {"type": "plain_text_input",
                                                       "value": reason}}}},
        },
    }  # fmt: skip


def signed(payload: dict, *, at: float | None = None, secret: str = SECRET) -> dict:
    """The request as Slack sends it: form-encoded `payload`, its timestamp and signature."""
    body = urlencode({"payload": json.dumps(payload)})
    timestamp = str(int(time.time() if at is None else at))
    digest = hmac.new(secret.encode(), f"v0:{timestamp}:{body}".encode(), hashlib.sha256)
    return {
        "data": body,
        "content_type": "application/x-www-form-urlencoded",
        "HTTP_X_SLACK_REQUEST_TIMESTAMP": timestamp,
        "HTTP_X_SLACK_SIGNATURE": f"v0={digest.hexdigest()}",
    }


def press(request: dict):
    return Client().post(URL, **request)


@pytest.fixture
def posted(fake_slack, people):
    """A refund waiting for approval, its message posted by the sweeper to the Slack channel."""
    slack_channel()
    run = approval_run()
    assert run.status == Run.Status.NEEDS_HUMAN
    notifications.sweep()
    (message,) = fake_slack.of("chat.postMessage")
    return run, message


def test_a_paused_run_posts_what_the_console_shows_with_its_buttons(posted, fake_slack):
    run, message = posted
    (_, _, headers) = fake_slack.calls[0]
    assert headers["Authorization"] == "Bearer xoxb-test-token"
    assert message["channel"] == CHANNEL and "needs a person" in message["text"]
    text = texts(message)
    assert "What will be done if you approve" in text
    assert "Tool: payments.refund" in text and '"payment_id": "pay_1"' in text
    assert "Refund above 100 needs a person" in text and "SLA: " in text
    assert "Why it stopped: " in text and "Amount: " in text
    found = buttons(message)
    assert set(found) == {"approve", "reject", "open"}
    assert found["open"]["url"] == f"https://tp.example.com/console/runs/{run.pk}/"
    assert found["approve"]["style"] == "primary" and found["reject"]["style"] == "danger"
    # Agent data is never Slack markup.
    assert all(
        part["type"] == "plain_text"
        for block in message["blocks"]
        for part in [block.get("text")] + block.get("fields", [])
        if part
    )
    saved = SlackMessage.objects.get()
    assert (saved.slack_channel, saved.ts) == (CHANNEL, "1700000000.000001")
    # A second event about the same request (an SLA breach, a sweep again) posts nothing new.
    notifications.sweep()
    assert len(fake_slack.of("chat.postMessage")) == 1


def test_a_linked_person_approves_through_the_console_path_and_the_message_updates(
    posted, fake_slack, people
):
    run, message = posted
    before = written(run)
    request = signed(block_actions(message, "approve", "UANN"))
    answer = press(request)
    assert answer.status_code == 200
    approval = ApprovalRequest.objects.get(run=run)
    assert approval.status == "decided" and approval.decision == "approved"
    assert approval.decided_by == people["ann"]
    event = TimelineEvent.objects.get(run=run, verb="approval.approved")
    assert event.actor == "user:ann"
    decision = HumanDecision.objects.get(run=run)
    assert decision.user == people["ann"] and decision.verb == "approve"
    assert decision.shown["tool"] == "payments.refund"
    assert Run.objects.get(pk=run.pk).status in Run.RUNNABLE  # handed back to the engine
    assert written(run)[0] == before[0] + 1
    (told,) = fake_slack.of("chat.postEphemeral")
    assert told["user"] == "UANN" and told["channel"] == CHANNEL
    assert told["text"].startswith("Approved.")

    # The decision recorded the message's update; the next delivery pass sends it.
    notifications.sweep()
    (updated,) = fake_slack.of("chat.update")
    assert (updated["channel"], updated["ts"]) == (CHANNEL, "1700000000.000001")
    assert "Approved by ann at " in texts(updated)
    assert set(buttons(updated)) == {"open"}  # no one acts on a stale message

    # Replayed (the same signed request, within its five minutes): already decided, by whom.
    after = written(run)
    assert press(request).status_code == 200
    assert written(run) == after
    replayed = fake_slack.of("chat.postEphemeral")[-1]
    assert replayed["text"].startswith("Already decided: Approved by ann at ")


def test_a_decision_in_the_console_updates_the_message(posted, fake_slack, people):
    run, _message = posted
    approval = ApprovalRequest.objects.get(run=run)
    actions.decide_approval(approval.pk, people["bob"], "rejected", comment="wrong <b>customer")
    notifications.sweep()
    (updated,) = fake_slack.of("chat.update")
    assert "Rejected by bob at " in texts(updated) and "wrong <b>customer" in texts(updated)
    assert set(buttons(updated)) == {"open"}


def test_forged_expired_and_unsigned_requests_are_refused_and_write_nothing(
    posted, fake_slack, people
):
    run, message = posted
    payload = block_actions(message, "approve", "UANN")
    before = written(run)
    forged = signed(payload, secret="not-the-secret")
    assert press(forged).status_code == 401
    expired = signed(payload, at=time.time() - 6 * 60)  # properly signed, six minutes old
    assert press(expired).status_code == 401
    future = signed(payload, at=time.time() + 6 * 60)
    assert press(future).status_code == 401
    unsigned = {k: v for k, v in signed(payload).items() if not k.startswith("HTTP_")}
    assert press(unsigned).status_code == 401
    tampered = signed(payload)
    tampered["data"] = tampered["data"].replace("UANN", "UBOB")  # the body changed after signing
    assert press(tampered).status_code == 401
    assert Client().get(URL).status_code == 405
    # Signed by Slack, but the button's value is not one TaskPilots made.
    value = payload["actions"][0]["value"]
    payload["actions"][0]["value"] = value[:-3] + ("AAA" if value[-3:] != "AAA" else "BBB")
    assert press(signed(payload)).status_code == 200
    assert "not one TaskPilots made" in fake_slack.of("chat.postEphemeral")[-1]["text"]
    # A Reject button's value under Approve is refused too (the verb is signed).
    swapped = block_actions(message, "approve", "UANN")
    swapped["actions"][0]["value"] = buttons(message)["reject"]["value"]
    assert press(signed(swapped)).status_code == 200
    assert written(run) == before
    assert not fake_slack.of("chat.update")


def test_an_unlinked_or_roleless_person_is_refused_and_nothing_is_written(
    posted, fake_slack, people
):
    run, message = posted
    before = written(run)
    assert press(signed(block_actions(message, "approve", "UNOBODY"))).status_code == 200
    told = fake_slack.of("chat.postEphemeral")[-1]
    assert told["user"] == "UNOBODY" and "not linked to a TaskPilots user" in told["text"]
    # Ann's Slack id in another workspace is another person.
    press(signed(block_actions(message, "approve", "UANN", team="T0OTHER001")))
    assert "not linked" in fake_slack.of("chat.postEphemeral")[-1]["text"]
    # An auditor reads, never decides.
    press(signed(block_actions(message, "approve", "UAUDREY")))
    assert "Your role may not act on runs." in fake_slack.of("chat.postEphemeral")[-1]["text"]
    # A deactivated user's link decides nothing.
    people["cat"].is_active = False
    people["cat"].save()
    press(signed(block_actions(message, "approve", "UCAT")))
    assert "not linked" in fake_slack.of("chat.postEphemeral")[-1]["text"]
    assert written(run) == before


def test_reject_asks_for_a_reason_in_a_modal_then_decides_as_the_console(
    posted, fake_slack, people
):
    run, message = posted
    before = written(run)
    assert press(signed(block_actions(message, "reject", "UBOB"))).status_code == 200
    (opened,) = fake_slack.of("views.open")
    assert opened["trigger_id"] == "13345224609.738474920.8088930838d88f008e0"
    assert opened["view"]["type"] == "modal"
    assert written(run) == before  # opening the form decides nothing

    empty = press(signed(view_submission(opened, "  ", "UBOB")))
    assert empty.json() == {
        "response_action": "errors",
        "errors": {"reason": "Say why you reject it."},
    }
    # Submitted by someone not linked: refused in the form.
    stranger = press(signed(view_submission(opened, "no", "UNOBODY")))
    assert "not linked" in stranger.json()["errors"]["reason"]
    assert written(run) == before

    answer = press(signed(view_submission(opened, "wrong customer", "UBOB")))
    assert answer.status_code == 200 and answer.content == b""  # the modal closes
    approval = ApprovalRequest.objects.get(run=run)
    assert approval.decision == "rejected" and approval.decided_by == people["bob"]
    assert approval.comment == "wrong customer"
    assert TimelineEvent.objects.get(run=run, verb="approval.rejected").actor == "user:bob"
    assert Run.objects.get(pk=run.pk).status == Run.Status.CANCELLED
    assert fake_slack.of("chat.postEphemeral")[-1]["text"].startswith("Rejected.")
    notifications.sweep()
    assert "Rejected by bob at " in texts(fake_slack.of("chat.update")[-1])

    # The same form submitted again: already decided, nothing written.
    after = written(run)
    again = press(signed(view_submission(opened, "again", "UBOB")))
    assert "Already decided: Rejected by bob" in again.json()["errors"]["reason"]
    assert written(run) == after


def test_two_person_the_first_approver_in_slack_leaves_it_for_a_second_person(fake_slack, people):
    PAID.clear()
    EscalationRule.objects.create(
        position=1, name="two for high risk", risk="high", action="escalate", queue="support",
        approvers_required=2,
    )  # fmt: skip
    slack_channel()
    run = waiting(amount=40)
    notifications.sweep()
    (message,) = fake_slack.of("chat.postMessage")
    assert "Needs two different people to approve" in texts(message)

    assert press(signed(block_actions(message, "approve", "UANN"))).status_code == 200
    assert "waits for a second approver" in fake_slack.of("chat.postEphemeral")[-1]["text"]
    approval = ApprovalRequest.objects.get(run=run)
    assert approval.status == "pending" and approval.first_approved_by == people["ann"]
    assert engine.run_until_quiet(run.pk).status == Run.Status.NEEDS_HUMAN and PAID == []

    # The message now says who approved first, with fresh buttons for the second person.
    notifications.sweep()
    assert len(fake_slack.of("chat.postMessage")) == 1
    updated = fake_slack.of("chat.update")[-1]
    assert "Approved by ann; a second person, not ann, must approve" in texts(updated)
    assert set(buttons(updated)) == {"approve", "reject", "open"}

    before = written(run)
    # Ann again, on the new message or the old one: refused, nothing written.
    press(signed(block_actions(updated, "approve", "UANN")))
    assert "You approved this call at " in fake_slack.of("chat.postEphemeral")[-1]["text"]
    press(signed(block_actions(message, "approve", "UANN")))
    assert written(run) == before
    # Bob on the old message: it moved on since (the console's conflict sentence).
    press(signed(block_actions(message, "approve", "UBOB")))
    assert "Open the run in the console" in fake_slack.of("chat.postEphemeral")[-1]["text"]
    assert written(run) == before

    press(signed(block_actions(updated, "approve", "UBOB")))
    approval.refresh_from_db()
    assert approval.status == "decided" and approval.decided_by == people["bob"]
    assert engine.run_until_quiet(run.pk).status == Run.Status.SUCCEEDED
    assert PAID == [{"amount": 40}]
    decided = TimelineEvent.objects.get(run=run, verb="approval.approved")
    assert decided.data["first_approved_by"] == "ann" and decided.actor == "user:bob"


def test_a_takeover_or_a_soft_claim_sends_the_person_to_the_console(posted, fake_slack, people):
    run, message = posted
    SoftClaim.claim(run, people["cat"], minutes=5)
    before = written(run)
    press(signed(block_actions(message, "approve", "UANN")))
    told = fake_slack.of("chat.postEphemeral")[-1]["text"]
    # Pressing again in Slack would not act anyway: the answer sends the person to the console.
    assert told.startswith("cat is already handling this run (for 5 more minutes).")
    assert "Press the button again" not in told and "console to act anyway" in told
    assert f"<https://tp.example.com/console/runs/{run.pk}/|" in told
    assert written(run) == before

    # Cat takes the run over: the message loses its Approve and Reject buttons and says who.
    actions.take_over(run.pk, people["cat"])
    notifications.sweep()
    (taken,) = fake_slack.of("chat.update")
    assert set(buttons(taken)) == {"open"}
    assert "cat" in texts(taken)
    # The buttons of the message as it was before: refused, with the console's sentence.
    before = written(run)
    press(signed(block_actions(message, "approve", "UBOB")))
    told = fake_slack.of("chat.postEphemeral")[-1]["text"]
    assert "cat took over" in told
    assert "Open the run in the console" in told
    assert written(run) == before

    # Given back to the inbox: fresh buttons, and Bob's press decides.
    actions.release(run.pk, people["cat"], needed_engineer=False)
    notifications.sweep()
    released = fake_slack.of("chat.update")[-1]
    assert set(buttons(released)) == {"approve", "reject", "open"}
    SoftClaim.objects.filter(run=run).delete()  # Cat's five minutes are over
    press(signed(block_actions(released, "approve", "UBOB")))
    assert ApprovalRequest.objects.get(run=run).decided_by == people["bob"]


def test_slack_being_down_never_blocks_a_decision(posted, fake_slack, people):
    run, message = posted
    fake_slack.down = True
    # Pressed in Slack: the decision stands although the answer cannot be sent.
    assert press(signed(block_actions(message, "approve", "UANN"))).status_code == 200
    assert ApprovalRequest.objects.get(run=run).decided_by == people["ann"]
    notifications.sweep()
    update = NotificationDelivery.objects.get(event="slack_update")
    assert update.status == "pending" and update.attempts == 1
    assert "service_unavailable" in update.last_error
    fake_slack.down = False
    NotificationDelivery.objects.filter(pk=update.pk).update(next_attempt_at=update.created_at)
    notifications.sweep()
    assert NotificationDelivery.objects.get(pk=update.pk).status == "sent"
    assert "Approved by ann at " in texts(fake_slack.of("chat.update")[-1])


def test_the_channel_form_takes_a_slack_channel_id(fake_slack, settings):
    def form(target):
        return ChannelForm({"queue": "support", "kind": "slack", "target": target, "enabled": "on"})

    assert form(CHANNEL).is_valid()
    assert "channel id" in str(form("#support").errors)
    settings.TASKPILOTS = {**settings.TASKPILOTS, "SLACK_BOT_TOKEN": ""}
    assert "TASKPILOTS_SLACK_BOT_TOKEN" in str(form(CHANNEL).errors)


def test_link_slack_user_links_lists_and_unlinks(db):
    UserFactory(username="dan", groups=["support"])
    out = StringIO()
    call_command("link_slack_user", "dan", "--team", TEAM, "--slack-user", "udan1", stdout=out)
    assert SlackIdentity.user_for(TEAM, "UDAN1").username == "dan"
    call_command("link_slack_user", "--list", stdout=out)
    assert f"{TEAM} UDAN1 dan" in out.getvalue()
    call_command("link_slack_user", "--team", TEAM, "--slack-user", "UDAN1", "--unlink", stdout=out)
    assert SlackIdentity.user_for(TEAM, "UDAN1") is None


def test_without_the_slack_extra_a_channel_fails_and_the_endpoint_is_off(
    fake_slack, people, monkeypatch
):
    for name in [n for n in sys.modules if n == "slack_sdk" or n.startswith("slack_sdk.")]:
        monkeypatch.setitem(sys.modules, name, None)
    slack_channel()
    run = approval_run()
    notifications.sweep()
    delivery = NotificationDelivery.objects.get(run=run)
    assert delivery.status == "failed" and "taskpilots[slack]" in delivery.last_error
    before = written(run)
    payload = {"type": "block_actions", "actions": [{"action_id": "approve", "value": "x"}]}
    assert press(signed(payload)).status_code == 404
    assert written(run) == before and not fake_slack.calls


def test_the_interactivity_url_is_the_documented_one():
    assert reverse("slack-interactivity") == URL


def test_answers_and_forms_are_in_the_language_slack_shows_the_person(posted, fake_slack, people):
    run, message = posted
    fake_slack.locales.update({"UBOB": "zh-CN", "UCAT": None})
    # Cat's press, without the users:read scope: the server's language.
    SoftClaim.claim(run, people["ann"], minutes=5)
    press(signed(block_actions(message, "approve", "UCAT")))
    assert "ann is already handling this run" in fake_slack.of("chat.postEphemeral")[-1]["text"]
    # Bob's Slack is in Chinese: the same answer, and the reject form, in Chinese.
    press(signed(block_actions(message, "approve", "UBOB")))
    told = fake_slack.of("chat.postEphemeral")[-1]["text"]
    assert "ann" in told and "如仍要操作，请在控制台中打开该运行。" in told, told
    press(signed(block_actions(message, "reject", "UBOB")))
    assert fake_slack.of("views.open")[-1]["view"]["title"]["text"] == "拒绝"
    # Asked once per person, then remembered.
    press(signed(block_actions(message, "approve", "UBOB")))
    asked = [body["user"] for body in fake_slack.of("users.info")]
    assert sorted(asked) == ["UBOB", "UCAT"]

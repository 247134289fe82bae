"""Deciding an approval from its mail, end to end: a real SMTP server (aiosmtpd) started here
receives what the sweeper sends; the test reads the message, follows its link as the recipient
and confirms. The decision goes through the console's own action; a forged, expired, replayed,
someone else's or anonymous request, and any GET, write nothing."""

from __future__ import annotations

import html
import re
import socket
import time
from email import message_from_bytes, policy
from types import SimpleNamespace
from unittest import mock
from urllib.parse import urlsplit

import pytest
from aiosmtpd.controller import Controller
from django.core import signing
from django.test import Client
from django.urls import reverse

from approvals import mail_decisions, notifications
from approvals.models import (
    ApprovalRequest,
    EscalationRule,
    HumanDecision,
    NotificationChannel,
    SoftClaim,
)
from runs import engine
from runs.models import Run, TimelineEvent
from tests.approvals.console_helpers import approval_run, fast_passwords, visible_text  # noqa: F401
from tests.approvals.test_two_person import PAID, waiting
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


class Inbox:
    """What the SMTP server received: (recipients, parsed message)."""

    def __init__(self):
        self.received = []

    async def handle_DATA(self, server, session, envelope):
        message = message_from_bytes(envelope.original_content, policy=policy.default)
        self.received.append((list(envelope.rcpt_tos), message))
        return "250 Message accepted for delivery"

    def for_address(self, address: str):
        found = [m for rcpt, m in self.received if rcpt == [address]]
        assert len(found) == 1, [r for r, _ in self.received]
        return found[0]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def smtp(settings):
    inbox = Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=_free_port())
    controller.start()
    settings.MAILERS = {
        "default": {
            "BACKEND": "django.core.mail.backends.smtp.EmailBackend",
            "OPTIONS": {"host": "127.0.0.1", "port": controller.port, "use_tls": False,
                        "timeout": 5},
        }
    }  # fmt: skip
    settings.TASKPILOTS = {**settings.TASKPILOTS, "PUBLIC_URL": "https://tp.example.com"}
    yield inbox
    controller.stop()


@pytest.fixture
def people(db):
    return {
        name: UserFactory(username=name, email=f"{name}@example.com", groups=["support"])
        for name in ("ann", "bob", "cat")
    }


def channel(*addresses: str) -> NotificationChannel:
    return NotificationChannel.objects.create(
        queue="support", kind="email", target=", ".join(addresses)
    )


def mailed_links(inbox: Inbox, address: str) -> dict[str, str]:
    """The message to `address`, its plain text and its links as paths the test client opens."""
    message = inbox.for_address(address)
    body = message.get_body(("plain",)).get_content().replace("\r\n", "\n")
    links = {}
    for name, url in re.findall(r"^(Approve|Reject|Open in the console): (\S+)$", body, re.M):
        assert url.startswith("https://tp.example.com/")
        links[name] = urlsplit(url).path
    return {"body": body, **links}


def login(user) -> Client:
    http = Client(enforce_csrf_checks=True)
    http.force_login(user)
    return http


def csrf(http: Client, path: str) -> str:
    page = http.get(path)
    assert page.status_code == 200
    return re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.content.decode())[1]


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


@pytest.fixture
def mailed(smtp, people):
    """A refund waiting for approval, its mail sent by the sweeper to ann, bob and an address
    nobody has."""
    channel("ann@example.com", "bob@example.com", "nobody@example.com")
    run = approval_run()
    assert run.status == Run.Status.NEEDS_HUMAN
    notifications.sweep()
    return run


def test_the_recipient_decides_from_the_mail_through_the_console_path(mailed, smtp, people):
    run = mailed
    assert len(smtp.received) == 3  # one message per address, each with its own links
    mail = mailed_links(smtp, "ann@example.com")
    body = mail["body"]
    assert "needs a person" in smtp.for_address("ann@example.com")["Subject"]
    # What the run page shows under "What will be done if you approve".
    assert "What will be done if you approve" in body
    assert "payments.refund" in body and '"payment_id": "pay_1"' in body
    assert "Refund above 100 needs a person" in body and "SLA:" in body
    assert mail["Open in the console"] == f"/console/runs/{run.pk}/"
    assert mail["Approve"] != mailed_links(smtp, "bob@example.com")["Approve"]

    ann = login(people["ann"])
    before = written(run)
    page = ann.get(mail["Approve"])  # the confirmation page: nothing decided
    assert page.status_code == 200
    text = visible_text(page)
    assert "Approve this call?" in text and "payments.refund" in text and "pay_1" in text
    assert written(run) == before

    token = csrf(ann, mail["Approve"])
    answer = ann.post(mail["Approve"], {"csrfmiddlewaretoken": token, "comment": "by mail"})
    assert answer.status_code == 302
    assert answer["Location"] == reverse("console:run-detail", args=[run.pk])
    approval = ApprovalRequest.objects.get(run=run)
    assert approval.status == "decided" and approval.decision == "approved"
    assert approval.decided_by == people["ann"] and approval.comment == "by mail"
    event = TimelineEvent.objects.get(run=run, verb="approval.approved")
    assert event.actor == "user:ann"
    decision = HumanDecision.objects.get(run=run)
    assert decision.user == people["ann"] and decision.verb == "approve"
    assert decision.shown["tool"] == "payments.refund"
    assert Run.objects.get(pk=run.pk).status in Run.RUNNABLE  # handed back to the engine

    # Replayed: the used link only says what happened, by whom; nothing more is written.
    after = written(run)
    again = ann.get(mail["Approve"])
    assert again.status_code == 200 and "already decided" in visible_text(again)
    assert "ann" in visible_text(again)
    replay = ann.post(mail["Approve"], {"csrfmiddlewaretoken": token})
    assert replay.status_code == 409 and "Open the run in the console" in visible_text(replay)
    # Bob's reject link, decided elsewhere since, is spent too.
    bob = login(people["bob"])
    reject = mailed_links(smtp, "bob@example.com")["Reject"]
    refused = bob.post(reject, {"csrfmiddlewaretoken": csrf(bob, reject), "comment": "no"})
    assert refused.status_code == 409
    assert written(run) == after


def test_reject_from_the_mail_needs_a_reason_and_ends_the_run_as_the_console(mailed, smtp, people):
    run = mailed
    bob = login(people["bob"])
    reject = mailed_links(smtp, "bob@example.com")["Reject"]
    token = csrf(bob, reject)
    before = written(run)
    missing = bob.post(reject, {"csrfmiddlewaretoken": token, "comment": " "})
    assert missing.status_code == 422 and written(run) == before
    answer = bob.post(reject, {"csrfmiddlewaretoken": token, "comment": "wrong customer"})
    assert answer.status_code == 302
    approval = ApprovalRequest.objects.get(run=run)
    assert approval.decision == "rejected" and approval.decided_by == people["bob"]
    assert TimelineEvent.objects.get(run=run, verb="approval.rejected").actor == "user:bob"
    run.refresh_from_db()
    assert run.status == Run.Status.CANCELLED  # nothing done, nothing to undo


def test_a_forged_or_tampered_link_is_refused_and_writes_nothing(mailed, smtp, people):
    run = mailed
    ann = login(people["ann"])
    approve = mailed_links(smtp, "ann@example.com")["Approve"]
    token = approve.rstrip("/").rsplit("/", 1)[1]
    data, _, signature = token.rpartition(":")
    tampered = f"/console/mail/{data}:{signature[:-2]}{'AA' if signature[-2:] != 'AA' else 'BB'}/"
    # Signed with this server's key, but not for mail links (another salt).
    other = {"a": ApprovalRequest.objects.get(run=run).pk, "x": "approve", "e": "ann@example.com"}
    foreign = f"/console/mail/{signing.dumps(other, salt='other')}/"
    before = written(run)
    for path in (tampered, foreign, "/console/mail/not-a-token/"):
        page = ann.get(path)
        assert page.status_code == 400, path
        assert "not one TaskPilots made" in visible_text(page)
        post = ann.post(path, {"csrfmiddlewaretoken": csrf(ann, approve)})
        assert post.status_code == 400
    assert written(run) == before


def test_an_expired_link_is_refused_and_writes_nothing(smtp, people, settings):
    channel("ann@example.com")
    run = approval_run()
    day_ago = time.time() - 25 * 3600
    with mock.patch("django.core.signing.time.time", return_value=day_ago):
        notifications.sweep()  # the mail was written (and its links signed) 25 hours ago
    approve = mailed_links(smtp, "ann@example.com")["Approve"]
    ann = login(people["ann"])
    before = written(run)
    page = ann.get(approve)
    assert page.status_code == 410 and "expired" in visible_text(page)
    assert ann.post(approve, {"csrfmiddlewaretoken": csrf(ann, "/console/")}).status_code == 410
    # The lifetime is a setting: 48 hours makes the same link current.
    settings.TASKPILOTS = {**settings.TASKPILOTS, "MAIL_LINK_HOURS": 48}
    assert ann.get(approve).status_code == 200
    assert written(run) == before


def test_someone_else_signed_in_is_refused_and_writes_nothing(mailed, smtp, people):
    run = mailed
    approve = mailed_links(smtp, "ann@example.com")["Approve"]
    bob = login(people["bob"])
    before = written(run)
    page = bob.get(approve)
    assert page.status_code == 403 and "sent to someone else" in visible_text(page)
    assert bob.post(approve, {"csrfmiddlewaretoken": csrf(bob, "/console/")}).status_code == 403
    # The address nobody had: whoever later has it may use its link, nobody else.
    nobody = mailed_links(smtp, "nobody@example.com")["Approve"]
    assert bob.post(nobody, {"csrfmiddlewaretoken": csrf(bob, "/console/")}).status_code == 403
    # Ann whose address changed since the mail is no longer its recipient.
    people["ann"].email = "ann@elsewhere.example"
    people["ann"].save()
    assert login(people["ann"]).get(approve).status_code == 403
    assert written(run) == before


def test_anonymous_is_sent_to_log_in_and_nothing_is_written(mailed, smtp):
    run = mailed
    approve = mailed_links(smtp, "ann@example.com")["Approve"]
    anonymous = Client()
    before = written(run)
    for answer in (anonymous.get(approve), anonymous.post(approve, {"comment": "x"})):
        assert answer.status_code == 302
        assert answer["Location"].startswith(reverse("login"))
        assert "next=" in answer["Location"]
    assert written(run) == before


def test_without_the_csrf_token_nothing_is_decided(mailed, smtp, people):
    run = mailed
    approve = mailed_links(smtp, "ann@example.com")["Approve"]
    before = written(run)
    assert login(people["ann"]).post(approve, {"comment": "x"}).status_code == 403
    assert written(run) == before


def test_get_never_decides_even_repeated_or_with_a_body(mailed, smtp, people):
    run = mailed
    ann = login(people["ann"])
    before = written(run)
    for verb in ("Approve", "Reject"):
        path = mailed_links(smtp, "ann@example.com")[verb]
        for _ in range(3):
            assert ann.get(path, {"comment": "x", "despite_claim": "1"}).status_code == 200
    # Neither does any other method (CSRF refuses it first, or the view does).
    assert ann.put(mailed_links(smtp, "ann@example.com")["Approve"]).status_code in (403, 405)
    assert written(run) == before


def test_a_run_changed_since_the_mail_makes_its_links_stale(mailed, smtp, people):
    """Handed to another queue after the mail: the console would call the page stale (409)."""
    run = mailed
    from approvals import actions

    actions.move_to_queue(run.pk, people["cat"], queue="ops", comment="", expected_version=None)
    ann = login(people["ann"])
    approve = mailed_links(smtp, "ann@example.com")["Approve"]
    before = written(run)
    page = ann.get(approve)
    assert page.status_code == 200 and "for the run as it was then" in visible_text(page)
    assert ann.post(approve, {"csrfmiddlewaretoken": csrf(ann, "/console/")}).status_code == 409
    assert written(run) == before


def test_a_soft_claim_warns_on_the_page_and_the_decision_acts_anyway(mailed, smtp, people):
    run = mailed
    SoftClaim.claim(run, people["cat"], minutes=5)
    ann = login(people["ann"])
    approve = mailed_links(smtp, "ann@example.com")["Approve"]
    page = ann.get(approve)
    assert "cat is already handling this run" in visible_text(page)
    answer = ann.post(approve, {"csrfmiddlewaretoken": csrf(ann, approve), "despite_claim": "1"})
    assert answer.status_code == 302
    assert ApprovalRequest.objects.get(run=run).decided_by == people["ann"]


def test_two_person_the_first_link_leaves_the_run_for_a_second_person(smtp, people):
    PAID.clear()
    EscalationRule.objects.create(
        position=1, name="two for high risk", risk="high", action="escalate", queue="support",
        approvers_required=2,
    )  # fmt: skip
    channel("ann@example.com", "bob@example.com")
    run = waiting(amount=40)
    notifications.sweep()
    ann = login(people["ann"])
    first = mailed_links(smtp, "ann@example.com")
    assert "Needs two different people to approve" in first["body"]
    answer = ann.post(first["Approve"], {"csrfmiddlewaretoken": csrf(ann, first["Approve"])})
    assert answer.status_code == 302
    run = engine.run_until_quiet(run.pk)
    approval = ApprovalRequest.objects.get(run=run)
    assert run.status == Run.Status.NEEDS_HUMAN and PAID == []
    assert approval.status == "pending" and approval.first_approved_by == people["ann"]
    assert TimelineEvent.objects.filter(run=run, verb="approval.first_approved").count() == 1

    # Ann's link is used: it says so. Bob's first mail is stale (the run moved on), as a page
    # loaded before the first approval is in the console.
    before = written(run)
    used = ann.get(first["Approve"])
    assert "You approved this call" in visible_text(used)
    replayed = ann.post(first["Approve"], {"csrfmiddlewaretoken": csrf(ann, "/console/")})
    assert replayed.status_code == 409
    bob = login(people["bob"])
    stale = mailed_links(smtp, "bob@example.com")["Approve"]
    assert bob.post(stale, {"csrfmiddlewaretoken": csrf(bob, "/console/")}).status_code == 409
    assert written(run) == before

    # The queue hears that a second person is needed; that mail carries fresh links, and Ann's
    # has no Approve (she cannot approve twice) but still Reject.
    smtp.received.clear()
    notifications.sweep()
    assert "Approve" not in mailed_links(smtp, "ann@example.com")
    second = mailed_links(smtp, "bob@example.com")
    assert "Approved by ann" in second["body"]
    answer = bob.post(second["Approve"], {"csrfmiddlewaretoken": csrf(bob, second["Approve"])})
    assert answer.status_code == 302
    run = engine.run_until_quiet(run.pk)
    assert run.status == Run.Status.SUCCEEDED and PAID == [{"amount": 40}]
    decided = TimelineEvent.objects.get(run=run, verb="approval.approved")
    assert decided.actor == "user:bob" and decided.data["first_approved_by"] == "ann"


def test_the_link_reads_back_what_it_was_signed_with():
    link = mail_decisions.MailLink(7, "reject", "a@example.com", None, 3, "abc", "d1")
    assert mail_decisions.read(mail_decisions.sign(link)) == link


def test_agent_data_in_the_mail_is_plain_text_with_invisible_characters_shown(smtp, people):
    channel("ann@example.com")
    run = approval_run(payment="pay_\u202e<b>gpj.exe")
    notifications.sweep()
    body = mailed_links(smtp, "ann@example.com")["body"]
    assert "pay_[U+202E]<b>gpj.exe" in body and "\u202e" not in body
    # The HTML part: the same value escaped, never markup.
    html_part = smtp.for_address("ann@example.com").get_body(("html",)).get_content()
    assert "pay_[U+202E]&lt;b&gt;gpj.exe" in html_part
    assert "<b>gpj" not in html_part and "\u202e" not in html_part
    page = login(people["ann"]).get(mailed_links(smtp, "ann@example.com")["Approve"])
    assert b"<b>gpj" not in page.content and b"&lt;b&gt;gpj" in page.content
    assert ApprovalRequest.objects.get(run=run).status == "pending"


def test_the_confirmation_page_reads_in_chinese(mailed, smtp, people):
    page = login(people["ann"]).get(
        mailed_links(smtp, "ann@example.com")["Approve"], HTTP_ACCEPT_LANGUAGE="zh-Hans"
    )
    text = visible_text(page)
    assert "批准此调用？" in text and "在你按下下面的按钮之前" in text


def test_a_role_that_does_not_act_is_refused_before_the_link_is_read(mailed, smtp, people):
    run = mailed
    auditor = UserFactory(username="ada", email="ann@example.com", groups=["auditor"])
    approve = mailed_links(smtp, "ann@example.com")["Approve"]
    before = written(run)
    assert login(auditor).get(approve).status_code == 403
    assert written(run) == before


def test_the_html_part_says_what_the_text_says_with_the_same_links(mailed, smtp, people):
    message = smtp.for_address("ann@example.com")
    text = mailed_links(smtp, "ann@example.com")
    page = message.get_body(("html",)).get_content()
    hrefs = {
        name: urlsplit(html.unescape(url)).path
        for url, name in re.findall(r'<a href="([^"]+)"[^>]*>([^<]+)</a>', page)
    }
    assert hrefs == {
        "Approve": text["Approve"],
        "Reject": text["Reject"],
        "Open in the console": text["Open in the console"],
    }
    shown = visible_text(SimpleNamespace(content=page.encode()))
    for line in ("What will be done if you approve", "payments.refund", "These links are for"):
        assert line in shown and line in text["body"]
    # The address nobody has gets both links too; one link per person, never another's.
    other = smtp.for_address("bob@example.com").get_body(("html",)).get_content()
    assert text["Approve"] not in other

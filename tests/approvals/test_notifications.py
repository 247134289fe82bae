"""Notifications: recorded once per event and channel in the transaction of the change, sent after
commit, retried with backoff from the database, and never in the way of a run."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.utils import timezone

from approvals import notifications
from approvals.models import EscalationRule, NotificationChannel, NotificationDelivery
from runs import engine
from runs.models import TimelineEvent
from tests.approvals.console_helpers import approval_run, fast_passwords, fresh  # noqa: F401

pytestmark = pytest.mark.django_db

CHANNELS = "/console/rules/channels/"


class Hook:
    """A tiny webhook receiver on 127.0.0.1 that records what it is sent."""

    def __init__(self):
        self.received: list[dict] = []
        self.status = 200
        self.location = ""
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                hook.received.append(json.loads(body))
                self.send_response(hook.status)
                if hook.location:
                    self.send_header("Location", hook.location)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hook(settings):
    # The receiver listens on 127.0.0.1, which webhooks may reach only when it is named.
    settings.TASKPILOTS = {**settings.TASKPILOTS, "NOTIFY_ALLOWED_HOSTS": ["127.0.0.1"]}
    receiver = Hook()
    yield receiver
    receiver.close()


@pytest.fixture
def support_channels(hook):
    email = NotificationChannel.objects.create(
        queue="support", kind="email", target="desk@example.com, lead@example.com"
    )
    webhook = NotificationChannel.objects.create(queue="support", kind="webhook", target=hook.url)
    return email, webhook


def later(**delta):
    return timezone.now() + timedelta(**delta)


def test_a_run_entering_a_queue_notifies_each_channel_once(support_channels, hook, mailoutbox):
    run = approval_run()
    # Recorded from the run.needs_human timeline event, keyed by its seq.
    assert notifications.scan_timeline() == 2
    deliveries = NotificationDelivery.objects.filter(run=run)
    seq = TimelineEvent.objects.get(run=run, verb="run.needs_human").seq
    assert deliveries.filter(key__endswith=f":{seq}", key__contains=":queued:").count() == 2
    assert {(d.event, d.status) for d in deliveries} == {("queued", "pending")}
    assert deliveries.count() == 2
    # The sweeper sends what is due; a second (retried) sweep sends nothing again.
    engine.sweep()
    engine.sweep(now=later(minutes=10))
    # The run waits on an approval: one message per address, each with that person's links
    # (tests/approvals/test_mail_decisions.py follows them).
    assert sorted(m.to for m in mailoutbox) == [["desk@example.com"], ["lead@example.com"]]
    for message in mailoutbox:
        assert "needs a person" in message.subject
        assert f"/console/runs/{run.pk}/" in message.body
        assert "Approve: " in message.body and "Reject: " in message.body
    assert len(hook.received) == 1
    payload = hook.received[0]
    assert payload["text"].startswith("[support]") and payload["event"] == "queued"
    assert payload["run"]["id"] == str(run.pk) and payload["run"]["queue"] == "support"
    assert payload["url"].endswith(f"/console/runs/{run.pk}/")
    assert set(deliveries.values_list("status", flat=True)) == {"sent"}


def test_recording_the_same_event_twice_keeps_one_delivery(support_channels):
    run = approval_run()
    notifications.scan_timeline()
    assert notifications.scan_timeline() == 0  # the overlap re-reads it: nothing new
    event = TimelineEvent.objects.get(run=run, verb="run.needs_human")
    assert notifications.record(run.pk, "queued", "support", event.seq) == []
    assert NotificationDelivery.objects.filter(run=run).count() == 2


def test_a_failing_webhook_does_not_block_the_run_and_is_retried(hook, mailoutbox):
    NotificationChannel.objects.create(queue="support", kind="webhook", target=hook.url)
    hook.status = 500
    run = approval_run()
    assert fresh(run).status == "needs_human"
    notifications.scan_timeline()
    delivery = NotificationDelivery.objects.get(run=run)
    assert notifications.deliver(delivery.pk) == "retry"
    delivery.refresh_from_db()
    assert delivery.status == "pending" and delivery.attempts == 1
    assert "500" in delivery.last_error and delivery.next_attempt_at > timezone.now()
    # Not due yet: the sweeper leaves it; once due it is sent again and succeeds.
    engine.sweep()
    assert len(hook.received) == 1
    hook.status = 200
    engine.sweep(now=later(minutes=5))
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, len(hook.received)) == ("sent", 2, 2)


def test_a_channel_that_keeps_failing_is_given_up_on(hook):
    NotificationChannel.objects.create(queue="support", kind="webhook", target=hook.url)
    hook.status = 503
    run = approval_run()
    notifications.scan_timeline()
    delivery = NotificationDelivery.objects.get(run=run)
    for attempt in range(notifications.MAX_ATTEMPTS):
        notifications.deliver(delivery.pk, now=later(hours=2 * attempt))
    delivery.refresh_from_db()
    assert delivery.status == "failed" and delivery.attempts == notifications.MAX_ATTEMPTS


def test_a_redirect_is_not_followed(hook):
    NotificationChannel.objects.create(queue="support", kind="webhook", target=hook.url)
    hook.status, hook.location = 302, "http://169.254.169.254/latest/meta-data/"
    run = approval_run()
    notifications.scan_timeline()
    delivery = NotificationDelivery.objects.get(run=run)
    assert notifications.deliver(delivery.pk) == "failed"
    delivery.refresh_from_db()
    assert "not followed" in delivery.last_error


def test_a_claimed_delivery_is_not_sent_by_a_second_sender(support_channels, hook, mailoutbox):
    run = approval_run()
    notifications.scan_timeline()
    delivery = NotificationDelivery.objects.filter(run=run, channel__kind="webhook").get()
    now = timezone.now()
    assert notifications.deliver(delivery.pk, now=now) == "sent"
    assert notifications.deliver(delivery.pk, now=now) == "skipped"
    assert len(hook.received) == 1


def test_after_commit_a_task_is_hinted_per_delivery(
    support_channels, settings, django_capture_on_commit_callbacks, monkeypatch
):
    from taskpilots.celery import app

    sent = []

    def send_task(name, args, **kw):
        assert name == "approvals.tasks.deliver_notification"
        sent.append(args[0])

    monkeypatch.setattr(app, "send_task", send_task)
    settings.TASKPILOTS = {**settings.TASKPILOTS, "DISPATCH": "celery"}
    run = approval_run()
    with django_capture_on_commit_callbacks(execute=True):
        notifications.scan_timeline()
    ids = set(NotificationDelivery.objects.filter(run=run).values_list("pk", flat=True))
    assert set(sent) == ids and len(ids) == 2


def test_an_sla_breach_notifies_both_queues_once(support_channels, hook, mailoutbox):
    rule = EscalationRule.objects.get(name="Timed-out wait: a person decides")
    rule.escalate_to = "supervisors"
    rule.save()
    NotificationChannel.objects.create(queue="supervisors", kind="email", target="boss@example.com")
    run = approval_run()
    engine.sweep()  # the "queued" notifications
    mailoutbox.clear()
    hook.received.clear()
    now = later(hours=5)
    engine.sweep(now=now)
    engine.sweep(now=now)  # a retried sweep
    engine.sweep(now=later(hours=6))
    events = sorted(NotificationDelivery.objects.filter(run=run).values_list("event", flat=True))
    assert events == ["escalated", "queued", "queued", "sla_breached", "sla_breached"]
    # An email channel writes to each of its addresses (the run waits on an approval).
    assert sorted(m.to[0] for m in mailoutbox) == [
        "boss@example.com",
        "desk@example.com",
        "lead@example.com",
    ]
    assert [p["event"] for p in hook.received] == ["sla_breached"]
    assert "SLA breached" in hook.received[0]["text"]


# -- the channels page --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"queue": "ops", "kind": "webhook", "target": "ftp://example.com/x"}, "http://"),
        ({"queue": "ops", "kind": "webhook", "target": "https://u:p@example.com/"}, "password"),
        ({"queue": "ops", "kind": "email", "target": "ops@example.com, not-an-address"},
         "not-an-address"),
        ({"queue": "", "kind": "email", "target": "ops@example.com"}, "required"),
    ],
)  # fmt: skip
def test_bad_channels_are_refused(client, admin_user, data, message):
    client.force_login(admin_user)
    response = client.post(CHANNELS, {**data, "enabled": "on"})
    assert response.status_code == 422
    assert message in response.content.decode()
    assert not NotificationChannel.objects.exists()


def test_an_admin_adds_and_disables_a_channel(client, admin_user):
    client.force_login(admin_user)
    response = client.post(CHANNELS, {"queue": "ops", "kind": "webhook",
                                      "target": "https://chat.example.com/hooks/abc",
                                      "enabled": "on"})  # fmt: skip
    assert response.status_code == 302
    channel = NotificationChannel.objects.get()
    assert channel.created_by == admin_user
    toggle = f"/console/rules/channels/{channel.pk}/toggle/"
    assert client.post(toggle, {"enabled": "0"}).status_code == 302
    channel.refresh_from_db()
    assert not channel.enabled
    assert client.get(toggle).status_code == 405
    assert client.post("/console/rules/channels/99999/toggle/").status_code == 404


def test_only_admins_configure_channels(client, support_user):
    client.force_login(support_user)
    response = client.post(CHANNELS, {"queue": "ops", "kind": "email", "target": "a@example.com"})
    assert response.status_code == 403
    assert not NotificationChannel.objects.exists()


def test_the_notification_scan_index_covers_every_notifying_verb():
    """The sweeper's scan filters the timeline by NOTIFYING_VERBS: a verb missing from the
    partial index's condition would turn it into a scan of the whole timeline."""
    from approvals.notifications import NOTIFYING_VERBS
    from runs.models import TimelineEvent

    index = next(i for i in TimelineEvent._meta.indexes if i.name == "timeline_notify_idx")
    ((lookup, verbs),) = index.condition.children
    assert lookup == "verb__in"
    assert sorted(verbs) == sorted(str(v) for v in NOTIFYING_VERBS)

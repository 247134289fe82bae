"""Notifications to a queue's channels (email, an outgoing JSON webhook, Slack) when a run
lands in the queue, when its SLA is breached and when an escalation moves it.

Exactly once per event and channel, and never in the way of a run:
1. The intent is the timeline event the state change writes in its own transaction
   (`run.needs_human` from Run.ask_human, `run.sla_breached` from approvals/sla.py). From it a
   `NotificationDelivery` is recorded, keyed `{run}:{event}:{channel}:{timeline seq}` (unique),
   so recording it again finds the same row. SLA breaches record it in the breach's own
   transaction; queue entries are picked up by the sweeper, which reads the timeline from a
   cursor (index timeline_verb_idx) with an overlap, so a transaction that commits a little
   after a later one is still seen. Nothing in the run's path waits for a channel.
2. A Celery task (approvals/tasks.py) claims each row with a conditional update and sends it;
   the sweeper hints undelivered rows again. A failure is recorded and retried later with
   backoff (the schedule lives in PostgreSQL, not as broker ETAs); after MAX_ATTEMPTS the row is
   `failed`. A sender that dies mid-send leaves a claim that expires: that one message may go
   out twice (at least once); the row is never lost.

A Slack channel's message about an approval is kept true the same way: each `approval.*` event
that decides, first-approves, expires or cancels a request, and every takeover or release of
the run, records one delivery (`slack_update`) per message posted about it, which brings the
message up to date (approvals/slack.py).

Webhooks go to public addresses only (no server-side request forgery through a channel): a URL
whose host is, or resolves to, a loopback, private, link-local, multicast, reserved or
unspecified address (IPv4 or IPv6, IPv4-mapped and other embedded IPv4 included, and IPv4
written in decimal, octal or hex) is refused when the channel is saved and again at every send,
where the host is resolved once, every address checked, and the request sent to the checked
address (the Host header and TLS name stay the URL's): a DNS answer that changed since the
channel was saved cannot redirect a send. Hosts named in TASKPILOTS_NOTIFY_ALLOWED_HOSTS
(settings.TASKPILOTS["NOTIFY_ALLOWED_HOSTS"]) are exempt: an internal chat server, a test's.
"""

from __future__ import annotations

import contextlib
import difflib
import ipaddress
import json
import logging
import re
import socket
from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import httpx2
from celery import current_app
from django import forms
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.mail import mailers, send_mail
from django.core.validators import validate_email
from django.db import transaction
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from approvals import mail_decisions, slack
from approvals.forms import validate_identifier
from approvals.models import (
    ApprovalRequest,
    NotificationChannel,
    NotificationCursor,
    NotificationDelivery,
    SlackMessage,
    routed_queues,
)
from runs.models import Run, TimelineEvent
from runs.verbs import Verb
from taskpilots.httpclient import SharedClient

logger = logging.getLogger("taskpilots.notifications")

MAX_ATTEMPTS = 6
CLAIM_SECONDS = 60
WEBHOOK_TIMEOUT_SECONDS = 5.0
WEBHOOK_MAX_RESPONSE_BYTES = 64 * 1024
# The timeline is re-read this far behind the cursor: an event appended before a later one but
# committed after it (a transaction this long) is still found. Recording is idempotent by key.
SCAN_OVERLAP = timedelta(seconds=120)
# Where the cursor starts on a fresh database: recent queue entries only, not all history.
SCAN_START = timedelta(minutes=10)

QUEUED, SLA_BREACHED, ESCALATED = "queued", "sla_breached", "escalated"
# The consistency check found a committed effect missing or different externally: an alert to
# the queue TASKPILOTS["CONSISTENCY_ALERT_QUEUE"] names.
EXTERNAL_MISMATCH = "external_mismatch"
# TaskPilots paused a tool whose API drifted (`tool.paused`): to the queue of the rule that
# routed the drift (by default the admins'), who fix the adapter and resume the tool.
TOOL_PAUSED = "tool_paused"
# One person gave the first of two approvals (`approval.first_approved`): the approval's queue
# hears that a second, different person is needed.
SECOND_APPROVER = "second_approver"
# A request decided, first-approved, expired or cancelled: its Slack messages are updated.
SLACK_UPDATE_VERBS = (
    Verb.APPROVAL_FIRST_APPROVED,
    Verb.APPROVAL_APPROVED,
    Verb.APPROVAL_APPROVED_WITH_EDITS,
    Verb.APPROVAL_REJECTED,
    Verb.APPROVAL_EXPIRED,
    Verb.APPROVAL_CANCELLED,
)
# A run taken over by a person, or given back: the Slack messages about its open request lose
# (or get back) their Approve and Reject buttons, so no one presses a button that would refuse.
SLACK_OWNER_VERBS = (Verb.RUN_TAKEN_OVER, Verb.RUN_RELEASED)
NOTIFYING_VERBS = (
    Verb.RUN_NEEDS_HUMAN,
    Verb.RUN_SLA_BREACHED,
    Verb.SIDE_EFFECT_EXTERNAL_MISMATCH,
    Verb.TOOL_PAUSED,
    Verb.RUN_REQUEUED,
    *SLACK_UPDATE_VERBS,
    *SLACK_OWNER_VERBS,
)


class DeliveryError(Exception):
    pass


# --------------------------------------------------------------------------------------------
# Recording


def _enabled_channels() -> dict[str, list[NotificationChannel]]:
    by_queue: dict[str, list[NotificationChannel]] = defaultdict(list)
    for channel in NotificationChannel.objects.filter(enabled=True):
        by_queue[channel.queue].append(channel)
    return by_queue


def record_event(run_id, verb: str, seq: int, data: dict, channels=None) -> list[int]:
    """Record the deliveries a timeline event calls for; returns the ids of new rows."""
    channels = _enabled_channels() if channels is None else channels
    data = data or {}
    if verb in SLACK_UPDATE_VERBS:
        ids = record_slack_updates(run_id, data.get("approval"), seq, channels)
        if verb != Verb.APPROVAL_FIRST_APPROVED:
            return ids
        return ids + record(
            run_id, SECOND_APPROVER, data.get("queue", ""), seq, extra=data, channels=channels
        )
    if verb in SLACK_OWNER_VERBS:
        pending = ApprovalRequest.objects.filter(
            run_id=run_id, status=ApprovalRequest.Status.PENDING
        ).values_list("pk", flat=True)
        return [
            pk
            for approval_id in pending
            for pk in record_slack_updates(run_id, approval_id, seq, channels)
        ]
    if verb == Verb.RUN_NEEDS_HUMAN:
        return record(run_id, QUEUED, data.get("queue", ""), seq, channels=channels)
    if verb == Verb.RUN_SLA_BREACHED:
        ids = record(
            run_id, SLA_BREACHED, data.get("from_queue", ""), seq, extra=data, channels=channels
        )
        if data.get("to_queue") and data.get("to_queue") != data.get("from_queue"):
            ids += record(run_id, ESCALATED, data["to_queue"], seq, extra=data, channels=channels)
        return ids
    if verb == Verb.RUN_REQUEUED:  # handed to another queue: that queue hears of it
        return record(
            run_id, ESCALATED, data.get("to_queue", ""), seq, extra=data, channels=channels
        )
    if verb == Verb.SIDE_EFFECT_EXTERNAL_MISMATCH:
        queue = settings.TASKPILOTS["CONSISTENCY_ALERT_QUEUE"]
        return record(run_id, EXTERNAL_MISMATCH, queue, seq, extra=data, channels=channels)
    if verb == Verb.TOOL_PAUSED:
        return record(
            run_id, TOOL_PAUSED, data.get("queue", ""), seq, extra=data, channels=channels
        )
    return []


def record(
    run_id, event: str, queue: str, seq: int, *, extra: dict | None = None, channels=None
) -> list[int]:
    """One delivery per enabled channel of the queue (keyed; a second call adds nothing)."""
    channels = _enabled_channels() if channels is None else channels
    targets = channels.get(queue, []) if queue else []
    if not targets:
        return []
    payload = build_payload(run_id, event, queue, extra or {})
    created_ids = []
    for channel in targets:
        delivery, created = NotificationDelivery.objects.get_or_create(
            key=f"{run_id}:{event}:{channel.pk}:{seq}",
            defaults={"channel": channel, "run_id": run_id, "event": event, "payload": payload},
        )
        if created:
            created_ids.append(delivery.pk)
    if created_ids and settings.TASKPILOTS["DISPATCH"] == "celery":
        transaction.on_commit(lambda: _hint(created_ids))
    return created_ids


def record_slack_updates(run_id, approval_id, seq: int, channels=None) -> list[int]:
    """One `slack_update` delivery per Slack message about the approval (keyed like the
    others: a second call adds nothing); none while no Slack channel is enabled."""
    channels = _enabled_channels() if channels is None else channels
    enabled = {c.pk for queue in channels.values() for c in queue if c.kind == c.Kind.SLACK}
    if not approval_id or not enabled:
        return []
    created_ids = []
    messages = SlackMessage.objects.filter(approval_id=approval_id, channel_id__in=enabled)
    for channel_id in messages.values_list("channel_id", flat=True):
        payload = {
            "text": f"The Slack message about approval {approval_id} is brought up to date.",
            "event": slack.UPDATE,
            "approval": approval_id,
            "run": {"id": str(run_id)},
            "url": console_url(run_id),
        }
        delivery, created = NotificationDelivery.objects.get_or_create(
            key=f"{run_id}:{slack.UPDATE}:{channel_id}:{seq}",
            defaults={
                "channel_id": channel_id,
                "run_id": run_id,
                "event": slack.UPDATE,
                "payload": payload,
            },
        )
        if created:
            created_ids.append(delivery.pk)
    if created_ids and settings.TASKPILOTS["DISPATCH"] == "celery":
        transaction.on_commit(lambda: _hint(created_ids))
    return created_ids


def record_run_events(run_id, after_seq: int) -> list[int]:
    """Record now, rather than at the sweeper's next pass, the deliveries the run's events
    after `after_seq` call for (the same keys: the sweeper then finds them recorded)."""
    events = TimelineEvent.objects.filter(
        run_id=run_id, seq__gt=after_seq, verb__in=NOTIFYING_VERBS
    ).order_by("seq")
    channels = _enabled_channels()
    ids: list[int] = []
    for event in events.values("verb", "seq", "data"):
        ids += record_event(run_id, event["verb"], event["seq"], event["data"], channels)
    return ids


def scan_timeline(batch: int = 500) -> int:
    """The sweeper's part: record deliveries for notifying timeline events since the cursor.

    One sweeper at a time moves the cursor (the row is locked, others skip); the overlap means
    recent events are looked at more than once, which the delivery key makes harmless. Times
    are the events' own wall-clock times, never the sweep's (possibly simulated) `now`.
    """
    now = timezone.now()
    with transaction.atomic():
        cursor = (
            NotificationCursor.objects.select_for_update(skip_locked=True)
            .filter(name="timeline")
            .first()
        )
        if cursor is None:
            if NotificationCursor.objects.filter(name="timeline").exists():
                return 0  # another sweeper holds it
            cursor, _created = NotificationCursor.objects.get_or_create(
                name="timeline", defaults={"position_at": now - SCAN_START}
            )
        channels = _enabled_channels()
        if not channels:  # nobody to notify: skip the read, keep the cursor current
            NotificationCursor.objects.filter(pk=cursor.pk).update(position_at=now)
            return 0
        events = list(
            TimelineEvent.objects.filter(
                verb__in=NOTIFYING_VERBS, at__gt=cursor.position_at - SCAN_OVERLAP
            )
            .order_by("at", "id")
            .values("run_id", "verb", "seq", "data", "at")[:batch]
        )
        recorded = 0
        for event in events:
            recorded += len(
                record_event(event["run_id"], event["verb"], event["seq"], event["data"], channels)
            )
        if events and events[-1]["at"] > cursor.position_at:
            NotificationCursor.objects.filter(pk=cursor.pk).update(position_at=events[-1]["at"])
    return recorded


def console_url(run_id) -> str:
    return mail_decisions.public_url(reverse("console:run-detail", args=[run_id]))


def build_payload(run_id, event: str, queue: str, extra: dict) -> dict[str, Any]:
    """Shaped for chat tools' incoming webhooks: `text` is what they show; the rest is data."""
    run = (
        Run.objects.filter(pk=run_id)
        .values(
            "id",
            "workflow",
            "workflow_version",
            "status",
            "stage",
            "queue",
            "attention_reason",
            "attention_due_at",
            "escalation_level",
            "business_key",
        )
        .get()
    )
    name = f"{run['workflow']} run {str(run['id'])[:8]}"
    reason = (run["attention_reason"] or "")[:300]
    rule = (extra.get("rule") or {}).get("rule", "")
    if event == QUEUED:
        text = f"[{queue}] {name} needs a person: {reason}"
    elif event == SLA_BREACHED:
        text = (
            f"[{queue}] SLA breached: {name} was due {extra.get('due_at', '')}"
            f" (rule “{rule}”): {extra.get('outcome', '')}"
        )
    elif event == EXTERNAL_MISMATCH:
        kind = "missing" if extra.get("kind") == "missing" else "different"
        text = (
            f"[{queue}] {extra.get('tool', '')} shows key {str(extra.get('key', ''))[:255]} "
            f"{kind} from what the ledger of {name} recorded as committed."
        )
    elif event == SECOND_APPROVER:
        text = (
            f"[{queue}] {name}: {extra.get('by', '')} approved the {extra.get('step', '')} "
            f"call; a second person, not {extra.get('by', '')}, must approve it before it is made."
        )
    elif event == TOOL_PAUSED:
        text = (
            f"[{queue}] TaskPilots paused {extra.get('tool', '')}: {extra.get('reason', '')}"
            f" (found by {name}). Steps that call it wait until an admin resumes it."
        )
    else:
        text = (
            f"[{queue}] Escalated here from {extra.get('from_queue', '')} (level "
            f"{run['escalation_level']}): {name} missed its SLA. {reason}"
        )
    return {
        "text": text,
        "event": event,
        "queue": queue,
        "run": {
            "id": str(run["id"]),
            "workflow": run["workflow"],
            "version": run["workflow_version"],
            "status": run["status"],
            "stage": run["stage"],
            "queue": run["queue"],
            "reason": reason,
            "due_at": run["attention_due_at"].isoformat() if run["attention_due_at"] else None,
            "escalation_level": run["escalation_level"],
            "business_key": run["business_key"],
        },
        "url": console_url(run_id),
    }


# --------------------------------------------------------------------------------------------
# Sending (outside any transaction)


def _backoff(attempts: int) -> timedelta:
    return timedelta(seconds=min(30 * 2 ** max(attempts - 1, 0), 3600))


def deliver(delivery_id: int, now: datetime | None = None) -> str:
    """Send one delivery if it is due and nobody else holds it. Returns "sent", "retry",
    "failed" or "skipped" (not due, already sent, or claimed by another sender)."""
    now = now or timezone.now()
    delivery = NotificationDelivery.claim(delivery_id, now, hold=timedelta(seconds=CLAIM_SECONDS))
    if delivery is None:
        return "skipped"
    try:
        if not delivery.channel.enabled:
            raise DeliveryError("the channel was disabled")
        send(delivery.channel, delivery.payload)
    except Exception as exc:  # any failure of a channel is recorded, never raised into a run
        error = f"{type(exc).__name__}: {exc}"
        give_up = delivery.attempts >= MAX_ATTEMPTS or isinstance(exc, DeliveryError)
        delivery.mark_failed(error, give_up=give_up, retry_at=now + _backoff(delivery.attempts))
        logger.warning(
            "notification %s failed (attempt %s): %s", delivery.key, delivery.attempts, error
        )
        return "failed" if give_up else "retry"
    delivery.mark_sent()
    return "sent"


def send(channel: NotificationChannel, payload: dict) -> None:
    if channel.kind == NotificationChannel.Kind.EMAIL:
        recipients = split_addresses(channel.target)
        # A run waiting on an approval: one message per address, with what will be done and
        # that person's Approve / Reject / Open links (approvals/mail_decisions.py).
        run_id = (payload.get("run") or {}).get("id")
        personal = mail_decisions.approval_messages(run_id, payload, recipients) if run_id else None
        if personal:
            mailers.default.send_messages(personal)
            return
        subject = payload["text"].splitlines()[0][:150]
        body = f"{payload['text']}\n\n{payload['url']}\n"
        send_mail(subject, body, None, recipients, fail_silently=False)
    elif channel.kind == NotificationChannel.Kind.SLACK:
        try:
            slack.send(channel, payload)
        except slack.NotConfigured as exc:
            raise DeliveryError(str(exc)) from None
    else:
        post_json(channel.target, payload)


# Webhooks honour the environment's proxy settings (HTTPS_PROXY, NO_PROXY) and follow no redirect.
_webhook_client = SharedClient()


def post_json(url: str, payload: dict, *, timeout: float = WEBHOOK_TIMEOUT_SECONDS) -> int:
    validate_webhook_url(url)
    target, headers, extensions = _pinned(url)
    body = json.dumps(payload, ensure_ascii=False).encode()
    headers.update({"Content-Type": "application/json", "User-Agent": "TaskPilots-notify/1"})
    with _webhook_client().stream(
        "POST", target, content=body, headers=headers, timeout=timeout, extensions=extensions
    ) as response:
        if response.is_redirect:
            # A redirect could point anywhere (another host, an internal address): never follow.
            location = response.headers.get("location", "")
            raise DeliveryError(
                f"the webhook answered {response.status_code} redirecting to {location}; "
                "not followed"
            )
        if not response.is_success:
            raise RuntimeError(f"the webhook answered {response.status_code}")
        _read_at_most(response, WEBHOOK_MAX_RESPONSE_BYTES)
        return response.status_code


def _read_at_most(response: httpx2.Response, limit: int) -> None:
    # The answer is not used; reading (a bounded part of) it lets the receiver finish writing.
    received = 0
    for chunk in response.iter_raw():
        received += len(chunk)
        if received >= limit:
            return


def sweep(now: datetime | None = None, batch: int = 500) -> int:
    """The sweeper's step: record what the timeline asks for, then send what is due."""
    scan_timeline(batch)
    # Rows recorded just now are due now, even when the sweep's clock was read before them.
    now = max(now or timezone.now(), timezone.now())
    return dispatch_due(now, batch)


def dispatch_due(now: datetime | None = None, batch: int = 500) -> int:
    """Hint every due, undelivered row again (or send it right here when there is no Celery
    dispatch, as in tests and `make shell`)."""
    now = now or timezone.now()
    ids = list(
        NotificationDelivery.objects.filter(
            status=NotificationDelivery.Status.PENDING, next_attempt_at__lte=now
        )
        .order_by("next_attempt_at")
        .values_list("pk", flat=True)[:batch]
    )
    if settings.TASKPILOTS["DISPATCH"] == "celery":
        _hint(ids)
    else:
        for delivery_id in ids:
            deliver(delivery_id, now=now)
    return len(ids)


DELIVER_TASK = "approvals.tasks.deliver_notification"


def _hint(ids: list[int]) -> None:
    for delivery_id in ids:
        try:
            # By name: approvals.tasks imports this module, not the other way round.
            current_app.send_task(DELIVER_TASK, (delivery_id,), expires=CLAIM_SECONDS)
        except Exception:  # the broker being down only delays it: the sweeper hints again
            logger.warning("could not enqueue notification %s", delivery_id)


# --------------------------------------------------------------------------------------------
# Channel configuration


def split_addresses(text: str) -> list[str]:
    return [a.strip() for a in text.replace(";", ",").split(",") if a.strip()]


def validate_webhook_url(url: str) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise DeliveryError(_("A webhook URL must be http:// or https:// with a host."))
    if parts.username or parts.password:
        raise DeliveryError(_("Put no user name or password in the webhook URL."))
    try:
        _port = parts.port  # raises for a port out of range
    except ValueError:
        raise DeliveryError(_("The webhook URL's port is not a valid port number.")) from None


# -- where a webhook may go

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def allowed_hosts() -> frozenset[str]:
    """Hosts exempt from the public-address rule (TASKPILOTS_NOTIFY_ALLOWED_HOSTS)."""
    names = settings.TASKPILOTS.get("NOTIFY_ALLOWED_HOSTS") or ()
    return frozenset(_host_key(name) for name in names if name.strip())


def _host_key(host: str) -> str:
    return host.strip().strip("[]").rstrip(".").lower()


def address_kind(address: IpAddress) -> str:
    """Why `address` may not receive a webhook ("loopback", "private", …), or "" (public).
    An IPv6 address carrying an IPv4 one (IPv4-mapped, 6to4, Teredo, NAT64) is judged by it too:
    ::ffff:127.0.0.1 is the loopback."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = [address.ipv4_mapped, address.sixtofour]
        if address.teredo:
            embedded.append(address.teredo[1])
        if address in _NAT64:
            embedded.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
        for inner in embedded:
            if inner is not None and address_kind(inner):
                return address_kind(inner)
    for kind in ("loopback", "unspecified", "link_local", "multicast", "private", "reserved"):
        if getattr(address, f"is_{kind}"):
            return kind.replace("_", "-")
    if not address.is_global:  # shared (100.64.0.0/10), documentation, benchmarking…
        return "non-public"
    return ""


def resolve(host: str, port: int) -> list[IpAddress]:
    """Every address `host` stands for, as the system resolver answers (which also reads IPv4
    written as 2130706433, 0x7f.1 or 0177.0.0.1). socket.gaierror when it does not resolve."""
    found: list[IpAddress] = []
    for *_rest, sockaddr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        address = ipaddress.ip_address(str(sockaddr[0]).split("%")[0])
        if address not in found:
            found.append(address)
    return found


def public_addresses(url: str) -> list[IpAddress] | None:
    """The addresses a webhook to `url` may be sent to: all of them public, or DeliveryError.
    None when the host is allowed by name (TASKPILOTS_NOTIFY_ALLOWED_HOSTS) and is used as it
    is. socket.gaierror when the host does not resolve."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if _host_key(host) in allowed_hosts():
        return None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    addresses = resolve(host, port)
    for address in addresses:
        kind = address_kind(address)
        if kind:
            raise DeliveryError(
                _(
                    "The webhook's host %(host)s is %(address)s, a %(kind)s address: webhooks "
                    "go to public addresses only (TASKPILOTS_NOTIFY_ALLOWED_HOSTS names "
                    "exceptions)."
                )
                % {"host": host, "address": address, "kind": kind}
            )
    return addresses


def _pinned(url: str) -> tuple[str, dict, dict]:
    """The URL to connect to, the headers and the request extensions for a send to `url`:
    resolved here, once, checked, and the connection made to the checked address (so a DNS
    answer that changes between the check and the connection changes nothing). The Host
    header and the TLS server name are the URL's own host."""
    try:
        addresses = public_addresses(url)
    except socket.gaierror as exc:
        host = urlsplit(url).hostname
        raise RuntimeError(f"the webhook's host {host} does not resolve: {exc}") from None
    if addresses is None:
        return url, {}, {}
    if not addresses:  # pragma: no cover (getaddrinfo answers with at least one or fails)
        raise RuntimeError("the webhook's host has no address")
    original = httpx2.URL(url)
    target = original.copy_with(host=str(addresses[0]))
    headers = {"Host": original.netloc.decode("ascii")}
    extensions = {"sni_hostname": original.host} if original.scheme == "https" else {}
    return str(target), headers, extensions


def check_webhook_target(url: str) -> None:
    """For saving a channel: the URL's form, and its host not (resolving to) a private or local
    address. A host that does not resolve yet is accepted; every send checks again."""
    validate_webhook_url(url)
    with contextlib.suppress(socket.gaierror, UnicodeError):
        public_addresses(url)


SLACK_CHANNEL_ID = re.compile(r"[CG][A-Z0-9]{6,30}")


class ChannelForm(forms.ModelForm):
    class Meta:
        model = NotificationChannel
        fields = ["queue", "kind", "target", "enabled"]
        labels = {
            "queue": gettext_lazy("Queue"),
            "kind": gettext_lazy("Channel"),
            "target": gettext_lazy("Addresses or webhook URL"),
            "enabled": gettext_lazy("Enabled"),
        }
        help_texts = {
            "target": gettext_lazy(
                "Email: addresses separated by commas. Webhook: an http(s) URL that takes a JSON "
                "POST with a “text” field (chat tools' incoming webhooks do). Slack: the channel's "
                "id; approvals get Approve, Reject and Open buttons."
            )
        }

    new_queue = forms.BooleanField(
        required=False,
        label=gettext_lazy("It is a new queue"),
        help_text=gettext_lazy(
            "Tick to save a channel for a queue no rule or workflow sends runs to yet."
        ),
    )

    def clean_queue(self):
        # A queue is matched exactly: a name with an invisible character would never notify.
        queue = self.cleaned_data.get("queue", "")
        validate_identifier(queue)
        return queue

    def _check_queue_exists(self, data: dict) -> None:
        """A channel for a queue nothing routes to ("supprot") would never notify anyone, and
        would then be offered as a place to move runs to: refused unless it is a new queue."""
        queue = data.get("queue")
        if not queue or data.get("new_queue"):
            return
        routed = routed_queues()
        if queue in routed:
            return
        close = difflib.get_close_matches(queue, sorted(routed), n=1)
        hint = _(" Did you mean “%(name)s”?") % {"name": close[0]} if close else ""
        self.add_error(
            "queue",
            _(
                "No rule or workflow sends runs to the queue “%(queue)s”.%(hint)s Tick “It is a "
                "new queue” to save it anyway."
            )
            % {"queue": queue, "hint": hint},
        )

    def clean(self):
        data = super().clean()
        self._check_queue_exists(data)
        kind, target = data.get("kind"), (data.get("target") or "").strip()
        if not target:
            return data
        if kind == NotificationChannel.Kind.EMAIL:
            addresses = split_addresses(target)
            bad = []
            for address in addresses:
                try:
                    validate_email(address)
                except ValidationError:
                    bad.append(address)
            if bad or not addresses:
                self.add_error(
                    "target", _("Not an email address: %(bad)s") % {"bad": ", ".join(bad) or target}
                )
            else:
                data["target"] = ", ".join(addresses)
        elif kind == NotificationChannel.Kind.WEBHOOK:
            try:
                check_webhook_target(target)
            except DeliveryError as exc:
                self.add_error("target", str(exc))
            data["target"] = target
        elif kind == NotificationChannel.Kind.SLACK:
            self._check_slack(data, target)
        return data

    def _check_slack(self, data: dict, target: str) -> None:
        """A Slack channel id (C…, G…), and this server set up to post there."""
        if not SLACK_CHANNEL_ID.fullmatch(target):
            self.add_error(
                "target",
                _(
                    "A Slack channel id, like C0123456789 (in Slack: the channel's details, at "
                    "the bottom), not its name."
                ),
            )
            return
        problem = slack.configuration_problem()
        if problem:
            self.add_error("target", _("Slack is not set up here: %(why)s.") % {"why": problem})
        data["target"] = target

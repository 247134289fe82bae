"""Deciding an approval from its mail: what the mail says, and the signed links it carries.

A queue's email channel gets, for a run waiting on an approval, one message per address with
what the console's run page shows under "What will be done if you approve" (read by the
console's own readers, approvals/console/) and three links: Approve, Reject and Open.

Approve and Reject are signed (django.core.signing, a salt of their own, a timestamp) and carry:
- the approval request, the run's version and the console's digest of what a person acts on
  (approvals.live.actionable_state) when the mail was written, and the digest of the call it
  approves: a request decided, edited or first-approved since makes the link stale;
- the verb;
- the recipient: the address and, when exactly one active user has it, that user.

A link expires after TASKPILOTS_MAIL_LINK_HOURS (24 by default). It decides nothing by itself:
opening it (GET) shows a confirmation page; only its form's POST, by the recipient signed in,
with the CSRF token, goes through the console's own action (approvals/mail_views.py). It is one
time without a record of its own: a decision moves the request or the run on, and the link is
then stale and only says what happened.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core import signing
from django.core.mail import EmailMultiAlternatives
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.utils.html import strip_tags

from approvals import console, live, viewer_time
from approvals.models import ApprovalRequest, shown
from approvals.permissions import may_act
from runs.invisible import neutralise
from runs.models import Run

SALT = "taskpilots.approvals.mail-decision"
VERBS = ("approve", "reject")
# The events about a run that waits for a person: their mail carries the approval, if any.
LINK_EVENTS = ("queued", "sla_breached", "escalated", "second_approver")


class LinkRefused(Exception):
    """A link that cannot be read: `kind` is "forged" (bad signature or content) or "expired"."""

    def __init__(self, kind: str):
        super().__init__(kind)
        self.kind = kind


@dataclass(frozen=True)
class MailLink:
    approval_id: int
    verb: str
    address: str
    user_id: int | None
    version: int
    state: str
    digest: str


def lifetime() -> timedelta:
    return timedelta(hours=float(settings.TASKPILOTS.get("MAIL_LINK_HOURS", 24.0)))


def public_url(path: str) -> str:
    """`path` under the console's public address (TASKPILOTS["PUBLIC_URL"]; relative without)."""
    base = settings.TASKPILOTS.get("PUBLIC_URL", "") or ""
    return base.rstrip("/") + path


def sign(link: MailLink) -> str:
    data = {
        "a": link.approval_id,
        "x": link.verb,
        "e": link.address,
        "u": link.user_id,
        "v": link.version,
        "s": link.state,
        "d": link.digest,
    }
    return signing.dumps(data, salt=SALT, compress=True)


def read(token: str) -> MailLink:
    """The link `token` stands for, or LinkRefused. The signature is checked before the age,
    so a tampered old link is "forged"."""
    try:
        data = signing.loads(token, salt=SALT, max_age=lifetime())
    except signing.SignatureExpired:
        raise LinkRefused("expired") from None
    except signing.BadSignature:
        raise LinkRefused("forged") from None
    try:
        link = MailLink(
            approval_id=int(data["a"]),
            verb=str(data["x"]),
            address=str(data["e"]),
            user_id=None if data["u"] is None else int(data["u"]),
            version=int(data["v"]),
            state=str(data["s"]),
            digest=str(data["d"]),
        )
    except (KeyError, TypeError, ValueError):
        raise LinkRefused("forged") from None
    if link.verb not in VERBS:
        raise LinkRefused("forged")
    return link


# --------------------------------------------------------------------------------------------
# Who a link is for


def recipient_user(address: str):
    """The one active user whose email is `address`, or None (nobody, or more than one)."""
    users = list(get_user_model().objects.filter(email__iexact=address.strip(), is_active=True)[:2])
    return users[0] if len(users) == 1 else None


def is_recipient(link: MailLink, user) -> bool:
    """Whether `user` (signed in) is the person the link was sent to: their email is the link's
    address and, when the link names a user, they are that user; when it names none, the
    address must be theirs alone."""
    if not user.is_authenticated or (user.email or "").strip().lower() != link.address:
        return False
    if link.user_id is not None:
        return user.pk == link.user_id
    found = recipient_user(link.address)
    return found is not None and found.pk == user.pk


def approved_digest(approval: ApprovalRequest) -> str:
    """The digest of what an approval approves now (the first approver's call, once given)."""
    return shown(approval.tool, approval.approved_params)["digest"]


def why_spent(link: MailLink, approval: ApprovalRequest, user) -> str:
    """Why the link no longer decides anything ("" when it still may): "decided" (or cancelled,
    expired), "yours" (this person gave the first of two approvals), "changed" (the run or what
    it approves moved on since the mail). The same version rule as the console's pages."""
    if approval.status != ApprovalRequest.Status.PENDING:
        return "decided"
    if approval.first_approved_by_id == user.pk:
        return "yours"
    if approved_digest(approval) != link.digest:
        return "changed"
    version = Run.objects.values_list("lock_version", flat=True).get(pk=approval.run_id)
    if version != link.version and live.actionable_state(approval.run_id) != link.state:
        return "changed"
    return ""


# --------------------------------------------------------------------------------------------
# The mail


def _plain(value) -> str:
    """A console sentence or label (escaped HTML) as plain text, invisible characters shown."""
    return neutralise(html.unescape(strip_tags(str(value))))


def summary(ctx: console.RunContext) -> dict:
    """What the run page shows about the approval, as plain text for the mail."""
    run, approval, pending = ctx.run, ctx.approval, ctx.pending
    params = console.preview_json(pending.params if pending else approval.approved_params)
    due = run.attention_due_at
    return {
        "suggestion": _plain(ctx.suggestion),
        "reason": neutralise(approval.reason),
        "risk": _plain(console.label(console.RISK_LABELS, approval.risk)),
        "tool": neutralise(approval.tool) or "—",
        "target": neutralise(pending.target if pending else "") or "—",
        "amount": _plain(pending.amount) if pending else "",
        "params": neutralise(params.text),
        "params_cut": params.truncated,
        "due": viewer_time.format_timestamp(due) if due else "",
        "overdue": bool(due and due < timezone.now()),
        "workflow": neutralise(run.workflow),
        "business_key": neutralise(run.business_key or ""),
        "queue": neutralise(run.queue or ""),
        "first_approved_by": (
            neutralise(approval.first_approved_by.get_username())
            if approval.first_approved_by_id
            else ""
        ),
        "approvals_required": approval.approvals_required,
    }


def links_for(ctx: console.RunContext, state: str, address: str, user) -> dict[str, str]:
    """The recipient's links: Open always; Approve and Reject where the console would offer
    them to this person (a user who may act, not the first approver of a two-person call…);
    both for an address no single user has (the person who signs in with it is checked)."""
    run, approval = ctx.run, ctx.approval
    found = {"open": public_url(reverse("console:run-detail", args=[run.pk]))}
    offered = set(VERBS)
    if user is not None:
        offered = offered if may_act(user, run) else set()
        offered -= console.not_yours_to_approve(run, approval, user)
    for verb in VERBS:
        if verb in offered:
            token = sign(
                MailLink(
                    approval_id=approval.pk,
                    verb=verb,
                    address=address.strip().lower(),
                    user_id=user.pk if user is not None else None,
                    version=run.lock_version,
                    state=state or "",
                    digest=approved_digest(approval),
                )
            )
            found[verb] = public_url(reverse("console:mail-link", args=[token]))
    return found


def approval_messages(run_id, payload: dict, recipients: list[str]):
    """One message per address for a run waiting on an approval, or None when the event is not
    about such a run (the caller sends its usual message)."""
    if payload.get("event") not in LINK_EVENTS:
        return None
    run = Run.objects.select_related("owner").filter(pk=run_id).first()
    if run is None:
        return None
    ctx = console.build_run_context(run, None)
    if ctx.approval is None:
        return None
    state = live.actionable_state(run.pk)
    context = {"summary": summary(ctx), "text": payload["text"], "expires": _expiry()}
    subject = payload["text"].splitlines()[0][:150]
    messages = []
    for address in recipients:
        user = recipient_user(address)
        personal = {
            **context,
            "subject": subject,
            "links": links_for(ctx, state, address, user),
            "address": address,
        }
        message = EmailMultiAlternatives(
            subject, render_to_string("mail/approval.txt", personal), None, [address]
        )
        # The same content and links as HTML, for clients that show it (buttons, a table).
        message.attach_alternative(render_to_string("mail/approval.html", personal), "text/html")
        messages.append(message)
    return messages


def _expiry() -> str:
    return viewer_time.format_timestamp(timezone.now() + lifetime())

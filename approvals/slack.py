"""Deciding an approval in Slack: the message a queue's Slack channel gets, its buttons, and
keeping the message true once the request is decided anywhere.

A queue's Slack channel (NotificationChannel kind "slack", target: a channel id) gets, for a run
waiting on an approval, one interactive message (chat.postMessage, Block Kit) with what the
console's run page shows under "What will be done if you approve" — read by the console's own
readers, as the mail is (approvals/mail_decisions.summary) — and three buttons: Approve, Reject
and Open (the run page). Where it was posted (channel id and `ts`) is kept (SlackMessage).

Approve and Reject carry, in their `value`, what the person decides on, signed
(django.core.signing, a salt of its own): the approval request, the verb, the run's version, the
console's digest of what a person acts on (approvals.live.actionable_state) and the digest of the
call approved. A request decided, first-approved or moved on since makes the button stale
(mail_decisions.why_spent, the rule the mail links follow). Pressing one is handled by
approvals/slack_views.py: Slack's signature first, then the linked TaskPilots user, then the
console's own action.

The message is updated (chat.update) through the notification deliveries (their retries and
backoff): every `approval.*` event that ends or first-approves a request records one delivery per
message about it (approvals/notifications.py). Decided, it says by whom and when, without
buttons; first-approved, it says who approved and carries fresh buttons for the second person;
taken over (`run.taken_over`), it says by whom and has no Approve or Reject until the run is
given back (`run.released`). Answers to a press are in the presser's Slack language.

slack_sdk is the `slack` extra: without it (or without TASKPILOTS_SLACK_BOT_TOKEN) a Slack
channel's deliveries fail with what to install or set, and nothing else changes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.conf import settings
from django.core import signing
from django.core.cache import cache
from django.urls import reverse
from django.utils import timezone, translation
from django.utils.translation import gettext as _

from approvals import console, live, mail_decisions, viewer_time
from approvals.models import ApprovalRequest, NotificationChannel, SlackMessage, shown
from runs.invisible import neutralise
from runs.models import Run

logger = logging.getLogger("taskpilots.slack")

SALT = "taskpilots.approvals.slack-decision"
VERBS = ("approve", "reject")
# The delivery event that brings an existing message up to date (approvals/notifications.py).
UPDATE = "slack_update"
# Slack's limits: a section's text, a field, a header, a button's value.
TEXT_MAX, FIELD_MAX, HEADER_MAX = 3000, 2000, 150
API_TIMEOUT_SECONDS = 5
# How long a person's Slack language is kept, and how soon it is asked again when Slack did not say.
LOCALE_SECONDS, LOCALE_RETRY_SECONDS = 24 * 3600, 10 * 60


class NotConfigured(Exception):
    """The slack extra is not installed, or the bot token is not set."""


# --------------------------------------------------------------------------------------------
# The buttons' values


@dataclass(frozen=True)
class Button:
    """What an Approve or Reject button decides on (the fields mail_decisions.why_spent reads)."""

    approval_id: int
    verb: str
    version: int
    state: str
    digest: str


def sign(button: Button) -> str:
    data = {
        "a": button.approval_id,
        "x": button.verb,
        "v": button.version,
        "s": button.state,
        "d": button.digest,
    }
    return signing.dumps(data, salt=SALT, compress=True)


def read(value: str) -> Button:
    """The button `value` stands for, or mail_decisions.LinkRefused("forged"). No age limit:
    the message loses its buttons when the request is decided, and a stale one is refused."""
    try:
        data = signing.loads(value, salt=SALT)
        button = Button(
            approval_id=int(data["a"]),
            verb=str(data["x"]),
            version=int(data["v"]),
            state=str(data["s"]),
            digest=str(data["d"]),
        )
    except (signing.BadSignature, KeyError, TypeError, ValueError):
        raise mail_decisions.LinkRefused("forged") from None
    if button.verb not in VERBS:
        raise mail_decisions.LinkRefused("forged")
    return button


def buttons_for(approval: ApprovalRequest, run: Run, state: str) -> dict[str, str]:
    return {
        verb: sign(
            Button(
                approval_id=approval.pk,
                verb=verb,
                version=run.lock_version,
                state=state or "",
                digest=mail_decisions.approved_digest(approval),
            )
        )
        for verb in VERBS
    }


def run_url(run_id) -> str:
    return mail_decisions.public_url(reverse("console:run-detail", args=[run_id]))


def is_absolute(url: str) -> bool:
    return url.startswith(("https://", "http://"))


# --------------------------------------------------------------------------------------------
# The Web API


def client():
    """A slack_sdk WebClient with the bot token, at TASKPILOTS_SLACK_API_URL."""
    try:
        from slack_sdk import WebClient
    except ImportError:
        raise NotConfigured(
            "Slack channels need the slack extra: pip install 'taskpilots[slack]'"
        ) from None
    token = settings.TASKPILOTS.get("SLACK_BOT_TOKEN") or ""
    if not token:
        raise NotConfigured("TASKPILOTS_SLACK_BOT_TOKEN is not set")
    base = settings.TASKPILOTS.get("SLACK_API_URL") or "https://slack.com/api/"
    return WebClient(token=token, base_url=base.rstrip("/") + "/", timeout=API_TIMEOUT_SECONDS)


def language_of(team_id: str, slack_user: str) -> str:
    """The language Slack shows this person (users.info with include_locale, scope users:read),
    as one of LANGUAGES: what their answers and forms are written in. Cached for a day; the
    server's language when Slack does not say (no scope, Slack down, a locale not offered)."""
    key = f"taskpilots:slack-locale:{team_id[:64]}:{slack_user[:64]}"
    language = cache.get(key)
    if language is not None:
        return language or settings.LANGUAGE_CODE
    locale = ""
    try:
        answer = client().users_info(user=slack_user, include_locale=True)
        locale = str((answer.get("user") or {}).get("locale") or "")
    except Exception as exc:  # no users:read scope, Slack down: the server's language
        logger.info("slack users.info for %s: %s", slack_user, exc)
    try:
        language = translation.get_supported_language_variant(locale.lower()) if locale else ""
    except LookupError:
        language = ""
    cache.set(key, language, LOCALE_SECONDS if language else LOCALE_RETRY_SECONDS)
    return language or settings.LANGUAGE_CODE


def email_of(slack_user: str) -> str:
    """The email address on the Slack user's profile (users.info, scope users:read.email), ""
    when Slack does not say (the scope missing, Slack down): what a person linking their own
    Slack account is checked against (approvals/slack_link.py)."""
    try:
        answer = client().users_info(user=slack_user)
        profile = (answer.get("user") or {}).get("profile") or {}
        return str(profile.get("email") or "").strip()
    except Exception as exc:
        logger.info("slack users.info for %s: %s", slack_user, exc)
        return ""


# --------------------------------------------------------------------------------------------
# The message


def _text(text: str, limit: int = TEXT_MAX) -> dict:
    """A plain_text object: what an agent wrote is never Slack markup (no mentions, no links)."""
    text = text or "—"
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return {"type": "plain_text", "text": text, "emoji": False}


def _field(label: str, value: str) -> dict:
    return _text(f"{label}: {value or '—'}", FIELD_MAX)


def _title(run: Run) -> str:
    return _("Approval needed: %(workflow)s run %(run)s") % {
        "workflow": neutralise(run.workflow),
        "run": str(run.pk)[:8],
    }


def _approvers(summary: dict) -> str:
    who = summary["first_approved_by"]
    if who:
        return _(
            "Approved by %(who)s; a second person, not %(who)s, must approve it before it is made."
        ) % {"who": who}
    return _(
        "Needs two different people to approve; the person who started or took over the run "
        "cannot approve."
    )


def _sla(summary: dict) -> str:
    if not summary["due"]:
        return _("no SLA")
    if summary["overdue"]:
        return _("overdue since %(due)s") % {"due": summary["due"]}
    return _("due %(due)s") % {"due": summary["due"]}


def pending_blocks(ctx: console.RunContext, state: str) -> list[dict]:
    """The message for a request waiting on a person: the run page's context and the buttons."""
    summary = mail_decisions.summary(ctx)
    reason = f"{_('Asked because')}: {summary['reason']} ({summary['risk']})"
    fields = [
        _field(_("Tool"), summary["tool"]),
        _field(_("Target"), summary["target"]),
        _field(_("Amount"), summary["amount"]),
        _field(_("SLA"), _sla(summary)),
        _field(_("Workflow"), summary["workflow"]),
        _field(_("Business key"), summary["business_key"]),
    ]
    params = summary["params"]
    if summary["params_cut"]:
        params += "\n" + _("Shortened: open the run to see all the parameters.")
    blocks = [
        {"type": "header", "text": _text(_title(ctx.run), HEADER_MAX)},
        {"type": "section", "text": _text(f"{_('Why it stopped')}: {summary['suggestion']}")},
        {"type": "section", "text": _text(reason)},
    ]
    if summary["approvals_required"] > 1:
        blocks.append(
            {"type": "section", "text": _text(f"{_('Approvers')}: {_approvers(summary)}")}
        )
    blocks += [
        {"type": "section", "text": _text(_("What will be done if you approve")), "fields": fields},
        {"type": "section", "text": _text(f"{_('Parameters')}:\n{params}")},
        *_actions(ctx.run, _buttons(ctx, state)),
    ]
    return blocks


def _buttons(ctx: console.RunContext, state: str) -> dict[str, str]:
    """Approve and Reject, unless a person took the run over: then only they decide, in the
    console (the message says who; their release brings the buttons back)."""
    if ctx.run.status == Run.Status.TAKEN_OVER:
        return {}
    return buttons_for(ctx.approval, ctx.run, state)


def _actions(run: Run, values: dict[str, str]) -> list[dict]:
    """The actions block (a list of none or one): the buttons, and Open where the console has
    an absolute address."""
    elements = []
    if "approve" in values:
        elements.append(
            {
                "type": "button",
                "action_id": "approve",
                "style": "primary",
                "text": _text(_("Approve")),
                "value": values["approve"],
            }
        )
    if "reject" in values:
        elements.append(
            {
                "type": "button",
                "action_id": "reject",
                "style": "danger",
                "text": _text(_("Reject")),
                "value": values["reject"],
            }
        )
    url = run_url(run.pk)
    if is_absolute(url):  # Slack takes absolute URLs only (TASKPILOTS_PUBLIC_URL)
        elements.append(
            {
                "type": "button",
                "action_id": "open",
                "text": _text(_("Open in the console")),
                "url": url,
            }
        )
    return [{"type": "actions", "block_id": "decide", "elements": elements}] if elements else []


def outcome(approval: ApprovalRequest) -> str:
    """What became of a request that is no longer waiting, by whom and when."""
    when = viewer_time.format_timestamp(approval.decided_at) if approval.decided_at else ""
    who = approval.decided_by.get_username() if approval.decided_by_id else ""
    if approval.status == ApprovalRequest.Status.DECIDED:
        if approval.decision == ApprovalRequest.Decision.REJECTED:
            text = _("Rejected by %(who)s at %(when)s.") % {"who": who, "when": when}
            return f"{text} {_('Reason')}: {neutralise(approval.comment)}"
        if approval.decision == ApprovalRequest.Decision.APPROVED_WITH_EDITS:
            return _("Approved with edits by %(who)s at %(when)s.") % {"who": who, "when": when}
        return _("Approved by %(who)s at %(when)s.") % {"who": who, "when": when}
    if approval.status == ApprovalRequest.Status.EXPIRED:
        return _("Expired: nobody decided in time.")
    return _("Cancelled: nobody needs this decision any more.")


def decided_blocks(approval: ApprovalRequest, run: Run) -> list[dict]:
    """The message once the request is decided (or expired, cancelled): no buttons but Open."""
    seen = shown(approval.tool, approval.approved_params)
    fields = [
        _field(_("Tool"), neutralise(approval.tool)),
        _field(_("Target"), neutralise(seen["target"])),
        _field(_("Workflow"), neutralise(run.workflow)),
        _field(_("Business key"), neutralise(run.business_key or "")),
    ]
    return [
        {"type": "header", "text": _text(_title(run), HEADER_MAX)},
        {"type": "section", "text": _text(outcome(approval)), "fields": fields},
        *_actions(run, {}),
    ]


def blocks_for(approval: ApprovalRequest) -> tuple[str, list[dict]]:
    """The message about `approval` as it stands now: (fallback text, blocks)."""
    run = Run.objects.select_related("owner").get(pk=approval.run_id)
    if approval.status == ApprovalRequest.Status.PENDING:
        ctx = console.build_run_context(run, None)
        if ctx.approval is not None and ctx.approval.pk == approval.pk:
            return _title(run), pending_blocks(ctx, live.actionable_state(run.pk) or "")
    return f"{_title(run)}: {outcome(approval)}", decided_blocks(approval, run)


# --------------------------------------------------------------------------------------------
# Sending (a delivery of approvals/notifications.py, outside any transaction)


def send(channel: NotificationChannel, payload: dict) -> None:
    """Post the message about the run's open approval in the channel (or bring the one already
    posted up to date); a run that waits for something else gets its plain notification."""
    web = client()
    if payload.get("event") == UPDATE:
        for message in SlackMessage.objects.filter(
            approval_id=payload["approval"], channel=channel
        ):
            refresh(web, message)
        return
    run_id = (payload.get("run") or {}).get("id")
    run = Run.objects.select_related("owner").filter(pk=run_id).first() if run_id else None
    ctx = console.build_run_context(run, None) if run is not None else None
    if ctx is None or ctx.approval is None:
        web.chat_postMessage(
            channel=channel.target,
            text=payload["text"],
            blocks=[
                {"type": "section", "text": _text(payload["text"])},
                *(_actions(run, {}) if run is not None else []),
            ],
            unfurl_links=False,
        )
        return
    existing = SlackMessage.objects.filter(approval=ctx.approval, channel=channel).first()
    if existing is not None:
        refresh(web, existing)
        return
    _post(web, channel, ctx, payload["text"])


def _post(web, channel: NotificationChannel, ctx: console.RunContext, text: str) -> None:
    approval = ctx.approval
    shown_as = (approval.status, approval.first_approved_by_id, ctx.run.lock_version)
    blocks = pending_blocks(ctx, live.actionable_state(ctx.run.pk) or "")
    answer = web.chat_postMessage(
        channel=channel.target, text=text, blocks=blocks, unfurl_links=False
    )
    message, created = SlackMessage.objects.get_or_create(
        approval=approval,
        channel=channel,
        defaults={"slack_channel": answer["channel"], "ts": answer["ts"]},
    )
    if not created:  # another sender posted it meanwhile: keep one message
        web.chat_delete(channel=answer["channel"], ts=answer["ts"])
    approval.refresh_from_db()
    version = Run.objects.values_list("lock_version", flat=True).get(pk=approval.run_id)
    if (approval.status, approval.first_approved_by_id, version) != shown_as:
        refresh(web, message)  # decided while it was being posted: no stale buttons


def refresh(web, message: SlackMessage) -> None:
    """chat.update the message with the request as it stands now."""
    approval = ApprovalRequest.objects.select_related("decided_by", "first_approved_by").get(
        pk=message.approval_id
    )
    text, blocks = blocks_for(approval)
    web.chat_update(channel=message.slack_channel, ts=message.ts, text=text, blocks=blocks)
    SlackMessage.objects.filter(pk=message.pk).update(updated_at=timezone.now())


def configuration_problem() -> str:
    """Why a Slack channel cannot work here ("" when it can): for the channel form."""
    try:
        client()
    except NotConfigured as exc:
        return str(exc)
    if not is_absolute(run_url("00000000-0000-0000-0000-000000000000")):
        return "TASKPILOTS_PUBLIC_URL is not set: Slack's Open buttons need the console's address"
    return ""

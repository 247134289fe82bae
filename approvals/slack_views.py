"""Slack's interactivity requests: Approve or Reject pressed on a message approvals/slack.py
posted, and the reason a Reject asks for.

In this order, and nothing is written before the last step:
1. Slack's signature: X-Slack-Signature is the v0 HMAC-SHA256 of "v0:{timestamp}:{body}" with
   the app's signing secret (compared in constant time), and X-Slack-Request-Timestamp within
   five minutes (slack_sdk.signature.SignatureVerifier). Otherwise 401.
2. The button's own signature (approvals/slack.py): a value TaskPilots did not make is refused.
3. The person: the Slack user (workspace id + user id) must be linked to an active TaskPilots
   user (SlackIdentity) whose role acts on runs; otherwise an ephemeral answer says what to do.
   An unlinked person's answer carries a "Link your Slack account" link, signed and short-lived,
   to a console page where they link it to themselves (approvals/slack_link.py).
4. The request: still pending and as the message showed it (mail_decisions.why_spent, the rule
   of the mail links): decided anywhere → "already decided by X at T"; first-approved by this
   person → "it waits for a second approver"; moved on → the console's conflict sentence.
5. The console's own action (approvals.views.act, what the run page's buttons call): the same
   roles, takeovers, two-person rules, soft claims, stale-version check and records. A soft
   claim, a takeover, or anything the action refuses is answered with the console's sentence
   and the run's link: what Slack cannot do (edit, conditions, acting despite a claim, taking
   over) is done in the console.

Reject needs a reason: the button opens a modal (views.open) and the decision is taken when it
is submitted (view_submission), through the same steps. Answers go to the person alone
(chat.postEphemeral); the message itself is updated through the notification deliveries.
"""

from __future__ import annotations

import html
import json
import logging
import time
from dataclasses import dataclass

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import path
from django.utils import translation
from django.utils.html import strip_tags
from django.utils.translation import gettext as _
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from approvals import (
    console,
    live,
    mail_decisions,
    notifications,
    slack,
    slack_link,
    viewer_time,
    views,
)
from approvals.models import ApprovalRequest, SlackIdentity
from approvals.permissions import ACT
from runs.invisible import neutralise
from runs.models import Run, TimelineEvent

logger = logging.getLogger("taskpilots.slack")

MAX_AGE_SECONDS = 5 * 60
REJECT_VIEW = "taskpilots_reject"
REASON_MAX = 4000


@dataclass(frozen=True)
class Press:
    """A button pressed (or the reject modal submitted) by one Slack user."""

    team_id: str
    slack_user: str
    channel: str
    value: str
    verb: str
    comment: str = ""
    trigger_id: str = ""


class Refused(Exception):
    """What to tell the person instead of deciding (nothing was written)."""


# --------------------------------------------------------------------------------------------
# The endpoint


@csrf_exempt  # Slack signs its requests instead (checked first)
@require_POST
def interactivity(request: HttpRequest) -> HttpResponse:
    refusal = _verify(request)
    if refusal is not None:
        return refusal
    try:
        payload = json.loads(request.POST.get("payload", ""))
    except ValueError:
        return HttpResponse("not a Slack payload", status=400, content_type="text/plain")
    if not isinstance(payload, dict):
        return HttpResponse("not a Slack payload", status=400, content_type="text/plain")
    view = payload.get("view") or {}
    if payload.get("type") == "block_actions":
        handle = _block_actions
    elif payload.get("type") == "view_submission" and view.get("callback_id") == REJECT_VIEW:
        handle = _reject_submitted
    else:
        return HttpResponse(status=200)  # nothing of ours (a link button, a closed modal)
    slack_user = (payload.get("user") or {}).get("id", "")
    with translation.override(slack.language_of(_team(payload), str(slack_user))):
        return handle(payload)


def _verify(request: HttpRequest) -> HttpResponse | None:
    """None when Slack signed this request within five minutes; else the answer."""
    secret = settings.TASKPILOTS.get("SLACK_SIGNING_SECRET") or ""
    try:
        from slack_sdk.signature import SignatureVerifier
    except ImportError:
        SignatureVerifier = None  # noqa: N806 (the slack extra is not installed)
    if not secret or SignatureVerifier is None:
        logger.warning("slack request refused: Slack is not set up here")
        return HttpResponse("Slack is not set up here", status=404, content_type="text/plain")
    timestamp = request.headers.get("X-Slack-Request-Timestamp", "")
    signature = request.headers.get("X-Slack-Signature", "")
    if not timestamp.isdigit() or abs(time.time() - int(timestamp)) > MAX_AGE_SECONDS:
        logger.warning("slack request refused: timestamp %r outside five minutes", timestamp[:20])
        return HttpResponse("stale or missing timestamp", status=401, content_type="text/plain")
    try:
        valid = SignatureVerifier(secret).is_valid(request.body, timestamp, signature)
    except UnicodeDecodeError:
        valid = False
    if not valid:
        logger.warning("slack request refused: bad signature")
        return HttpResponse("bad signature", status=401, content_type="text/plain")
    return None


def _block_actions(payload: dict) -> HttpResponse:
    action = (payload.get("actions") or [{}])[0]
    verb = action.get("action_id")
    if verb not in slack.VERBS:
        return HttpResponse(status=200)  # Open is a link: nothing to do here
    press = Press(
        team_id=_team(payload),
        slack_user=(payload.get("user") or {}).get("id", ""),
        channel=(payload.get("channel") or {}).get("id", ""),
        value=str(action.get("value", "")),
        verb=verb,
        trigger_id=payload.get("trigger_id", ""),
    )
    try:
        user, button, approval = _prepare(press)
        if verb == "reject":
            _open_reject(press, approval)
            return HttpResponse(status=200)
        answer = _decide(press, user, button, approval)
    except Refused as exc:
        answer = str(exc)
    _tell(press, answer)
    return HttpResponse(status=200)


def _reject_submitted(payload: dict) -> HttpResponse:
    view = payload.get("view") or {}
    try:
        meta = json.loads(view.get("private_metadata") or "{}")
        values = (view.get("state") or {}).get("values") or {}
        reason = ((values.get("reason") or {}).get("reason") or {}).get("value") or ""
    except (ValueError, AttributeError):
        return HttpResponse("not a Slack payload", status=400, content_type="text/plain")
    press = Press(
        team_id=_team(payload),
        slack_user=(payload.get("user") or {}).get("id", ""),
        channel=str(meta.get("channel", "")),
        value=str(meta.get("value", "")),
        verb="reject",
        comment=reason.strip(),
    )
    if not press.comment:
        return _modal_error(_("Say why you reject it."))
    try:
        user, button, approval = _prepare(press)
        answer = _decide(press, user, button, approval)
    except Refused as exc:
        return _modal_error(str(exc))
    _tell(press, answer)
    return HttpResponse(status=200)  # closes the modal


def _modal_error(text: str) -> JsonResponse:
    return JsonResponse({"response_action": "errors", "errors": {"reason": text[:2000]}})


def _team(payload: dict) -> str:
    return (payload.get("user") or {}).get("team_id") or (payload.get("team") or {}).get("id", "")


# --------------------------------------------------------------------------------------------
# Who presses, on what


def _prepare(press: Press):
    """(the TaskPilots user, the button, the request) when the press may go to the console's
    action; else Refused with what to tell the person."""
    try:
        button = slack.read(press.value)
    except mail_decisions.LinkRefused:
        button = None
    if button is None or button.verb != press.verb:
        logger.warning("slack button refused: forged value, slack user %s", press.slack_user)
        raise Refused(_("This button is not one TaskPilots made; nothing was done."))
    user = SlackIdentity.user_for(press.team_id, press.slack_user)
    approval = (
        ApprovalRequest.objects.select_related("run", "decided_by", "first_approved_by")
        .filter(pk=button.approval_id)
        .first()
    )
    link = _link(approval.run_id if approval else None)
    if user is None:
        logger.warning("slack button refused: slack user %s is not linked", press.slack_user)
        raise Refused(_not_linked(press) + link)
    refusal = ACT.refusal_for(user)
    if refusal:
        raise Refused(f"{refusal}{link}")
    if approval is None:
        raise Refused(_("This approval request no longer exists."))
    spent = mail_decisions.why_spent(button, approval, user)
    if spent == "decided":
        raise Refused(_already(approval) + link)
    if spent == "yours":
        when = viewer_time.format_timestamp(approval.first_approved_at)
        raise Refused(
            _("You approved this call at %(when)s; it waits for a second approver.")
            % {"when": when}
            + link
        )
    if spent == "changed":
        raise Refused(_plain(console.conflict_message(approval.run)) + link)
    return user, button, approval


def _not_linked(press: Press) -> str:
    """Why nothing was done, with the link that lets the person link their Slack account
    themselves (approvals/slack_link.py) where the console has an absolute address."""
    url = slack_link.url_for(press.team_id, press.slack_user)
    if not url:
        return _(
            "Your Slack account is not linked to a TaskPilots user, so nothing was done. Ask "
            "an admin to link it (manage.py link_slack_user), or decide in the console."
        )
    minutes = int(slack_link.lifetime().total_seconds() // 60)
    text = _(
        "Your Slack account is not linked to a TaskPilots user, so nothing was done. Link it "
        "to yourself (sign in to the console; the link works for %(minutes)s minutes), ask an "
        "admin to link it, or decide in the console."
    ) % {"minutes": minutes}
    return f"{text} <{url}|{_('Link your Slack account')}>"


def _already(approval: ApprovalRequest) -> str:
    return _("Already decided: %(outcome)s") % {"outcome": _escape(slack.outcome(approval))}


# --------------------------------------------------------------------------------------------
# Deciding: the console's own action


def _decide(press: Press, user, button: slack.Button, approval: ApprovalRequest) -> str:
    run = Run.objects.select_related("owner").get(pk=approval.run_id)
    last_seq = (
        TimelineEvent.objects.filter(run_id=run.pk).order_by("-seq").values_list("seq", flat=True)
    ).first() or 0
    data = {
        "expected_version": str(button.version),
        "expected_state": button.state,
        "approval": str(button.approval_id),
        "comment": press.comment,
        "conditions": "",
    }
    acted = views.act(run, user, button.verb, data)
    link = _link(run.pk)
    if acted.status == 200:
        logger.info("slack: %s %s approval %s", user.get_username(), button.verb, approval.pk)
        # The message updates at once rather than at the sweeper's next pass.
        notifications.record_run_events(run.pk, last_seq)
        return _plain(acted.message)
    if acted.status == 428:  # pressing again in Slack would not act anyway: the console does
        held = _plain(live.claim_warning_held(acted.claim))
        raise Refused(held + " " + _("Open the run in the console to act anyway.") + link)
    errors = ""
    if acted.form is not None and acted.form.errors:
        errors = " " + " ".join(
            _escape(str(error)) for field in acted.form.errors.values() for error in field
        )
    raise Refused(_plain(acted.message) + errors + link)


def _open_reject(press: Press, approval: ApprovalRequest) -> None:
    """The modal that asks why (views.open, within Slack's three seconds of the press)."""
    run = approval.run
    what = f"{neutralise(approval.tool) or '—'} · {neutralise(run.workflow)} {str(run.pk)[:8]}"
    view = {
        "type": "modal",
        "callback_id": REJECT_VIEW,
        "title": {"type": "plain_text", "text": _("Reject")[:24]},
        "submit": {"type": "plain_text", "text": _("Reject")[:24]},
        "close": {"type": "plain_text", "text": _("Cancel")[:24]},
        "private_metadata": json.dumps({"value": press.value, "channel": press.channel}),
        "blocks": [
            {"type": "section", "text": {"type": "plain_text", "text": what, "emoji": False}},
            {
                "type": "input",
                "block_id": "reason",
                "label": {"type": "plain_text", "text": _("Why reject it?")},
                "element": {
                    "type": "plain_text_input",
                    "action_id": "reason",
                    "multiline": True,
                    "max_length": REASON_MAX,
                },
            },
        ],
    }
    try:
        slack.client().views_open(trigger_id=press.trigger_id, view=view)
    except Exception as exc:  # Slack down: say so; nothing was decided
        logger.warning("slack views.open failed: %s", exc)
        raise Refused(
            _("Slack could not open the form; nothing was done. Reject in the console.")
            + _link(run.pk)
        ) from None


# --------------------------------------------------------------------------------------------
# Answers


def _plain(value) -> str:
    """A console sentence (escaped HTML) as Slack mrkdwn text: tags dropped, invisible
    characters shown, &<> escaped (no mention or link can come from a value)."""
    return _escape(neutralise(html.unescape(strip_tags(str(value)))))


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").strip()


def _link(run_id) -> str:
    """ " <url|Open the run in the console>" where the console has an absolute address."""
    if run_id is None:
        return ""
    url = slack.run_url(run_id)
    if not slack.is_absolute(url):
        return ""
    return f" <{url}|{_('Open the run in the console')}>"


def _tell(press: Press, text: str) -> None:
    """An ephemeral answer to the person who pressed (never in the way of a decision)."""
    if not press.channel or not press.slack_user:
        return
    try:
        slack.client().chat_postEphemeral(channel=press.channel, user=press.slack_user, text=text)
    except Exception as exc:
        logger.warning("slack chat.postEphemeral failed: %s", exc)


urlpatterns = [path("slack/interactivity/", interactivity, name="slack-interactivity")]

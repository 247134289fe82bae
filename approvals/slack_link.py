"""People link their own Slack account (approvals/models/slack.py, SlackIdentity).

A press in Slack by a Slack user no TaskPilots user is linked to is answered, to that person
alone, with a "Link your Slack account" link (approvals/slack_views.py): a signed token
(django.core.signing, a salt of its own, a timestamp) carrying the workspace id and the Slack
user id, at /console/slack/link/<token>/, working for TASKPILOTS_SLACK_LINK_MINUTES (30).

The Slack account must be shown to be the person's: its profile's email address (users.info,
scope users:read.email) must be their address in TaskPilots; otherwise (another address, or
Slack does not say) nothing is linked and an admin links it. The page also warns.

Like a mail's links (approvals/mail_views.py), the link writes nothing by itself: GET, signed in
(the login page keeps `next`), shows a confirmation page saying which Slack user will act as
whom; only its form's POST, with the CSRF token, links that Slack user to the person signed in.
Refused with a page saying what to do next, nothing written: a forged token (400), an expired
one (410), a person whose role does not act on runs (403: linking is for people who decide), a
Slack user already linked to someone else (409: an admin changes that). Already linked to this
same person: the page says so.

The person's API tokens page (console:tokens) lists their Slack links, each with Unlink (POST,
CSRF, their own only). A press reads the link at every press (SlackIdentity.user_for), so
linking or unlinking counts from the next press. Admins still link anyone (the Django admin,
`manage.py link_slack_user`).

There is no audit trail of account changes in TaskPilots (API tokens, admin links and
`link_slack_user` are not on any timeline or the records chain): linking and unlinking here are
logged to the "taskpilots.console" logger, and the link keeps who made it (`linked_by`
"console:<username>").
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core import signing
from django.db import IntegrityError, transaction
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import path, reverse
from django.utils.translation import gettext as _
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST

from approvals import mail_decisions, slack
from approvals.models import SlackIdentity
from approvals.permissions import ACT, READ, require_role

logger = logging.getLogger("taskpilots.console")

SALT = "taskpilots.approvals.slack-link"
TEMPLATE = "console/slack_link.html"
# Slack's ids: a workspace T…, a user U… or W… (what manage.py link_slack_user accepts).
SLACK_ID = re.compile(r"[A-Z0-9]{2,32}")
# Refusals, and the status each is answered with.
REFUSALS = {
    "forged": 400,
    "expired": 410,
    "role": 403,
    "taken": 409,
    "mismatch": 403,
    "unverified": 403,
}


@dataclass(frozen=True)
class LinkToken:
    team_id: str
    slack_user_id: str


def lifetime() -> timedelta:
    return timedelta(minutes=float(settings.TASKPILOTS.get("SLACK_LINK_MINUTES", 30.0)))


def sign(team_id: str, slack_user_id: str) -> str:
    return signing.dumps({"t": team_id, "u": slack_user_id}, salt=SALT)


def read(token: str) -> LinkToken:
    """The Slack user `token` names, or mail_decisions.LinkRefused ("forged" or "expired"). The
    signature is checked before the age, so a tampered old token is "forged"."""
    try:
        data = signing.loads(token, salt=SALT, max_age=lifetime())
    except signing.SignatureExpired:
        raise mail_decisions.LinkRefused("expired") from None
    except signing.BadSignature:
        raise mail_decisions.LinkRefused("forged") from None
    try:
        found = LinkToken(team_id=str(data["t"]), slack_user_id=str(data["u"]))
    except (KeyError, TypeError):
        raise mail_decisions.LinkRefused("forged") from None
    if not (SLACK_ID.fullmatch(found.team_id) and SLACK_ID.fullmatch(found.slack_user_id)):
        raise mail_decisions.LinkRefused("forged")
    return found


def url_for(team_id: str, slack_user_id: str) -> str:
    """The absolute link for this Slack user ("" when they cannot be linked: ids that are not
    Slack's, or no TASKPILOTS_PUBLIC_URL, since Slack takes absolute links only)."""
    if not (SLACK_ID.fullmatch(team_id or "") and SLACK_ID.fullmatch(slack_user_id or "")):
        return ""
    url = mail_decisions.public_url(
        reverse("console:slack-link", args=[sign(team_id, slack_user_id)])
    )
    return url if url.startswith(("https://", "http://")) else ""


# --------------------------------------------------------------------------------------------
# The pages


@never_cache
@require_http_methods(["GET", "POST"])
@login_required  # the login page comes back here (`next`)
def link(request: HttpRequest, token: str) -> HttpResponse:
    why = ACT.refusal_for(request.user)
    if why:
        return _refused(request, "role", why=why)
    try:
        found = read(token)
    except mail_decisions.LinkRefused as exc:
        return _refused(request, exc.kind)
    existing = _existing(found)
    if existing is not None and existing.user_id != request.user.pk:
        return _refused(request, "taken", found=found)
    context = {"found": found, "minutes": int(lifetime().total_seconds() // 60)}
    if existing is not None:
        return render(request, TEMPLATE, {**context, "state": "already"})
    not_theirs = _not_theirs(request.user, found)
    if not_theirs:
        return _refused(request, not_theirs, found=found)
    if request.method == "GET":
        return render(request, TEMPLATE, {**context, "state": "confirm"})
    return _link(request, found)


def _not_theirs(user, found: LinkToken) -> str:
    """Why this Slack account is not shown to be the signed-in person's ("" when it is): its
    profile's email address must be theirs in TaskPilots. Without it, a link someone else got
    by pressing in Slack, sent to a person who opens it and presses Link, would make that
    someone act as the person."""
    email = slack.email_of(found.slack_user_id)
    if not email:
        return "unverified"
    if email.casefold() != (user.email or "").strip().casefold():
        return "mismatch"
    return ""


def _existing(found: LinkToken) -> SlackIdentity | None:
    return SlackIdentity.objects.filter(
        team_id=found.team_id, slack_user_id=found.slack_user_id
    ).first()


def _link(request: HttpRequest, found: LinkToken) -> HttpResponse:
    username = request.user.get_username()
    try:
        with transaction.atomic():
            SlackIdentity.objects.create(
                user=request.user,
                team_id=found.team_id,
                slack_user_id=found.slack_user_id,
                linked_by=f"console:{username}"[:150],
            )
    except IntegrityError:  # linked between the page and the press: by them (twice), or another
        existing = _existing(found)
        if existing is not None and existing.user_id == request.user.pk:
            return render(request, TEMPLATE, {"found": found, "state": "already"})
        return _refused(request, "taken", found=found)
    logger.info(
        "slack identity linked: %s/%s to user=%s by themselves in the console",
        found.team_id,
        found.slack_user_id,
        username,
    )
    messages.success(
        request,
        _(
            "Slack user %(slack_user)s in workspace %(team)s is linked to you: its Approve and "
            "Reject presses now decide as you."
        )
        % {"slack_user": found.slack_user_id, "team": found.team_id},
    )
    return redirect("console:tokens")


@require_POST
@require_role(READ)
def unlink(request: HttpRequest, identity_id: int) -> HttpResponse:
    identity = get_object_or_404(SlackIdentity, pk=identity_id, user=request.user)
    identity.delete()
    logger.info(
        "slack identity unlinked: %s/%s from user=%s by themselves in the console",
        identity.team_id,
        identity.slack_user_id,
        request.user.get_username(),
    )
    messages.success(
        request,
        _(
            "Slack user %(slack_user)s in workspace %(team)s is no longer linked to you: its "
            "presses decide nothing from now on."
        )
        % {"slack_user": identity.slack_user_id, "team": identity.team_id},
    )
    return redirect("console:tokens")


def _refused(request: HttpRequest, kind: str, *, why: str = "", found=None) -> HttpResponse:
    logger.warning(
        "slack link refused: %s, user=%s method=%s slack=%s",
        kind,
        request.user.get_username() or "-",
        request.method,
        f"{found.team_id}/{found.slack_user_id}" if found else "-",
    )
    context = {"state": kind, "why": why, "found": found}
    return render(request, TEMPLATE, context, status=REFUSALS[kind])


urlpatterns = [
    path("slack/link/<str:token>/", link, name="slack-link"),
    path("slack/identities/<int:identity_id>/unlink/", unlink, name="slack-unlink"),
]

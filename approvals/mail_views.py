"""The page a mail's Approve / Reject link opens (approvals/mail_decisions.py makes the links).

GET never decides: it shows the same context as the run page and a button. The button's POST
(CSRF-protected, signed in) is handed to the console's own action view, approvals.views.
run_action, with the console's approve or reject form filled from the link: the same role and
takeover checks, two-person rules, soft-claim warning, stale-version check and records, and
nothing else. A link that is forged, expired, someone else's, or spent (decided here or
anywhere else, or the run moved on since the mail) is refused with a page saying what to do
next, before anything is read into a decision; nothing is written.
"""

from __future__ import annotations

import logging

from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import render
from django.urls import path
from django.utils import timezone
from django.utils.translation import gettext as _
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods

from approvals import console, live, mail_decisions, views
from approvals.models import ApprovalRequest
from approvals.permissions import ACT, require_role

logger = logging.getLogger("taskpilots.console")

TEMPLATE = "console/mail_link.html"
# Refusals of the link itself, and the status each is answered with.
REFUSALS = {"forged": 400, "expired": 410, "not_yours": 403, "gone": 404}


@never_cache
@require_http_methods(["GET", "POST"])
@require_role(ACT)  # signed in, and a role that acts on runs (else the console's 403)
def mail_link(request: HttpRequest, token: str) -> HttpResponse:
    try:
        link = mail_decisions.read(token)
    except mail_decisions.LinkRefused as exc:
        return _refused(request, exc.kind)
    if not mail_decisions.is_recipient(link, request.user):
        return _refused(request, "not_yours")
    approval = (
        ApprovalRequest.objects.select_related("run", "decided_by", "first_approved_by")
        .filter(pk=link.approval_id)
        .first()
    )
    if approval is None:
        return _refused(request, "gone")
    run = approval.run
    spent = mail_decisions.why_spent(link, approval, request.user)
    if spent:
        logger.info("mail link for approval %s: %s (%s)", approval.pk, spent, request.method)
        context = {"state": spent, "run": run, "approval": approval}
        if spent == "changed":
            context["conflict"] = console.conflict_message(run)
        return render(request, TEMPLATE, context, status=200 if request.method == "GET" else 409)
    comment = request.POST.get("comment", "").strip() if request.method == "POST" else ""
    if request.method == "GET" or (link.verb == "reject" and not comment):
        error = _("Say why you reject it.") if request.method == "POST" else ""
        return _confirmation(request, link, run, error=error)
    # The console's own action, with its form filled from the link (and the person's comment).
    request.POST = _console_form(link, comment, request.POST.get("despite_claim") == "1")
    return views.run_action(request, run.pk, link.verb)


def _console_form(link: mail_decisions.MailLink, comment: str, despite_claim: bool) -> QueryDict:
    data = QueryDict(mutable=True)
    data.update(
        {
            "expected_version": str(link.version),
            "expected_state": link.state,
            "approval": str(link.approval_id),
            "comment": comment,
            "conditions": "",
        }
    )
    if despite_claim:
        data["despite_claim"] = "1"
    return data


def _confirmation(request: HttpRequest, link, run, *, error: str = "") -> HttpResponse:
    ctx = console.build_run_context(run, request.user)
    held = live.claim_held_by_other(run, request.user)
    context = {
        "state": "confirm",
        "verb": link.verb,
        "ctx": ctx,
        "run": run,
        "approval": ctx.approval,
        "offered": link.verb in ctx.actions,
        "claim": live.claim_warning_held(held) if held else "",
        "error": error,
        "now": timezone.now(),
    }
    return render(request, TEMPLATE, context, status=422 if error else 200)


def _refused(request: HttpRequest, kind: str) -> HttpResponse:
    logger.warning(
        "mail link refused: %s, user=%s method=%s",
        kind,
        request.user.get_username() or "-",
        request.method,
    )
    return render(request, TEMPLATE, {"state": kind}, status=REFUSALS[kind])


urlpatterns = [path("mail/<str:token>/", mail_link, name="mail-link")]

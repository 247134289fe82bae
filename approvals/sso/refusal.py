"""The page that says why a sign-in was refused (registration/sso_refused.html)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils.translation import gettext_lazy as _

from approvals.sso import conf

REASONS = {
    "no_role": _(
        "Your account at %(provider)s is in no group that has a TaskPilots role, so you cannot "
        "sign in. Ask an admin to add you to the group for support, auditors or admins."
    ),
    "inactive": _("Your TaskPilots account is deactivated. Ask an admin."),
    "unverified": _("The sign-in could not be verified. Start again from the sign-in page."),
    "unreachable": _("%(provider)s did not answer. Try again in a few minutes."),
    "failed": _("The sign-in did not complete. Start again from the sign-in page."),
}


def refused(request: HttpRequest, reason: str, status: int = 403) -> HttpResponse:
    provider = conf.current().get("PROVIDER_NAME", "")
    why = REASONS.get(reason, REASONS["failed"]) % {"provider": provider}
    context = {"why": why, "reason": reason, "provider": provider}
    return render(request, "registration/sso_refused.html", context, status=status)

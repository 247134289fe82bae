"""The sign-in and callback endpoints, 404 while single sign-on is off, and the sign-out that
ends the provider's session too. The extra (approvals.sso.oidc) is imported at the first
request that needs it."""

from __future__ import annotations

import logging

from django.contrib.auth import views as auth_views
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.views.decorators.cache import never_cache

from approvals.sso import conf
from approvals.sso.refusal import refused

logger = logging.getLogger("taskpilots.console")


def _enabled() -> None:
    if not conf.enabled():
        raise Http404("single sign-on is off")


@never_cache
def sign_in(request: HttpRequest) -> HttpResponse:
    _enabled()
    from approvals.sso import oidc

    try:
        return oidc.SignInView.as_view()(request)
    except oidc.ProviderUnavailable:
        return refused(request, "unreachable", status=502)


@never_cache
def callback(request: HttpRequest) -> HttpResponse:
    _enabled()
    from approvals.sso import oidc

    return oidc.CallbackView.as_view()(request)


class SignOutView(auth_views.LogoutView):
    """Django's sign-out (POST), then, for a person signed in through the provider, the
    provider's end_session_endpoint with the ID token as hint, which comes back to the login
    page: the next sign-in asks for the person's credentials again, on a shared computer too.
    Without the provider (its discovery unreadable, no end_session_endpoint, or
    TASKPILOTS_OIDC_SIGN_OUT_AT_PROVIDER=0) the TaskPilots session ends all the same."""

    def post(self, request, *args, **kwargs):
        id_token = request.session.get("oidc_id_token", "")
        response = super().post(request, *args, **kwargs)
        sso = conf.current()
        if not (id_token and sso["ENABLED"] and sso.get("SIGN_OUT_AT_PROVIDER", True)):
            return response
        from approvals.sso import oidc

        try:
            url = oidc.end_session_url(id_token, request.build_absolute_uri(reverse("login")))
        except oidc.ProviderUnavailable as exc:
            logger.warning("sign-out: signed out here only, the provider did not answer: %s", exc)
            return response
        return HttpResponseRedirect(url) if url else response

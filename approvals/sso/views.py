"""The sign-in and callback endpoints, 404 while single sign-on is off. The extra
(approvals.sso.oidc) is imported at the first request."""

from __future__ import annotations

from django.http import Http404, HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache

from approvals.sso import conf
from approvals.sso.refusal import refused


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

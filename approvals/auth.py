"""Login with brute-force protection: after LOGIN_MAX_FAILURES failed attempts for one username
from one address within LOGIN_LOCKOUT_SECONDS, that pair is refused until the window passes.

Counts live in Django's cache. The default cache is per process; with several web processes,
configure a shared cache (database or Redis) so the limit holds across them.
"""

from __future__ import annotations

import hashlib
import logging

from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.core.cache import cache
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_POST

from approvals import viewer_time
from approvals.sso import conf as sso

logger = logging.getLogger("taskpilots.console")

LOGIN_MAX_FAILURES = 5
LOGIN_LOCKOUT_SECONDS = 15 * 60


def client_address(request: HttpRequest) -> str:
    # REMOTE_ADDR only: X-Forwarded-For is client-controlled unless a proxy rewrites it.
    return request.META.get("REMOTE_ADDR", "") or "unknown"


def _key(username: str, address: str) -> str:
    material = f"{username.strip().lower()}|{address}".encode()
    return "tp-login-failures:" + hashlib.sha256(material).hexdigest()


def failures(username: str, address: str) -> int:
    return cache.get(_key(username, address), 0)


def record_failure(username: str, address: str) -> int:
    key = _key(username, address)
    # add() starts the window; incr() keeps its expiry (the window does not slide).
    if cache.add(key, 1, LOGIN_LOCKOUT_SECONDS):
        return 1
    try:
        return cache.incr(key)
    except ValueError:  # expired between add and incr
        cache.add(key, 1, LOGIN_LOCKOUT_SECONDS)
        return 1


def clear_failures(username: str, address: str) -> None:
    cache.delete(_key(username, address))


@require_POST
@login_required
def set_time_zone(request: HttpRequest) -> HttpResponse:
    """The browser says its zone (static/js/console.js) when the session does not know it yet:
    a preference of the account, like the language, not a console action. 204, or 422 for a
    name Python does not know (the pages then stay in UTC)."""
    known = viewer_time.remember(request, request.POST.get("time_zone", ""))
    return HttpResponse(status=204 if known else 422)


class LockoutLoginView(auth_views.LoginView):
    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        settings = sso.current()
        context["sso"] = {
            "enabled": settings["ENABLED"],
            "provider": settings.get("PROVIDER_NAME", ""),
            "local_passwords": settings["LOCAL_PASSWORDS"],
        }
        return context

    def post(self, request, *args, **kwargs) -> HttpResponse:
        if not sso.local_passwords():
            # TASKPILOTS_LOCAL_PASSWORDS=0: no password signs anyone in (docs/deploy.md).
            logger.warning("password login refused: local passwords are off")
            context = self.get_context_data(form=self.get_form(), password_refused=True)
            return self.render_to_response(context, status=403)
        username = request.POST.get("username", "")[:150]
        address = client_address(request)
        if failures(username, address) >= LOGIN_MAX_FAILURES:
            logger.warning("login locked out: username=%r address=%s", username, address)
            form = self.get_form()
            context = self.get_context_data(form=form, locked_out=True)
            context["lockout_minutes"] = LOGIN_LOCKOUT_SECONDS // 60
            return self.render_to_response(context, status=429)
        return super().post(request, *args, **kwargs)

    def form_invalid(self, form):
        username = self.request.POST.get("username", "")[:150]
        address = client_address(self.request)
        count = record_failure(username, address)
        logger.warning("login failed: username=%r address=%s failures=%s", username, address, count)
        if count >= LOGIN_MAX_FAILURES:
            context = self.get_context_data(form=form, locked_out=True)
            context["lockout_minutes"] = LOGIN_LOCKOUT_SECONDS // 60
            return self.render_to_response(context, status=429)
        return super().form_invalid(form)

    def form_valid(self, form):
        clear_failures(form.get_user().get_username(), client_address(self.request))
        response = super().form_valid(form)
        # The browser's time zone, from the login form's hidden field (static/js/console.js).
        viewer_time.remember(self.request, self.request.POST.get("time_zone", ""))
        return response

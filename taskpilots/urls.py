from __future__ import annotations

from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

from approvals.auth import LockoutLoginView, set_time_zone
from approvals.metrics_views import prometheus
from approvals.slack_views import urlpatterns as slack_urlpatterns
from approvals.sso.views import SignOutView
from taskpilots import views
from taskpilots.api import api

urlpatterns = [
    path("", RedirectView.as_view(url="/console/", permanent=False)),
    # Browsers ask for /favicon.ico whatever the page's <link rel="icon"> says.
    path("favicon.ico", views.favicon),
    path("healthz", views.healthz, name="healthz"),
    path("metrics", prometheus, name="prometheus-metrics"),
    path("accounts/login/", LockoutLoginView.as_view(), name="login"),
    path("accounts/logout/", SignOutView.as_view(), name="logout"),
    path("accounts/time-zone/", set_time_zone, name="time-zone"),
    path("i18n/", include("django.conf.urls.i18n")),
    path("console/", include("approvals.urls")),
    path("admin/", admin.site.urls),
    path("api/v1/", api.urls),
    # Single sign-on (approvals/sso): 404 unless TASKPILOTS_OIDC_ISSUER is set.
    path("oidc/", include("approvals.sso.urls")),
]

# Slack's interactivity requests (Approve / Reject pressed on a queue's Slack message): signed by
# Slack, not a console page (no session, no CSRF token); approvals/slack_views.py.
urlpatterns += slack_urlpatterns

from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import path
from django.views.generic import RedirectView

from runs.api import api
from taskpilots import views

urlpatterns = [
    path("", RedirectView.as_view(url="/console/", permanent=False)),
    path("healthz", views.healthz, name="healthz"),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("console/", views.console_home, name="console-home"),
    path("admin/", admin.site.urls),
    path("api/v1/", api.urls),
]

from __future__ import annotations

from django.apps import AppConfig


class SsoConfig(AppConfig):
    name = "approvals.sso"
    label = "sso"
    verbose_name = "Single sign-on"

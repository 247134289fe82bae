"""Mounted at /oidc/ (taskpilots/urls.py) on every install; 404 while single sign-on is off.
The names are mozilla-django-oidc's, which it reverses."""

from __future__ import annotations

from django.urls import path

from approvals.sso import views

urlpatterns = [
    path("authenticate/", views.sign_in, name="oidc_authentication_init"),
    path("callback/", views.callback, name="oidc_authentication_callback"),
]

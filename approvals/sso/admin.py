from __future__ import annotations

from django.contrib import admin

from approvals.sso.models import OidcIdentity


@admin.register(OidcIdentity)
class OidcIdentityAdmin(admin.ModelAdmin):
    """Link an existing account to a person at the provider (their `sub`) before their first
    sign-in, or unlink one: sign-ins never match accounts by email."""

    list_display = ["user", "subject", "issuer", "created_at", "last_sign_in"]
    search_fields = ["user__username", "subject"]
    raw_id_fields = ["user"]
    readonly_fields = ["created_at", "last_sign_in"]

"""Admin for API clients: create (credentials shown once), revoke, rotate."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.template.response import TemplateResponse

from runs.api.models import ApiClient, ApiScope


class ApiClientForm(forms.ModelForm):
    scopes = forms.MultipleChoiceField(
        choices=ApiScope.choices, widget=forms.CheckboxSelectMultiple, required=False
    )

    class Meta:
        model = ApiClient
        fields = ["name", "description", "scopes"]


def _show_credentials(request, client, credentials, title):
    # The one place the credentials ever appear; they are not stored, not messaged, not logged.
    response = TemplateResponse(
        request,
        "api/client_credentials.html",
        {
            **admin.site.each_context(request),
            "title": title,
            "client": client,
            "credentials": credentials,
            "opts": ApiClient._meta,
        },
    )
    response["Cache-Control"] = "no-store"
    return response


@admin.register(ApiClient)
class ApiClientAdmin(admin.ModelAdmin):
    form = ApiClientForm
    list_display = ["name", "client_id", "scope_list", "created_at", "last_used_at", "revoked_at"]
    list_filter = [("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["name", "client_id"]
    readonly_fields = ["client_id", "created_by", "created_at", "last_used_at", "revoked_at"]
    actions = ["revoke_clients"]

    @admin.display(description="scopes")
    def scope_list(self, obj: ApiClient) -> str:
        return ", ".join(obj.scopes)

    def has_delete_permission(self, request, obj=None):
        # Timelines name clients; revoke instead of deleting.
        return False

    def save_model(self, request, obj, form, change):
        obj.scopes = ApiClient.clean_scopes(form.cleaned_data["scopes"])
        if not change:
            obj.created_by = request.user
            request._api_credentials = obj.rotate_credentials(save=False)
        obj.save()

    def response_add(self, request, obj, post_url_continue=None):
        credentials = getattr(request, "_api_credentials", None)
        if credentials is None:
            return super().response_add(request, obj, post_url_continue)
        return _show_credentials(request, obj, credentials, f"API client {obj.name} created")

    @admin.action(description="Revoke selected API clients")
    def revoke_clients(self, request, queryset):
        revoked = sum(client.revoke() for client in queryset)
        self.message_user(request, f"Revoked {revoked} API client(s).", messages.SUCCESS)

"""Admin for API clients: create (credentials shown once), revoke, rotate."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.template.response import TemplateResponse

from runs.api.models import ApiClient, ApiScope, PersonalToken


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


@admin.register(PersonalToken)
class PersonalTokenAdmin(admin.ModelAdmin):
    """People's tokens and delegations: seen and revoked here; created by their person in the
    console (or with `manage.py create_personal_token`), where the secret is shown once."""

    list_display = ["token_id", "user", "kind", "client", "name", "expires_at", "revoked_at"]
    list_filter = ["kind", ("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["token_id", "user__username", "name"]
    readonly_fields = [f.name for f in PersonalToken._meta.fields if f.name != "secret_hash"]
    exclude = ["secret_hash"]
    actions = ["revoke_tokens"]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.action(description="Revoke selected tokens")
    def revoke_tokens(self, request, queryset):
        revoked = sum(token.revoke() for token in queryset)
        self.message_user(request, f"Revoked {revoked} token(s).", messages.SUCCESS)

"""A person's API credentials in the console: their personal tokens and the delegations they
gave integrations (runs.api.models.PersonalToken). Create one (its secret is shown once, on the
answer to the POST, never stored), see when each was last used, revoke one.

The page also lists the Slack accounts linked to the person, each with Unlink
(approvals/slack_link.py).

Everyone with a console role has this page for themselves; the scopes on offer are what their
role allows (approvals.permissions.api_scopes), and a token only ever acts within the role its
person holds at the time of each call.
"""

from __future__ import annotations

from datetime import timedelta

from django import forms
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import path
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST

from approvals.models import SlackIdentity
from approvals.permissions import READ, api_scopes, can_act, require_role
from runs.api.models import (
    DELEGATION_MAX_MINUTES,
    PERSONAL_TOKEN_DAYS,
    PERSONAL_TOKEN_MAX_DAYS,
    ApiClient,
    ApiScope,
    PersonalToken,
)
from runs.invisible import neutralise

DAYS = [(7, 7), (30, 30), (PERSONAL_TOKEN_DAYS, PERSONAL_TOKEN_DAYS), (365, 365)]
MINUTES = [(5, 5), (15, 15), (30, 30), (DELEGATION_MAX_MINUTES, DELEGATION_MAX_MINUTES)]


class _Scopes(forms.MultipleChoiceField):
    widget = forms.CheckboxSelectMultiple


class TokenForm(forms.Form):
    name = forms.CharField(
        label=gettext_lazy("What it is for"),
        max_length=100,
        help_text=gettext_lazy("e.g. “approvals from my scripts”"),
    )
    scopes = _Scopes(label=gettext_lazy("What it may do"))
    days = forms.TypedChoiceField(
        label=gettext_lazy("Expires in (days)"),
        choices=DAYS,
        coerce=int,
        initial=PERSONAL_TOKEN_DAYS,
    )

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["scopes"].choices = _scope_choices(user)

    def clean_name(self) -> str:
        name = self.cleaned_data["name"].strip()
        if neutralise(name) != name or "\x00" in name:
            raise forms.ValidationError(_("Use visible characters only."))
        if not name:
            raise forms.ValidationError(_("Say what the token is for."))
        return name

    def clean_days(self) -> int:
        days = self.cleaned_data["days"]
        if not 1 <= days <= PERSONAL_TOKEN_MAX_DAYS:
            raise forms.ValidationError(_("Choose one of the durations offered."))
        return days


class DelegationForm(forms.Form):
    client = forms.ModelChoiceField(
        label=gettext_lazy("Integration (API client)"),
        queryset=ApiClient.objects.none(),
        to_field_name="name",
    )
    scopes = _Scopes(label=gettext_lazy("What it may do for you"))
    minutes = forms.TypedChoiceField(
        label=gettext_lazy("For (minutes)"), choices=MINUTES, coerce=int, initial=15
    )

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["client"].queryset = ApiClient.objects.active().order_by("name")
        self.fields["scopes"].choices = _scope_choices(user)

    def clean(self):
        data = super().clean()
        client, scopes = data.get("client"), data.get("scopes") or []
        if client is not None:
            beyond = [s for s in scopes if not client.has_scope(s)]
            if beyond:
                self.add_error(
                    "scopes",
                    _("%(client)s does not hold %(scopes)s itself.")
                    % {"client": client.name, "scopes": ", ".join(beyond)},
                )
        return data


def _scope_choices(user) -> list[tuple[str, str]]:
    allowed = api_scopes(user)
    return [(value, label) for value, label in ApiScope.choices if value in allowed]


def _page(request, *, token_form=None, delegation_form=None, issued=None, status=200):
    tokens = (
        PersonalToken.objects.filter(user=request.user)
        .select_related("client")
        .order_by("-created_at")[:200]
    )
    context = {
        "tokens": tokens,
        "now": timezone.now(),
        "token_form": token_form or TokenForm(user=request.user),
        "delegation_form": delegation_form or DelegationForm(user=request.user),
        "issued": issued,
        # Their Slack links, each with Unlink (approvals/slack_link.py).
        "slack_identities": SlackIdentity.objects.filter(user=request.user).order_by("linked_at"),
        "may_decide": can_act(request.user),
    }
    response = render(request, "console/tokens.html", context, status=status)
    response["Cache-Control"] = "no-store"  # the issued secret must not be kept anywhere
    return response


@require_http_methods(["GET", "POST"])
@never_cache
@require_role(READ)
def tokens(request: HttpRequest) -> HttpResponse:
    if request.method == "GET":
        return _page(request)
    if request.POST.get("kind") == "delegation":
        form = DelegationForm(request.POST, user=request.user)
        if not form.is_valid():
            return _page(request, delegation_form=form, status=422)
        expires_at = timezone.now() + timedelta(minutes=form.cleaned_data["minutes"])
        client = form.cleaned_data["client"]
        token, issued = PersonalToken.issue(
            request.user,
            f"delegation to {client.name}",
            form.cleaned_data["scopes"],
            created_by=request.user,
            expires_at=expires_at,
            client=client,
        )
        return _page(request, issued={"token": token, "secret": issued.token}, status=201)
    form = TokenForm(request.POST, user=request.user)
    if not form.is_valid():
        return _page(request, token_form=form, status=422)
    token, issued = PersonalToken.issue(
        request.user,
        form.cleaned_data["name"],
        form.cleaned_data["scopes"],
        created_by=request.user,
        expires_at=timezone.now() + timedelta(days=form.cleaned_data["days"]),
    )
    return _page(request, issued={"token": token, "secret": issued.token}, status=201)


@require_POST
@require_role(READ)
def revoke_token(request: HttpRequest, token_id: str) -> HttpResponse:
    token = get_object_or_404(PersonalToken, token_id=token_id, user=request.user)
    token.revoke()
    return redirect("console:tokens")


urlpatterns = [
    path("tokens/", tokens, name="tokens"),
    path("tokens/<slug:token_id>/revoke/", revoke_token, name="token-revoke"),
]

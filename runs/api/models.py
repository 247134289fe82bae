"""Who calls the HTTP API: API clients (agents and external systems) and people.

People authenticate with personal API tokens (`PersonalToken`, below): bound to a user, scoped,
revocable, shown once, stored hashed. An integration acts for a person only through a
delegation that person issued to it: a short-lived token bound to both the person and the
client, which the client presents beside its own credentials. A name in a request body is never
an identity (docs/api.md, "People").

API clients:

A client holds two credentials, both shown once when it is created:

- the API token `<client_id>.<secret>` for `Authorization: Bearer …`. Only SHA-256 of the secret
  is stored. The secret is 256 random bits, so a fast hash is already preimage-resistant; a slow
  password hash would only protect low-entropy passwords and cost every request ~100 ms.
- the webhook signing secret for HMAC-SHA256 signatures on event callbacks. The server must hold
  a key it can recompute to verify an HMAC, so this secret is never stored at all: it is derived
  with Django's `salted_hmac` from SECRET_KEY and the client's random `signing_salt`
  (SECRET_KEY_FALLBACKS are accepted while a key rotation is under way). Rotating it means a new
  salt. `signing_version` says which derivation a client's secret came from: clients issued
  before `salted_hmac` (version 1) keep theirs until their credentials are rotated.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone
from django.utils.crypto import salted_hmac
from django.utils.translation import gettext_lazy


class ApiScope(models.TextChoices):
    RUNS_READ = "runs:read", gettext_lazy("Read runs")
    RUNS_WRITE = "runs:write", gettext_lazy("Start and cancel runs")
    EVENTS_WRITE = "events:write", gettext_lazy("Deliver events")
    APPROVALS_WRITE = (
        "approvals:write",
        gettext_lazy("Act as a person: decide approvals, settle outcomes, bulk actions"),
    )


def _hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


# Which derivation made a client's signing secret (ApiClient.signing_version).
LEGACY_SIGNING_VERSION = 1  # HMAC-SHA256(key, "taskpilots.webhook:<client_id>:<salt>")
SIGNING_VERSION = 2  # salted_hmac("taskpilots.webhook", "<client_id>:<salt>", key, SHA-256)


def _derive_signing_secret(key: str, client_id: str, salt: str, version: int) -> str:
    if version == LEGACY_SIGNING_VERSION:
        material = f"taskpilots.webhook:{client_id}:{salt}".encode()
        return "whsec_" + hmac.new(key.encode(), material, hashlib.sha256).hexdigest()
    mac = salted_hmac("taskpilots.webhook", f"{client_id}:{salt}", key, algorithm="sha256")
    return "whsec_" + mac.hexdigest()


@dataclass(frozen=True)
class IssuedCredentials:
    client_id: str
    token: str
    signing_secret: str


class Credential:
    """What an API client and a person's token share: a hashed secret, compared in constant
    time; revoking (once: a repeated call changes nothing); the time of last use."""

    secret_hash: str
    revoked_at: Any
    last_used_at: Any
    scopes: Any

    def check_secret(self, secret: str) -> bool:
        return hmac.compare_digest(_hash_secret(secret), self.secret_hash)

    def has_scope(self, scope: str) -> bool:
        return scope in (self.scopes or [])

    def revoke(self) -> bool:
        """Revoke it; returns False when it already was."""
        now = timezone.now()
        rows = type(self)._default_manager.filter(pk=self.pk, revoked_at__isnull=True)
        count = rows.update(revoked_at=now)
        if count:
            self.revoked_at = now
        return bool(count)

    def touch(self) -> None:
        """Record use at most once a minute (no write per request)."""
        now = timezone.now()
        if self.last_used_at is None or (now - self.last_used_at).total_seconds() > 60:
            type(self)._default_manager.filter(pk=self.pk).update(last_used_at=now)
            self.last_used_at = now


class ApiClientQuerySet(models.QuerySet):
    def active(self):
        return self.filter(revoked_at__isnull=True)


class ApiClient(Credential, models.Model):
    Scope = ApiScope

    name = models.SlugField(max_length=100, unique=True)
    client_id = models.CharField(max_length=40, unique=True, editable=False)
    secret_hash = models.CharField(max_length=64, editable=False)
    signing_salt = models.CharField(max_length=64, editable=False)
    signing_version = models.PositiveSmallIntegerField(default=SIGNING_VERSION, editable=False)
    scopes = models.JSONField(default=list, blank=True)
    description = models.CharField(max_length=500, blank=True, default="")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    created_at = models.DateTimeField(default=timezone.now)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    objects = ApiClientQuerySet.as_manager()

    class Meta:
        verbose_name = "API client"
        constraints = [
            models.CheckConstraint(
                condition=~Q(client_id="") & ~Q(secret_hash=""), name="api_client_has_credentials"
            )
        ]

    def __str__(self) -> str:
        state = "revoked" if self.revoked_at else ", ".join(self.scopes) or "no scopes"
        return f"{self.name} ({state})"

    @property
    def actor(self) -> str:
        """How the client's calls appear on run timelines."""
        return f"api:{self.name}"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None

    @staticmethod
    def clean_scopes(scopes) -> list[str]:
        """Normalise a scope list; unknown names are an error, not silently ignored."""
        wanted = sorted({s.strip() for s in scopes if s and s.strip()})
        unknown = [s for s in wanted if s not in ApiScope.values]
        if unknown:
            raise ValueError(
                f"unknown scope(s) {', '.join(unknown)}; choose from {', '.join(ApiScope.values)}"
            )
        return wanted

    # -- credentials -----------------------------------------------------------------------
    @classmethod
    def issue(cls, name: str, scopes, *, description: str = "", created_by=None):
        """Create a client and return (client, credentials); the credentials are never stored."""
        client = cls(
            name=name,
            scopes=cls.clean_scopes(scopes),
            description=description,
            created_by=created_by,
        )
        credentials = client.rotate_credentials(save=False)
        client.save()
        return client, credentials

    def rotate_credentials(self, *, save: bool = True) -> IssuedCredentials:
        """New secret and signing salt (old ones stop working at once)."""
        if not self.client_id:
            self.client_id = "tpc_" + secrets.token_hex(8)
        secret = secrets.token_urlsafe(32)
        self.secret_hash = _hash_secret(secret)
        self.signing_salt = secrets.token_hex(16)
        self.signing_version = SIGNING_VERSION
        if save:
            self.save(update_fields=["client_id", "secret_hash", "signing_salt", "signing_version"])
        return IssuedCredentials(
            client_id=self.client_id,
            token=f"{self.client_id}.{secret}",
            signing_secret=self.signing_secrets()[0],
        )

    def signing_secrets(self) -> list[str]:
        """The current signing secret first, then those under SECRET_KEY_FALLBACKS."""
        keys = [settings.SECRET_KEY, *getattr(settings, "SECRET_KEY_FALLBACKS", [])]
        return [
            _derive_signing_secret(key, self.client_id, self.signing_salt, self.signing_version)
            for key in keys
        ]


# --------------------------------------------------------------------------------------------
# People: personal tokens and delegations

# A personal token lives this many days unless its creator says otherwise (at most the max).
PERSONAL_TOKEN_DAYS = 90
PERSONAL_TOKEN_MAX_DAYS = 365
# A delegation to an integration lives minutes, not days: long enough for one conversation.
DELEGATION_MINUTES = 15
DELEGATION_MAX_MINUTES = 60


class TokenKind(models.TextChoices):
    PERSONAL = "personal", "Personal token"
    DELEGATION = "delegation", "Delegation to an integration"


@dataclass(frozen=True)
class IssuedToken:
    token_id: str
    token: str  # `<token_id>.<secret>`: shown once, never stored
    expires_at: object


class PersonalTokenQuerySet(models.QuerySet):
    def usable(self):
        """Neither revoked nor expired, of an active user."""
        return self.filter(revoked_at__isnull=True, user__is_active=True).filter(
            Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now())
        )


class PersonalToken(Credential, models.Model):
    """A person's API credential. `personal`: the person's own (`tpu_…`), sent as the bearer
    token. `delegation`: issued by the person to one API client (`tpd_…`), which sends it in
    `X-TaskPilots-On-Behalf-Of` beside its own bearer token; it expires within the hour."""

    Kind = TokenKind

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    kind = models.CharField(max_length=20, choices=Kind.choices, default=Kind.PERSONAL)
    # A delegation's integration: only this client may present it.
    client = models.ForeignKey(
        ApiClient, null=True, blank=True, on_delete=models.CASCADE, related_name="delegations"
    )
    name = models.CharField(max_length=100)
    token_id = models.CharField(max_length=40, unique=True, editable=False)
    secret_hash = models.CharField(max_length=64, editable=False)
    scopes = models.JSONField(default=list, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    objects = PersonalTokenQuerySet.as_manager()

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=~Q(token_id="") & ~Q(secret_hash=""), name="token_has_credentials"
            ),
            models.CheckConstraint(condition=Q(kind__in=TokenKind.values), name="token_kind_valid"),
            # A delegation names its client and expires; a personal token names no client.
            models.CheckConstraint(
                condition=(
                    Q(kind="delegation", client__isnull=False, expires_at__isnull=False)
                    | Q(kind="personal", client__isnull=True)
                ),
                name="token_delegation_bound",
            ),
        ]
        indexes = [models.Index(fields=["user", "-created_at"], name="token_user_idx")]

    def __str__(self) -> str:
        return f"{self.token_id} ({self.user}, {self.get_kind_display().lower()})"

    @property
    def prefix(self) -> str:
        return "tpd_" if self.kind == TokenKind.DELEGATION else "tpu_"

    @property
    def is_usable(self) -> bool:
        now = timezone.now()
        return (
            self.revoked_at is None
            and (self.expires_at is None or self.expires_at > now)
            and self.user.is_active
        )

    @classmethod
    def issue(
        cls,
        user,
        name: str,
        scopes,
        *,
        created_by=None,
        expires_at=None,
        client: ApiClient | None = None,
    ) -> tuple[PersonalToken, IssuedToken]:
        """A new token (a delegation when `client` is given); its secret is returned once."""
        kind = TokenKind.DELEGATION if client is not None else TokenKind.PERSONAL
        token = cls(
            user=user,
            kind=kind,
            client=client,
            name=name[:100],
            scopes=ApiClient.clean_scopes(scopes),
            created_by=created_by,
            expires_at=expires_at,
        )
        token.token_id = token.prefix + secrets.token_hex(8)
        secret = secrets.token_urlsafe(32)
        token.secret_hash = _hash_secret(secret)
        token.save()
        return token, IssuedToken(token.token_id, f"{token.token_id}.{secret}", expires_at)

from __future__ import annotations

from django.conf import settings
from django.db import models


class OidcIdentity(models.Model):
    """Who a TaskPilots user is at an OpenID provider: the ID token's `iss` and `sub`, which the
    provider never reassigns. A sign-in finds its user by these alone, never by an email or a
    username that someone could set at the provider to take another person's account."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="oidc_identities"
    )
    issuer = models.CharField(max_length=255)
    subject = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)
    last_sign_in = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "OIDC identity"
        verbose_name_plural = "OIDC identities"
        constraints = [
            models.UniqueConstraint(fields=["issuer", "subject"], name="sso_identity_unique")
        ]

    def __str__(self) -> str:
        return f"{self.subject} at {self.issuer}"

"""mozilla-django-oidc, configured from `settings.TASKPILOTS_SSO` (approvals.sso.conf): the
backend that maps groups to roles, the sign-in and callback views, the session refresh.

Imported only when single sign-on is on (the `oidc` extra). Nothing here talks to the provider
when a process starts or a signed-in page is served: the discovery document is fetched at the
first sign-in (or renewal) and kept for the process's life.

Beyond the library: the ID token's `iss` must be the configured issuer and its `aud` must name
this client; the userinfo answer must be about the same `sub`; users are found by (`iss`,
`sub`) only; and a person with no mapped group is refused, with their old roles taken away.
"""

from __future__ import annotations

import functools
import logging
import re
from urllib.parse import urlencode

import jwt
import requests
from django.contrib import auth
from django.contrib.auth import get_user_model
from django.core.exceptions import SuspiciousOperation
from django.db import transaction
from django.http import HttpResponse
from django.utils import timezone
from django.utils.deprecation import MiddlewareMixin
from django.views.generic import View
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.middleware import SessionRefresh as LibrarySessionRefresh
from mozilla_django_oidc.utils import import_from_settings
from mozilla_django_oidc.views import (
    OIDCAuthenticationCallbackView,
    OIDCAuthenticationRequestView,
)

from approvals.sso import conf, roles
from approvals.sso.models import OidcIdentity
from approvals.sso.refusal import refused

logger = logging.getLogger("taskpilots.console")

DISCOVERY_FIELDS = {
    "authorization": "authorization_endpoint",
    "token": "token_endpoint",
    "userinfo": "userinfo_endpoint",
    "jwks": "jwks_uri",
}


class ProviderUnavailable(Exception):
    """The provider's discovery document could not be read (or was not the issuer's)."""


@functools.lru_cache(maxsize=4)
def _discovery(issuer: str, timeout: int) -> dict:
    # A failure is not cached: the next sign-in asks again.
    try:
        response = requests.get(f"{issuer}/.well-known/openid-configuration", timeout=timeout)
        response.raise_for_status()
        document = response.json()
    except (requests.RequestException, ValueError) as exc:
        raise ProviderUnavailable(f"{issuer}: discovery failed: {exc}") from exc
    if str(document.get("issuer", "")).rstrip("/") != issuer:
        raise ProviderUnavailable(f"{issuer}: the discovery document names another issuer")
    return document


def end_session_url(id_token: str, after: str) -> str:
    """Where the browser goes to end the person's session at the provider too (OpenID Connect
    RP-Initiated Logout 1.0), coming back to `after`; "" when the provider offers no
    end_session_endpoint. ProviderUnavailable when its discovery cannot be read."""
    sso = conf.current()
    url = sso["ENDPOINTS"].get("end_session") or _discovery(sso["ISSUER"], sso["TIMEOUT"]).get(
        "end_session_endpoint", ""
    )
    if not url:
        return ""
    query = urlencode(
        {
            "id_token_hint": id_token,
            "post_logout_redirect_uri": after,
            "client_id": sso["CLIENT_ID"],
        }
    )
    return f"{url}{'&' if '?' in url else '?'}{query}"


def endpoint(name: str) -> str:
    sso = conf.current()
    if name in sso["ENDPOINTS"]:
        return sso["ENDPOINTS"][name]
    value = _discovery(sso["ISSUER"], sso["TIMEOUT"]).get(DISCOVERY_FIELDS[name])
    if not value:
        raise ProviderUnavailable(f"{sso['ISSUER']}: discovery gives no {DISCOVERY_FIELDS[name]}")
    return value


_FROM_SSO = {
    "OIDC_RP_CLIENT_ID": lambda sso: sso["CLIENT_ID"],
    "OIDC_RP_CLIENT_SECRET": lambda sso: sso["CLIENT_SECRET"],
    "OIDC_RP_SIGN_ALGO": lambda sso: sso["SIGN_ALGO"],
    "OIDC_RP_SCOPES": lambda sso: sso["SCOPES"],
    "OIDC_TIMEOUT": lambda sso: sso["TIMEOUT"],
    "OIDC_RENEW_ID_TOKEN_EXPIRY_SECONDS": lambda sso: sso["RENEW_SECONDS"],
    "OIDC_OP_AUTHORIZATION_ENDPOINT": lambda sso: endpoint("authorization"),
    "OIDC_OP_TOKEN_ENDPOINT": lambda sso: endpoint("token"),
    "OIDC_OP_USER_ENDPOINT": lambda sso: endpoint("userinfo"),
    "OIDC_OP_JWKS_ENDPOINT": lambda sso: endpoint("jwks"),
}
_FIXED = {
    # client_secret_basic: the token endpoint authentication every provider must support.
    "OIDC_TOKEN_USE_BASIC_AUTH": True,
    "OIDC_USE_PKCE": True,
    "OIDC_USE_NONCE": True,
    "OIDC_ALLOW_UNSECURED_JWT": False,
    "OIDC_RP_IDP_SIGN_KEY": None,
    "OIDC_CREATE_USER": True,
    # Kept in the session for one use: the id_token_hint of the provider's sign-out.
    "OIDC_STORE_ID_TOKEN": True,
    "OIDC_EXEMPT_URLS": [re.compile(pattern) for pattern in conf.EXEMPT_PATHS],
}


def oidc_setting(attr: str, *default):
    """The library's `get_settings`: its OIDC_* settings from TASKPILOTS_SSO."""
    if attr in _FROM_SSO:
        return _FROM_SSO[attr](conf.current())
    if attr in _FIXED:
        return _FIXED[attr]
    return import_from_settings(attr, *default)


def _setting(attr: str) -> property:
    return property(lambda self: oidc_setting(attr))


class RoleMappingBackend(OIDCAuthenticationBackend):
    get_settings = staticmethod(oidc_setting)
    # Read when used, not when Django builds the backend (at every request of a signed-in
    # person): serving a page never waits for the provider.
    OIDC_OP_TOKEN_ENDPOINT = _setting("OIDC_OP_TOKEN_ENDPOINT")
    OIDC_OP_USER_ENDPOINT = _setting("OIDC_OP_USER_ENDPOINT")
    OIDC_OP_JWKS_ENDPOINT = _setting("OIDC_OP_JWKS_ENDPOINT")
    OIDC_RP_CLIENT_ID = _setting("OIDC_RP_CLIENT_ID")
    OIDC_RP_CLIENT_SECRET = _setting("OIDC_RP_CLIENT_SECRET")
    OIDC_RP_SIGN_ALGO = _setting("OIDC_RP_SIGN_ALGO")
    OIDC_RP_IDP_SIGN_KEY = None

    def __init__(self, *args, **kwargs):
        self.UserModel = get_user_model()

    def authenticate(self, request, **kwargs):
        # Only the callback view signs in through here (it always passes the nonce it kept);
        # a password form is never mistaken for a callback by its query string.
        if kwargs.get("nonce") is None or set(kwargs) - {"nonce", "code_verifier"}:
            return None
        return super().authenticate(request, **kwargs)

    def verify_token(self, token, **kwargs):
        try:
            header = jwt.get_unverified_header(token)
            if header.get("alg") != self.OIDC_RP_SIGN_ALGO:
                raise SuspiciousOperation("The token's algorithm does not match the client's.")
            payload = super().verify_token(token, **kwargs)  # the signature (JWKS), exp, nonce
        except (jwt.PyJWTError, KeyError, ValueError) as exc:
            # Expired, malformed, or no key id: the library lets these through as errors.
            raise SuspiciousOperation(f"The token is not valid: {exc!r}") from exc
        sso = conf.current()
        if str(payload.get("iss", "")).rstrip("/") != sso["ISSUER"]:
            raise SuspiciousOperation("The ID token comes from another issuer.")
        audience = payload.get("aud")
        audiences = [audience] if isinstance(audience, str) else list(audience or [])
        if sso["CLIENT_ID"] not in audiences:
            raise SuspiciousOperation("The ID token is for another client.")
        if len(audiences) > 1 and payload.get("azp") != sso["CLIENT_ID"]:
            raise SuspiciousOperation("The ID token was issued to another party.")
        if "exp" not in payload or not payload.get("sub"):
            raise SuspiciousOperation("The ID token has no expiry or no subject.")
        return payload

    def get_or_create_user(self, access_token, id_token, payload):
        userinfo = self.get_userinfo(access_token, id_token, payload)
        if userinfo.get("sub") != payload["sub"]:
            raise SuspiciousOperation("The userinfo answer is about another subject.")
        claims = {**payload, **userinfo}
        sso = conf.current()
        granted = roles.claimed_roles(claims, sso["ROLES_CLAIM"], sso["ROLES"])
        user = self._sign_in(sso["ISSUER"], payload["sub"], claims, granted)
        if user is None or not granted:
            self._refuse("no_role", claims)
            return None
        if not user.is_active:
            self._refuse("inactive", claims)
            return None
        return user

    def _sign_in(self, issuer: str, subject: str, claims: dict, granted: set[str]):
        """The person's user (made at their first sign-in with a role), with their roles set
        from this sign-in's claims; None for a newcomer with no role (no account is made)."""
        with transaction.atomic():
            identity = (
                OidcIdentity.objects.select_for_update()
                .select_related("user")
                .filter(issuer=issuer, subject=subject)
                .first()
            )
            if identity is None:
                if not granted:
                    return None
                user = self.UserModel.objects.create_user(roles.new_username(claims, subject))
                identity = OidcIdentity.objects.create(user=user, issuer=issuer, subject=subject)
                logger.info("sign-in: new user=%s for sub=%s", user.get_username(), subject)
            user = identity.user
            self.update_user(user, claims)
            roles.set_roles(user, granted)
            identity.last_sign_in = timezone.now()
            identity.save(update_fields=["last_sign_in"])
        return user

    def update_user(self, user, claims):
        fields = {
            "email": claims.get("email") or "",
            "first_name": (claims.get("given_name") or "")[:150],
            "last_name": (claims.get("family_name") or "")[:150],
        }
        changed = [name for name, value in fields.items() if getattr(user, name) != value]
        for name in changed:
            setattr(user, name, fields[name])
        if changed:
            user.save(update_fields=changed)
        return user

    def filter_users_by_claims(self, claims):
        """Never by email (the library's default): only the stored (iss, sub) finds a user."""
        return self.UserModel.objects.filter(
            oidc_identities__issuer=conf.current()["ISSUER"],
            oidc_identities__subject=claims.get("sub") or "",
        )

    def _refuse(self, reason: str, claims: dict) -> None:
        logger.warning(
            "sign-in refused: sub=%s username=%r reason=%s",
            claims.get("sub"),
            claims.get("preferred_username") or claims.get("email"),
            reason,
        )
        self.request.sso_refusal = reason


class SignInView(OIDCAuthenticationRequestView):
    """/oidc/authenticate/: off to the provider's authorization endpoint (with PKCE)."""

    get_settings = staticmethod(oidc_setting)
    OIDC_OP_AUTH_ENDPOINT = _setting("OIDC_OP_AUTHORIZATION_ENDPOINT")
    OIDC_RP_CLIENT_ID = _setting("OIDC_RP_CLIENT_ID")

    def __init__(self, **kwargs):
        View.__init__(self, **kwargs)


class CallbackView(OIDCAuthenticationCallbackView):
    """/oidc/callback/: the code for tokens, the tokens checked, the person signed in."""

    get_settings = staticmethod(oidc_setting)

    def get(self, request):
        try:
            return super().get(request)
        except SuspiciousOperation as exc:
            logger.warning("sign-in refused: reason=unverified detail=%s", exc)
            return self._failed("unverified", status=400)
        except (requests.RequestException, ProviderUnavailable) as exc:
            logger.error("sign-in failed: the provider did not answer: %s", exc)
            return self._failed("unreachable", status=502)

    def login_failure(self):
        return self._failed(getattr(self.request, "sso_refusal", "failed"))

    def _failed(self, reason: str, status: int = 403):
        """Whoever was signed in in this browser (a renewal that failed) is not any more."""
        if self.request.user.is_authenticated:
            auth.logout(self.request)
        return refused(self.request, reason, status=status)


class SessionRefresh(LibrarySessionRefresh):
    """Every OIDC_RENEW seconds, a signed-in person's next page goes by the provider again
    (`prompt=none`: no page if their session there is alive), so their roles follow the
    provider's groups during a session too. The API, /healthz, /metrics and the sign-in pages
    are exempt (conf.EXEMPT_PATHS); an htmx request that is due reloads its page instead."""

    get_settings = staticmethod(oidc_setting)
    OIDC_EXEMPT_URLS = _FIXED["OIDC_EXEMPT_URLS"]
    OIDC_OP_AUTHORIZATION_ENDPOINT = _setting("OIDC_OP_AUTHORIZATION_ENDPOINT")
    OIDC_RP_CLIENT_ID = _setting("OIDC_RP_CLIENT_ID")
    OIDC_RP_SCOPES = _setting("OIDC_RP_SCOPES")
    OIDC_STATE_SIZE = 32
    OIDC_NONCE_SIZE = 32
    OIDC_USE_NONCE = True
    OIDC_AUTHENTICATION_CALLBACK_URL = "oidc_authentication_callback"
    # Every exemption is a pattern (the library's named ones include a logout view not served
    # here; /oidc/ is among the patterns).
    exempt_urls = frozenset()

    def __init__(self, get_response):
        MiddlewareMixin.__init__(self, get_response)

    def process_request(self, request):
        if not conf.enabled() or not self.is_refreshable_url(request):
            return None
        if getattr(request, "htmx", False):
            # A fragment cannot follow the provider's pages: the whole page goes instead.
            due = self._due(request)
            return HttpResponse(status=204, headers={"HX-Refresh": "true"}) if due else None
        try:
            return super().process_request(request)
        except ProviderUnavailable as exc:
            logger.error("session renewal failed: the provider did not answer: %s", exc)
            return refused(request, "unreachable", status=502)

    @staticmethod
    def _due(request) -> bool:
        return request.session.get("oidc_id_token_expiration", 0) <= timezone.now().timestamp()

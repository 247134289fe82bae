"""Single sign-on's settings, read from the environment by taskpilots/settings.py into
`settings.TASKPILOTS_SSO`, and read back from there at every request (so tests can override
them). Nothing here imports the `oidc` extra: every install reads this module.

Off unless TASKPILOTS_OIDC_ISSUER is set. With it, the client's id and secret and the role
mapping are required; the endpoints come from the issuer's discovery document unless given.
TASKPILOTS_LOCAL_PASSWORDS=0 turns password sign-in off altogether (it needs single sign-on on).
"""

from __future__ import annotations

import importlib.util
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from taskpilots.env import env_bool, env_int, env_secret, env_str

# The console roles (approvals.permissions; not imported here: settings read this module).
ROLE_NAMES = ("support", "auditor", "admin")
ENDPOINTS = {
    "authorization": "TASKPILOTS_OIDC_AUTHORIZATION_ENDPOINT",
    "token": "TASKPILOTS_OIDC_TOKEN_ENDPOINT",
    "userinfo": "TASKPILOTS_OIDC_USERINFO_ENDPOINT",
    "jwks": "TASKPILOTS_OIDC_JWKS_URI",
    "end_session": "TASKPILOTS_OIDC_END_SESSION_ENDPOINT",
}
SIGN_ALGORITHMS = ("RS256", "RS384", "RS512", "ES256", "ES384", "ES512")
PASSWORD_BACKEND = "django.contrib.auth.backends.ModelBackend"
OIDC_BACKEND = "approvals.sso.oidc.RoleMappingBackend"
OIDC_MIDDLEWARE = "approvals.sso.oidc.SessionRefresh"
# Never sent to the provider for a silent renewal: bearer-token and machine endpoints, the
# sign-out and language forms, static files.
EXEMPT_PATHS = (
    r"^/api/",
    r"^/healthz$",
    r"^/metrics$",
    r"^/static/",
    r"^/favicon\.ico$",
    r"^/accounts/",
    r"^/i18n/",
    r"^/oidc/",
)

OFF = {"ENABLED": False, "LOCAL_PASSWORDS": True}


def parse_roles(text: str, name: str = "TASKPILOTS_OIDC_ROLES") -> dict[str, str]:
    """`group=role,group=role` as {group: role}; a group may be named once, a role many times."""
    mapping: dict[str, str] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        group, _, role = item.rpartition("=")
        group, role = group.strip(), role.strip()
        if not group or role not in ROLE_NAMES:
            raise ImproperlyConfigured(
                f"{name}: {item!r} is not group=role with a role among {', '.join(ROLE_NAMES)} "
                "(e.g. tp-support=support,tp-auditors=auditor,tp-admins=admin)"
            )
        if mapping.get(group, role) != role:
            raise ImproperlyConfigured(f"{name}: the group {group!r} is mapped twice")
        mapping[group] = role
    return mapping


def _required(name: str) -> str:
    value = (env_secret(name) or "").strip()
    if not value:
        raise ImproperlyConfigured(f"{name} is required when TASKPILOTS_OIDC_ISSUER is set")
    return value


def from_environment() -> dict:
    local_passwords = env_bool("TASKPILOTS_LOCAL_PASSWORDS", True)
    issuer = (env_str("TASKPILOTS_OIDC_ISSUER") or "").strip().rstrip("/")
    explicit = {key: (env_str(var) or "").strip() for key, var in ENDPOINTS.items()}
    if not issuer:
        if any(explicit.values()):
            raise ImproperlyConfigured(
                "The OIDC endpoints are set but TASKPILOTS_OIDC_ISSUER is not: set the issuer "
                "too (the ID token's `iss` is checked against it)"
            )
        if not local_passwords:
            raise ImproperlyConfigured(
                "TASKPILOTS_LOCAL_PASSWORDS=0 needs single sign-on (TASKPILOTS_OIDC_ISSUER): "
                "otherwise nobody could sign in"
            )
        return dict(OFF)
    if urlsplit(issuer).scheme not in ("https", "http"):
        raise ImproperlyConfigured(f"TASKPILOTS_OIDC_ISSUER={issuer!r} is not an http(s) URL")
    if importlib.util.find_spec("mozilla_django_oidc") is None:
        raise ImproperlyConfigured(
            "TASKPILOTS_OIDC_ISSUER is set but single sign-on is not installed: "
            "pip install -c constraints.txt 'taskpilots[oidc]'"
        )
    roles = parse_roles(_required("TASKPILOTS_OIDC_ROLES"))
    algorithm = (env_str("TASKPILOTS_OIDC_SIGN_ALGO") or "").strip() or "RS256"
    if algorithm not in SIGN_ALGORITHMS:
        raise ImproperlyConfigured(
            f"TASKPILOTS_OIDC_SIGN_ALGO={algorithm!r}: one of {', '.join(SIGN_ALGORITHMS)} "
            "(ID tokens are checked against the provider's JWKS)"
        )
    return {
        "ENABLED": True,
        "LOCAL_PASSWORDS": local_passwords,
        "ISSUER": issuer,
        "CLIENT_ID": _required("TASKPILOTS_OIDC_CLIENT_ID"),
        "CLIENT_SECRET": _required("TASKPILOTS_OIDC_CLIENT_SECRET"),
        "PROVIDER_NAME": (env_str("TASKPILOTS_OIDC_PROVIDER_NAME") or "").strip()
        or urlsplit(issuer).hostname,
        "SCOPES": (env_str("TASKPILOTS_OIDC_SCOPES") or "").strip() or "openid email profile",
        "SIGN_ALGO": algorithm,
        "ENDPOINTS": {key: value for key, value in explicit.items() if value},
        "ROLES_CLAIM": (env_str("TASKPILOTS_OIDC_ROLES_CLAIM") or "").strip() or "groups",
        "ROLES": roles,
        "RENEW_SECONDS": env_int("TASKPILOTS_OIDC_RENEW_SECONDS", 15 * 60, minimum=30),
        "TIMEOUT": env_int("TASKPILOTS_OIDC_TIMEOUT", 10, minimum=1),
        # Signing out of TaskPilots signs out at the provider too (when it offers that).
        "SIGN_OUT_AT_PROVIDER": env_bool("TASKPILOTS_OIDC_SIGN_OUT_AT_PROVIDER", True),
    }


def authentication_backends(sso: dict) -> list[str]:
    """Single sign-on's backend when it is on, Django's password backend unless turned off."""
    backends = [OIDC_BACKEND] if sso["ENABLED"] else []
    if sso["LOCAL_PASSWORDS"]:
        backends.append(PASSWORD_BACKEND)
    return backends


def middleware(sso: dict) -> list[str]:
    """After AuthenticationMiddleware: renews an OIDC session with the provider when due."""
    return [OIDC_MIDDLEWARE] if sso["ENABLED"] else []


def sign_out_origins(sso: dict) -> list[str]:
    """The origins the sign-out form's redirect may reach (the Content-Security-Policy's
    form-action): the end_session_endpoint's when it is given, else the issuer's, where the
    discovery document puts it at every provider we know."""
    if not (sso["ENABLED"] and sso.get("SIGN_OUT_AT_PROVIDER", True)):
        return []
    parts = urlsplit(sso["ENDPOINTS"].get("end_session") or sso["ISSUER"])
    return [f"{parts.scheme}://{parts.netloc}"]


def current() -> dict:
    return getattr(settings, "TASKPILOTS_SSO", OFF)


def enabled() -> bool:
    return bool(current()["ENABLED"])


def local_passwords() -> bool:
    return bool(current()["LOCAL_PASSWORDS"])

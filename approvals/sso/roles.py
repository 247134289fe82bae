"""The provider's groups → the console's roles, set again at every sign-in.

The roles are the Django groups `support`, `auditor` and `admin` (approvals.permissions). A
sign-in gives the person exactly the roles their mapped groups name: a role the provider no
longer gives is taken away, one it now gives is added, and every other Django group the person
is in is left alone. The superuser flag is not the provider's to give or take.
"""

from __future__ import annotations

import hashlib
import logging
import re

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from approvals.sso.conf import ROLE_NAMES

logger = logging.getLogger("taskpilots.console")

USERNAME_CHARACTERS = re.compile(r"[^\w.@+-]")


def claim_values(claims: dict, claim: str) -> list[str]:
    """The claim's values as strings: a list, or one string; `a.b` reads a nested claim
    (Keycloak's `realm_access.roles`)."""
    value: object = claims
    for part in claim.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if isinstance(value, str):
        return [value]
    if isinstance(value, list | tuple):
        return [str(item) for item in value if isinstance(item, str | int)]
    return []


def claimed_roles(claims: dict, claim: str, mapping: dict[str, str]) -> set[str]:
    return {mapping[value] for value in claim_values(claims, claim) if value in mapping}


def set_roles(user, roles: set[str]) -> tuple[set[str], set[str]]:
    """Give `user` exactly these console roles; other groups untouched. Returns (added, removed)."""
    current = set(user.groups.filter(name__in=ROLE_NAMES).values_list("name", flat=True))
    added, removed = roles - current, current - roles
    if added:
        user.groups.add(*(Group.objects.get_or_create(name=name)[0] for name in sorted(added)))
    if removed:
        user.groups.remove(*Group.objects.filter(name__in=removed))
    if added or removed:
        logger.info(
            "sign-in roles: user=%s added=%s removed=%s",
            user.get_username(),
            ",".join(sorted(added)) or "-",
            ",".join(sorted(removed)) or "-",
        )
    # approvals.permissions.roles_of keeps what it read on the user object.
    user.__dict__.pop("_console_roles", None)
    return added, removed


def new_username(claims: dict, subject: str) -> str:
    """A username for a person signing in for the first time: their `preferred_username` (or
    email) when free; otherwise with a suffix from their `sub`. Only a label: sign-ins match on
    the stored `sub` (approvals.sso.models.OidcIdentity)."""
    wanted = claims.get("preferred_username") or claims.get("email") or subject
    base = USERNAME_CHARACTERS.sub("-", str(wanted))[:150] or "user"
    users = get_user_model().objects
    if not users.filter(username__iexact=base).exists():
        return base
    digest = hashlib.sha256(subject.encode()).hexdigest()
    for length in (8, 16, 64):
        suffix = f"-{digest[:length]}"
        candidate = base[: 150 - len(suffix)] + suffix
        if not users.filter(username__iexact=candidate).exists():
            return candidate
    raise ValueError(f"no free username for the OIDC subject {subject!r}")

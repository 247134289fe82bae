"""Who may do what: the console roles, what each console page needs, and who may act on a run
(one rule for the console and the HTTP API).

The console uses `may_act` to decide which actions to offer; every action in
approvals/actions.py calls `check_may_act` again under the run's row lock, so the console, the
API and anything else that calls an action get exactly the same answer, also when a takeover
lands between loading a page and pressing its button.

Roles are Django groups (created by approvals/migrations/0002): `support` and `admin` act on
runs, `auditor` only reads; a superuser counts as an admin. Console pages say what they need with
`require_role(READ | ACT | AUDIT | ADMINISTER)`, and templates ask the same predicates (the
`can_audit` and `is_console_admin` filters in approvals/templatetags/console.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils.functional import Promise
from django.utils.translation import gettext_lazy
from django_htmx.http import reswap, retarget

from runs.api.models import ApiScope
from runs.models import Run

logger = logging.getLogger("taskpilots.console")

SUPPORT, AUDITOR, ADMIN = "support", "auditor", "admin"


class ActionForbidden(PermissionError):
    """The acting user (or an anonymous caller) may not take this action on this run.

    `code` is `user_not_allowed` (the role does not act on runs) or `taken_over` (someone else
    holds the run).
    """

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


class DecisionConflict(Exception):
    """Someone else decided first, or the run moved on since the page was loaded."""


class ActionRefused(ValueError):
    """The action does not make sense in the run's current state (the message says why)."""


def roles_of(user) -> frozenset[str]:
    """The user's console roles, read once per request and kept on the user object."""
    cached = getattr(user, "_console_roles", None)
    if cached is not None:
        return cached
    if not user.is_authenticated or not user.is_active:
        found: frozenset[str] = frozenset()
    else:
        names = set(user.groups.values_list("name", flat=True))
        if user.is_superuser:
            names.add(ADMIN)
        found = frozenset(names & {SUPPORT, AUDITOR, ADMIN})
    user._console_roles = found
    return found


def can_read(user) -> bool:
    return bool(roles_of(user))


def can_act(user) -> bool:
    return bool(roles_of(user) & {SUPPORT, ADMIN})


def can_audit(user) -> bool:
    return bool(roles_of(user) & {AUDITOR, ADMIN})


def is_admin(user) -> bool:
    return ADMIN in roles_of(user)


def api_scopes(user) -> frozenset[str]:
    """The API scopes a person's tokens may carry: reading runs for every console role; starting
    and cancelling runs, delivering events and acting on runs for those who act (support,
    admins). Checked again at every call, so a person who loses a role loses the scopes."""
    if not can_read(user):
        return frozenset()
    if not can_act(user):
        return frozenset({ApiScope.RUNS_READ})
    return frozenset(ApiScope.values)


# --------------------------------------------------------------------------------------------
# Console pages: what each needs of its user, and what it tells one who lacks it.

NO_ROLE = gettext_lazy("You have no console role; ask an admin for access.")
ONLY_ADMINS = gettext_lazy("Only admins may change escalation rules.")


@dataclass(frozen=True)
class Requirement:
    allows: Callable[[Any], bool]
    # Told to a user with another console role, and to one with none.
    refusal: Promise
    refusal_without_role: Promise = NO_ROLE

    def refusal_for(self, user) -> str:
        """Why `user` may not open the page; "" when they may."""
        if self.allows(user):
            return ""
        return str(self.refusal if can_read(user) else self.refusal_without_role)


READ = Requirement(can_read, NO_ROLE)
ACT = Requirement(can_act, gettext_lazy("Your role may not act on runs."))
AUDIT = Requirement(can_audit, gettext_lazy("The audit pages are for auditors and admins."))
ADMINISTER = Requirement(is_admin, ONLY_ADMINS, refusal_without_role=ONLY_ADMINS)


def forbidden(request: HttpRequest, why: str) -> HttpResponse:
    """The 403 page, or for htmx the refusal in the flash area; logged either way."""
    logger.warning(
        "console permission denied: user=%s method=%s path=%s why=%s",
        request.user.get_username() or "-",
        request.method,
        request.path,
        why,
    )
    if not request.htmx:
        return render(request, "403.html", {"why": why}, status=403)
    response = render(request, "console/flash.html", {"error": why}, status=403)
    retarget(response, "#flash")
    reswap(response, "innerHTML")
    return response


def require_role(requirement: Requirement):
    """Login required, then what `requirement` asks of the user's console roles."""

    def decorator(view):
        @wraps(view)
        @login_required
        def wrapper(request, *args, **kwargs):
            why = requirement.refusal_for(request.user)
            if why:
                return forbidden(request, why)
            return view(request, *args, **kwargs)

        return wrapper

    return decorator


def check_may_act(run: Run, user, action: str) -> None:
    """Raise ActionForbidden unless `user` may take `action` on `run` as it stands now.

    1. A caller acting without a named user (an API client on its own account) may act only on
       a run nobody has taken over: a takeover means a person is handling the run, and only
       that person or an admin decides what happens to it.
    2. A named user must be in the support or admin group.
    3. On a taken-over run, only its owner or an admin acts.
    Whether the action fits the run's state is checked by the action itself, under the lock.
    """
    taken_over = run.status == Run.Status.TAKEN_OVER
    owner = run.owner.get_username() if taken_over and run.owner_id else "someone"
    if user is None:
        if taken_over:
            raise ActionForbidden(
                "taken_over",
                f"{owner} has taken this run over; to {action} it, name its owner or an admin "
                "as the acting user.",
            )
        return
    if not can_act(user):
        raise ActionForbidden(
            "user_not_allowed", f"{user.get_username()} is not in the support or admin group."
        )
    if taken_over and run.owner_id != user.pk and not is_admin(user):
        raise ActionForbidden(
            "taken_over",
            f"{owner} has taken this run over; only they or an admin can {action} it.",
        )


def may_act(user, run: Run) -> bool:
    """Whether the console offers `user` any action on `run` (the same rule, without raising)."""
    try:
        check_may_act(run, user, "act on")
    except ActionForbidden:
        return False
    return user is not None

"""Who may act on a run: one rule for the console and the HTTP API.

The console uses `may_act` to decide which actions to offer; every action in
approvals/actions.py calls `check_may_act` again under the run's row lock, so the console, the
API and anything else that calls an action get exactly the same answer, also when a takeover
lands between loading a page and pressing its button.

Roles are Django groups (created by approvals/migrations/0002): `support` and `admin` act on
runs, `auditor` only reads; a superuser counts as an admin.
"""

from __future__ import annotations

from runs.models import Run

SUPPORT, AUDITOR, ADMIN = "support", "auditor", "admin"


class ActionForbidden(PermissionError):
    """The acting user (or an anonymous caller) may not take this action on this run.

    `code` is `user_not_allowed` (the role does not act on runs) or `taken_over` (someone else
    holds the run).
    """

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


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


def is_admin(user) -> bool:
    return ADMIN in roles_of(user)


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

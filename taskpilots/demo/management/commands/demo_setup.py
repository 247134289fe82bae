"""Create the demo users make run logs in with: support, auditor and admin, one per role group.

Idempotent: running it again changes nothing unless the demo password changed. Refuses to run
unless DEBUG or TASKPILOTS_DEV is set, so a known password never reaches a production database.
"""

from __future__ import annotations

import os
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from taskpilots.env import env_bool

DEFAULT_DEMO_PASSWORD = "taskpilots-demo"
# username → group; the group names are the roles in docs/console.md.
DEMO_USERS = {"support": "support", "auditor": "auditor", "admin": "admin"}


class Command(BaseCommand):
    help = "Create the demo groups and users (support, auditor, admin) for local use."

    def handle(self, *args: Any, **options: Any) -> None:
        if not (settings.DEBUG or env_bool("TASKPILOTS_DEV", False)):
            raise CommandError(
                "demo_setup creates users with a known password and runs only for local use: "
                "set TASKPILOTS_DEV=1 (make run does) or DEBUG=1. Never run it in production."
            )
        password = settings.TASKPILOTS["DEMO_PASSWORD"]
        if not password:
            raise CommandError("TASKPILOTS_DEMO_PASSWORD is empty; unset it or give a password.")

        created = []
        with transaction.atomic():
            for username, group_name in DEMO_USERS.items():
                if self._ensure_user(username, group_name, password):
                    created.append(username)

        summary = f"created {', '.join(created)}" if created else "already present"
        self.stdout.write(f"Demo users support, auditor, admin: {summary}.")
        if _password_from_environment():
            where = "the password in TASKPILOTS_DEMO_PASSWORD"
        else:
            where = (
                f"password {DEFAULT_DEMO_PASSWORD} (the default; set TASKPILOTS_DEMO_PASSWORD "
                "to choose another)"
            )
        self.stdout.write(f"Log in at /accounts/login/ as support, auditor or admin with {where}.")

    def _ensure_user(self, username: str, group_name: str, password: str) -> bool:
        """Create or update one demo user; return True when it was created."""
        # get_or_create: a data migration may create the same groups.
        group, _ = Group.objects.get_or_create(name=group_name)
        is_admin = username == "admin"
        user, created = get_user_model().objects.get_or_create(
            username=username,
            defaults={"email": f"{username}@example.com", "is_staff": is_admin},
        )
        changed = created
        if is_admin and not (user.is_staff and user.is_superuser):
            user.is_staff = user.is_superuser = True
            changed = True
        if not user.is_active:
            user.is_active = True
            changed = True
        # Checking first keeps a re-run from rewriting the hash (and last-changed semantics) when
        # nothing changed; a new TASKPILOTS_DEMO_PASSWORD takes effect on the next run.
        if created or not user.check_password(password):
            user.set_password(password)
            changed = True
        if changed:
            user.save()
        user.groups.add(group)
        return created


def _password_from_environment() -> bool:
    return bool(
        os.environ.get("TASKPILOTS_DEMO_PASSWORD")
        or os.environ.get("TASKPILOTS_DEMO_PASSWORD_FILE")
    )

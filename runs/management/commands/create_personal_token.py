from __future__ import annotations

from datetime import timedelta

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from runs.api.models import (
    PERSONAL_TOKEN_DAYS,
    PERSONAL_TOKEN_MAX_DAYS,
    ApiClient,
    ApiScope,
    PersonalToken,
)
from runs.people import people


class Command(BaseCommand):
    help = (
        "Create a personal API token for a person (an admin doing it for them) and print it "
        "once: it is stored hashed. The person's role bounds its scopes at every call. "
        "--revoke TOKEN_ID revokes one."
    )

    def add_arguments(self, parser):
        parser.add_argument("username", nargs="?", help="the person the token authenticates")
        parser.add_argument("--name", default="", help="what it is for (e.g. 'ops laptop')")
        parser.add_argument(
            "--scopes", default="", help=f"comma-separated, from: {', '.join(ApiScope.values)}"
        )
        parser.add_argument(
            "--days",
            type=int,
            default=PERSONAL_TOKEN_DAYS,
            help=f"days until it expires (1 to {PERSONAL_TOKEN_MAX_DAYS})",
        )
        parser.add_argument("--revoke", metavar="TOKEN_ID", help="revoke this token instead")

    def handle(self, *args, username=None, name="", scopes="", days=90, revoke=None, **options):
        if revoke:
            token = PersonalToken.objects.filter(token_id=revoke).first()
            if token is None:
                raise CommandError(f"no token {revoke!r}")
            done = token.revoke()
            self.stdout.write(f"revoked {token.token_id}" if done else f"{revoke} was revoked")
            return
        if not username:
            raise CommandError("give the username (or --revoke TOKEN_ID)")
        user = get_user_model().objects.filter(username=username, is_active=True).first()
        if user is None:
            raise CommandError(f"no active user {username!r}")
        if not 1 <= days <= PERSONAL_TOKEN_MAX_DAYS:
            raise CommandError(f"--days must be 1 to {PERSONAL_TOKEN_MAX_DAYS}")
        try:
            wanted = ApiClient.clean_scopes(scopes.split(","))
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        if not wanted:
            raise CommandError(f"give --scopes (from {', '.join(ApiScope.values)})")
        beyond = sorted(set(wanted) - people().scopes_for(user))
        if beyond:
            raise CommandError(f"{username}'s role does not allow {', '.join(beyond)}")
        token, issued = PersonalToken.issue(
            user,
            name or f"{username}'s token",
            wanted,
            expires_at=timezone.now() + timedelta(days=days),
        )
        self.stdout.write(f"user:       {username}")
        self.stdout.write(f"token_id:   {token.token_id}")
        self.stdout.write(f"scopes:     {','.join(token.scopes)}")
        self.stdout.write(f"expires_at: {token.expires_at.isoformat()}")
        self.stdout.write(f"token:      {issued.token}")
        self.stdout.write(
            "Give it to the person now; it is not stored. They send it as "
            "'Authorization: Bearer <token>'."
        )

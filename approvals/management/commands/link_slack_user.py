"""Link a Slack user to a TaskPilots user: their Approve / Reject presses in Slack then decide
as that user, with that user's roles (approvals/slack_views.py). People who decide can also
link their own Slack account from the console (approvals/slack_link.py); this is for admins."""

from __future__ import annotations

import re

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from approvals.models import SlackIdentity

SLACK_ID = re.compile(r"[A-Z0-9]{2,32}")


class Command(BaseCommand):
    help = (
        "Link a Slack user (workspace id T…, user id U… or W…, from the person's Slack profile: "
        "⋮ → Copy member ID) to a TaskPilots user, or --unlink it. --list shows every link."
    )

    def add_arguments(self, parser):
        parser.add_argument("username", nargs="?", help="the TaskPilots user")
        parser.add_argument("--team", default="", help="the Slack workspace id (T…)")
        parser.add_argument("--slack-user", default="", help="the Slack user id (U… or W…)")
        parser.add_argument("--unlink", action="store_true", help="remove the link instead")
        parser.add_argument("--list", action="store_true", help="list the links")

    def handle(self, *args, username=None, team="", slack_user="", **options):
        if options["list"]:
            for link in SlackIdentity.objects.select_related("user").order_by("team_id", "id"):
                self.stdout.write(f"{link.team_id} {link.slack_user_id} {link.user.get_username()}")
            return
        team, slack_user = team.strip().upper(), slack_user.strip().upper()
        if not SLACK_ID.fullmatch(team) or not SLACK_ID.fullmatch(slack_user):
            raise CommandError("give --team T… and --slack-user U… (Slack's ids, not names)")
        if options["unlink"]:
            count, _ = SlackIdentity.objects.filter(team_id=team, slack_user_id=slack_user).delete()
            self.stdout.write(f"unlinked {team}/{slack_user}" if count else "no such link")
            return
        if not username:
            raise CommandError("give the TaskPilots username")
        user = get_user_model().objects.filter(username=username, is_active=True).first()
        if user is None:
            raise CommandError(f"no active user {username!r}")
        link, created = SlackIdentity.objects.update_or_create(
            team_id=team,
            slack_user_id=slack_user,
            defaults={"user": user, "linked_by": "manage.py link_slack_user"},
        )
        verb = "linked" if created else "relinked"
        self.stdout.write(f"{verb} {team}/{slack_user} to {user.get_username()}")

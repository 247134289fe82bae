from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from django.db import IntegrityError

from runs.api.models import ApiClient, ApiScope


class Command(BaseCommand):
    help = (
        "Create an API client and print its client id, API token and webhook signing secret "
        "(shown once, never stored). --rotate issues new credentials for an existing client; "
        "--revoke revokes it."
    )

    def add_arguments(self, parser):
        parser.add_argument("name", help="a short slug naming the agent or system")
        parser.add_argument(
            "--scopes",
            default="",
            help=f"comma-separated, from: {', '.join(ApiScope.values)}",
        )
        parser.add_argument("--description", default="")
        action = parser.add_mutually_exclusive_group()
        action.add_argument("--rotate", action="store_true", help="new credentials, same client")
        action.add_argument("--revoke", action="store_true", help="revoke the client")

    def handle(
        self, *args, name: str, scopes: str, description: str, rotate: bool, revoke: bool, **options
    ):
        if revoke:
            return revoke_client(self, name)
        if rotate:
            client = ApiClient.objects.active().filter(name=name).first()
            if client is None:
                raise CommandError(f"no active API client named {name!r}")
            credentials = client.rotate_credentials()
        else:
            try:
                scope_list = ApiClient.clean_scopes(scopes.split(","))
            except ValueError as exc:
                raise CommandError(str(exc)) from None
            if not scope_list:
                raise CommandError(f"give --scopes (from {', '.join(ApiScope.values)})")
            try:
                client, credentials = ApiClient.issue(name, scope_list, description=description)
            except IntegrityError:
                raise CommandError(f"an API client named {name!r} already exists") from None
        self.stdout.write(f"client:         {client.name}")
        self.stdout.write(f"client_id:      {credentials.client_id}")
        self.stdout.write(f"scopes:         {','.join(client.scopes)}")
        self.stdout.write(f"token:          {credentials.token}")
        self.stdout.write(f"signing_secret: {credentials.signing_secret}")
        self.stdout.write(
            "Keep these now; they are not stored. Send the token as "
            "'Authorization: Bearer <token>'; sign webhooks with the signing secret."
        )


def revoke_client(command: BaseCommand, name: str) -> None:
    client = ApiClient.objects.filter(name=name).first()
    if client is None:
        raise CommandError(f"no API client named {name!r}")
    if client.revoke():
        command.stdout.write(f"revoked {client.name} ({client.client_id})")
    else:
        command.stdout.write(f"{client.name} was already revoked at {client.revoked_at}")

from __future__ import annotations

from django.core.management.base import BaseCommand

from runs.management.commands.create_api_client import revoke_client


class Command(BaseCommand):
    help = "Revoke an API client: its token and signatures stop working at once."

    def add_arguments(self, parser):
        parser.add_argument("name")

    def handle(self, *args, name: str, **options):
        revoke_client(self, name)

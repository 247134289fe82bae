from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from taskpilots.demo.seed import SeedError, seed


class Command(BaseCommand):
    help = (
        "Seed demo runs (make run does this): completed, recovered and paused runs of the demo "
        "workflows, executed by the running worker against the running sandbox."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--again",
            action="store_true",
            help="Seed another set of demo runs beside the ones present (keys demo-2-…).",
        )

    def handle(self, *args, **options):
        if not (settings.DEBUG or settings.TASKPILOTS.get("DEV")):
            import os

            if os.environ.get("TASKPILOTS_DEV") != "1":
                raise CommandError(
                    "seed_demo is for local demos only (make run); refusing to "
                    "write demo runs with DEBUG off and TASKPILOTS_DEV unset."
                )
        try:
            seed(say=lambda line: self.stdout.write(line), again=options["again"])
        except SeedError as exc:
            raise CommandError(str(exc)) from None

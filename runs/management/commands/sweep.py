from __future__ import annotations

import json

from django.core.management.base import BaseCommand

from runs import engine


class Command(BaseCommand):
    help = (
        "Run one sweeper pass: wake due timers and retries, take back expired leases, "
        "re-enqueue runs whose message was lost."
    )

    def handle(self, *args, **options):
        report = engine.sweep()
        self.stdout.write(json.dumps(report.as_dict()))

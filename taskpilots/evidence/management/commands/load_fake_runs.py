from __future__ import annotations

import time

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from taskpilots.evidence.loadgen import load_fake_runs


class Command(BaseCommand):
    help = (
        "Insert N realistic fake runs (steps, snapshots, side effects, waits, approvals, "
        "takeovers, a valid hash-chained timeline) to measure the metrics dashboard. "
        "For a scratch database only."
    )

    def add_arguments(self, parser):
        parser.add_argument("count", type=int)
        parser.add_argument("--days", type=float, default=30, help="spread over the last N days")
        parser.add_argument("--seed", type=int, default=7)
        parser.add_argument("--batch-size", type=int, default=2000)

    def handle(self, *args, count: int, days: float, seed: int, batch_size: int, **options):
        if count < 1:
            raise CommandError("N must be at least 1.")
        name = settings.DATABASES["default"]["NAME"]
        self.stderr.write(f"Loading {count} fake runs into database {name!r}…")
        started = time.monotonic()
        done = load_fake_runs(
            count, days=days, seed=seed, batch_size=batch_size, progress=self.stderr.write
        )
        self.stdout.write(f"{done} runs in {time.monotonic() - started:.1f} s")
        # The runs were written with past ends, behind the rollup's high-water mark.
        self.stderr.write("Storing the dashboard's rows for them (rollup_metrics --full)…")
        call_command("rollup_metrics", "--full", stdout=self.stdout, stderr=self.stderr)

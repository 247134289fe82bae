from __future__ import annotations

import time

from django.core.management.base import BaseCommand, CommandError

from approvals.metrics import store


class Command(BaseCommand):
    help = (
        "Store the metrics dashboard's per-run rows and day sums for runs that have been still "
        "for a minute (the beat task does this every 30 s). --full looks at every run ever "
        "ended, e.g. after loading old runs in bulk."
    )

    def add_arguments(self, parser):
        parser.add_argument("--full", action="store_true", help="look at every ended run")
        parser.add_argument("--batch-size", type=int, default=store.ROLLUP_BATCH)

    def handle(self, *args, full: bool = False, batch_size: int = store.ROLLUP_BATCH, **opts):
        if batch_size < 1:
            raise CommandError("--batch-size must be at least 1.")
        started = time.monotonic()
        shown = [0]

        def progress(stored: int) -> None:
            if stored - shown[0] >= 10 * batch_size or (stored and not shown[0]):
                shown[0] = stored
                self.stderr.write(f"… {stored} run rows ({time.monotonic() - started:.0f} s)")

        stored = store.rollup(full=full, batch_size=batch_size, progress=progress)
        self.stdout.write(f"stored {stored} run rows in {time.monotonic() - started:.1f} s")

from __future__ import annotations

from django.core.management.base import BaseCommand

from runs import audit


class Command(BaseCommand):
    help = (
        "Drop the payloads (event data, snapshot parameters and prior results) of runs that "
        "finished more than DAYS ago (default: TASKPILOTS_RETENTION_DAYS). Digests, hashes "
        "and checksums stay, so every chain still verifies."
    )

    def add_arguments(self, parser):
        parser.add_argument("--older-than", type=int, dest="days", metavar="DAYS")
        parser.add_argument("--dry-run", action="store_true", help="only count")
        parser.add_argument("--batch-size", type=int, default=audit.RUN_BATCH)

    def handle(self, *args, days=None, dry_run=False, batch_size=audit.RUN_BATCH, **options):
        if days is not None and days < 0:
            from django.core.management.base import CommandError

            raise CommandError("--older-than must be 0 or more days.")

        def progress(report: audit.PruneReport) -> None:
            self.stderr.write(
                f"… {report.runs} runs, {report.events} events, {report.snapshots} snapshots"
            )

        report = audit.prune_payloads(
            days, dry_run=dry_run, batch_size=max(batch_size, 1), progress=progress
        )
        self.stdout.write(report.summary())

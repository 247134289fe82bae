from __future__ import annotations

import sys
import uuid

from django.core.management.base import BaseCommand, CommandError

from runs import audit


class Command(BaseCommand):
    help = (
        "Recompute the hash-chained timelines and the records chain (every run and the records "
        "chain, one run, or an exported JSON Lines file offline), check every sealed row "
        "against its latest seal, and name the first broken event or row of each chain. Exits "
        "1 if anything was altered, inserted or removed."
    )
    # --file must work with no database at all; the system checks would open a connection.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser):
        target = parser.add_mutually_exclusive_group()
        target.add_argument("--run", help="verify only this run (id)")
        target.add_argument(
            "--file", help="verify an export made by export_audit (JSON Lines; '-' for stdin)"
        )

    def handle(self, *args, run=None, file=None, **options):
        def progress(runs: int, events: int) -> None:
            self.stderr.write(f"… {runs} runs, {events} events verified")

        if file:
            report = self._verify_file(file, progress)
        else:
            from runs.models import Run

            if run:
                try:
                    runs = Run.objects.filter(pk=uuid.UUID(run))
                except ValueError:
                    raise CommandError(f"{run!r} is not a run id.") from None
                if not runs.exists():
                    raise CommandError(f"No run {run}.")
                report = audit.verify_queryset_runs(runs, progress=progress)
            else:
                report = audit.verify_database(progress=progress)
        for problem in report.problems:
            self.stdout.write(f"BROKEN {problem}")
        if not report.ok:
            raise CommandError(report.summary(), returncode=1)
        self.stdout.write(report.summary())

    def _verify_file(self, name: str, progress) -> audit.VerifyReport:
        if name == "-":
            return audit.verify_export(sys.stdin, progress)
        try:
            with open(name, encoding="utf-8") as handle:
                return audit.verify_export(handle, progress)
        except OSError as exc:
            raise CommandError(f"Cannot read {name}: {exc}") from None
        except UnicodeDecodeError:
            raise CommandError(f"{name} is not UTF-8 text.") from None

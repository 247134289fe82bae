from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from taskpilots.evidence import report


class Command(BaseCommand):
    help = (
        "Regenerate the figures in docs/benchmarks.md from the result files in docs/results/ "
        "(each block between <!-- results:NAME --> markers). --check: change nothing, fail when "
        "a block differs from what its file gives."
    )

    def add_arguments(self, parser):
        parser.add_argument("--check", action="store_true")

    def handle(self, *args, check, **options):
        text, changed = report.regenerate()
        if check:
            if changed:
                raise CommandError(
                    "docs/benchmarks.md differs from docs/results/ in: "
                    + ", ".join(changed)
                    + ". Run `python manage.py bench_report` and commit the result."
                )
            self.stdout.write("docs/benchmarks.md matches docs/results/")
            return
        report.DOC.write_text(text, encoding="utf-8")
        self.stdout.write(f"regenerated: {', '.join(changed) or 'nothing changed'}")

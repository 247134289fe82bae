from __future__ import annotations

import sys
import uuid

from django.core.management.base import BaseCommand, CommandError

from approvals import viewer_time
from runs import audit


class Command(BaseCommand):
    help = (
        "Export timelines as JSON Lines (verifiable offline with verify_audit --file) or CSV: "
        "one run, or the runs matching the same filters as the console's audit search."
    )

    def add_arguments(self, parser):
        parser.add_argument("--run", help="export only this run (id)")
        parser.add_argument("--format", choices=["jsonl", "csv"], default="jsonl")
        parser.add_argument("--output", "-o", default="-", help="file to write ('-': stdout)")
        parser.add_argument("--from", dest="date_from", help="started on or after (YYYY-MM-DD)")
        parser.add_argument("--to", dest="date_to", help="started on or before (YYYY-MM-DD)")
        parser.add_argument("--business-key", dest="business_key", default="", help="exact")
        parser.add_argument("--workflow", default="")
        parser.add_argument("--tool", default="")
        parser.add_argument("--target", default="", help="target resource (prefix)")
        parser.add_argument("--actor", default="", help="a user name or an actor such as api:x")
        parser.add_argument("--outcome", default="", choices=["", *audit_outcomes()])
        parser.add_argument(
            "--records",
            action="store_true",
            help="also the records chain: rule versions and rules, tool pauses, metadata "
            "decisions and bulk jobs, with their sealed content (JSON Lines only)",
        )

    def handle(self, *args, **options):
        from approvals.audit_search import AuditQuery
        from runs.models import Run

        if options["run"]:
            try:
                runs = Run.objects.filter(pk=uuid.UUID(options["run"]))
            except ValueError:
                raise CommandError(f"{options['run']!r} is not a run id.") from None
            if not runs.exists():
                raise CommandError(f"No run {options['run']}.")
            query = {"run": options["run"]}
        else:
            query = AuditQuery(
                date_from=_date(options["date_from"]),
                date_to=_date(options["date_to"]),
                business_key=options["business_key"],
                workflow=options["workflow"],
                tool=options["tool"],
                target=options["target"],
                actor=options["actor"],
                outcome=options["outcome"],
            )
            runs = query.runs()
            query = query.as_dict()

        def progress(runs_done: int, events: int) -> None:
            self.stderr.write(f"… {runs_done} runs, {events} events exported")

        if options["format"] == "jsonl":
            lines = audit.export_jsonl(
                runs,
                exported_by="shell",
                query=query,
                progress=progress,
                records=options["records"],
            )
        elif options["records"]:
            raise CommandError("--records needs --format jsonl (CSV is for people to read).")
        else:
            lines = audit.export_csv(runs)
        if options["output"] == "-":
            count = _write(lines, sys.stdout)
        else:
            with open(options["output"], "w", encoding="utf-8", newline="") as handle:
                count = _write(lines, handle)
        self.stderr.write(f"Wrote {count} lines.")


def _write(lines, handle) -> int:
    count = 0
    for line in lines:
        handle.write(line)
        count += 1
    return count


def audit_outcomes() -> list[str]:
    from approvals.audit_search import OUTCOMES

    return list(OUTCOMES)


def _date(value: str | None):
    if not value:
        return None
    try:
        return viewer_time.parse_day(value)
    except viewer_time.DayOutOfRange as exc:
        raise CommandError(f"{value!r} is outside the dates runs can be searched by.") from exc
    except ValueError:
        raise CommandError(f"{value!r} is not a date (YYYY-MM-DD).") from None

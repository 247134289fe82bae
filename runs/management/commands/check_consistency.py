from __future__ import annotations

import json
from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from runs.engine.consistency import check_consistency


def _since(value: str):
    """An ISO date-time, or a span back from now: 30m, 6h, 2d."""
    units = {"m": "minutes", "h": "hours", "d": "days"}
    if value[-1:] in units and value[:-1].isdigit():
        return timezone.now() - timedelta(**{units[value[-1]]: int(value[:-1])})
    parsed = parse_datetime(value)
    if parsed is None:
        raise CommandError(f"--since {value!r}: give an ISO date-time or a span like 6h or 2d")
    return parsed if timezone.is_aware(parsed) else timezone.make_aware(parsed)


class Command(BaseCommand):
    help = (
        "Compare committed side effects with the external systems holding them (asked by "
        "idempotency key) and record what is missing or different there."
    )

    def add_arguments(self, parser):
        parser.add_argument("--since", help="window start: ISO date-time, or 30m / 6h / 2d back")
        parser.add_argument("--limit", type=int, help="most side effects asked in this pass")
        parser.add_argument("--batch", type=int, help="side effects read per query")

    def handle(self, *args, since=None, limit=None, batch=None, **options):
        for name, value in (("--limit", limit), ("--batch", batch)):
            if value is not None and value < 1:
                raise CommandError(f"{name} must be at least 1")

        def progress(report):
            self.stderr.write(
                f"checked {report.checked}: {report.missing} missing, {report.different} "
                f"different, {report.recorded} new, {report.unanswered} unanswered"
            )

        report = check_consistency(
            since=_since(since) if since else None, limit=limit, batch=batch, progress=progress
        )
        self.stdout.write(json.dumps(report.as_dict()))

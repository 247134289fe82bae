"""`manage.py sandbox`: run the simulated external systems in the foreground."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from taskpilots.sandbox.server import serve


class Command(BaseCommand):
    help = "Run the sandbox (simulated mail, tickets, crm, payments, kb) in the foreground."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--port", type=int, default=8765)
        # Loopback by default: the sandbox has no authentication and resets on request.
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--db", default=None, help="default: VAR_DIR/sandbox.sqlite3")
        parser.add_argument("--quiet", action="store_true", help="do not log each request")

    def handle(self, *args: Any, **options: Any) -> None:
        db_path = Path(options["db"] or Path(settings.VAR_DIR) / "sandbox.sqlite3")
        db_path.parent.mkdir(parents=True, exist_ok=True)

        def announce(url: str) -> None:
            self.stdout.write(f"sandbox listening on {url} (ledger: {db_path})")
            self.stdout.flush()

        serve(
            options["host"],
            options["port"],
            str(db_path),
            log_requests=not options["quiet"],
            ready=announce,
        )

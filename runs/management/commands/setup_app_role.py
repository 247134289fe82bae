from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from runs import approle


class Command(BaseCommand):
    help = (
        "Create or update the application's database role (run as the tables' owner, after "
        "every migrate; idempotent): it may read and write rows but not TRUNCATE, ALTER or DROP, "
        "owns nothing, and never deletes audit rows. The web, worker and beat processes "
        "connect as it (docs/deploy.md)."
    )

    def add_arguments(self, parser):
        parser.add_argument("role", help="the role's name, e.g. taskpilots_app")
        parser.add_argument(
            "--password-file",
            help="set the role's password from this file's first line (it is hashed here: the "
            "server never sees it); without it the password is left as it is",
        )

    def handle(self, *args, role: str, password_file: str | None = None, **options):
        password = None
        if password_file:
            try:
                with open(password_file, encoding="utf-8") as handle:
                    password = handle.readline().rstrip("\r\n")
            except OSError as exc:
                raise CommandError(f"Cannot read {password_file}: {exc}") from None
            if not password:
                raise CommandError(f"{password_file} holds no password on its first line.")
        try:
            grants = approle.setup(role, password)
        except approle.RoleError as exc:
            raise CommandError(str(exc)) from None
        if options["verbosity"] >= 2:
            for table, privileges in grants.tables.items():
                self.stdout.write(f"  {table}: {', '.join(privileges)}")
        if options["verbosity"] >= 1:
            self.stdout.write(grants.summary())

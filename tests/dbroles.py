"""The test suite's database roles.

The test database is created and migrated by the owner (the user of the configured
DATABASE_URL, `postgres` in CI and on the embedded server), as production's `migrate` is. Then
`manage.py setup_app_role` grants the application role of that database (`<test db>_app`) what
production's web, worker and beat processes get, and every connection of the suite acts as it:

- The Celery workers, gunicorn and any process the tests start log in as that role
  (taskpilots/evidence/workers.py `database_url`, from `APP_ROLE` below).
- The suite's own connections log in as the owner but act as the role from their first
  statement on (`-c role=…` in the connection's options): every statement the application code
  runs is checked against the role's privileges, so a missing grant fails the tests. Logging in
  as the owner is what lets a test tamper, inside its own transaction, as only an owner can
  (`as_owner`: triggers off, raw edits), and what lets the flush between transactional tests
  empty the tables: Django's flush is a TRUNCATE, which the role may not run and which the audit
  tables' triggers refuse (`SET LOCAL session_replication_role = replica` for that statement,
  here only; never in the application's code).
"""

from __future__ import annotations

import os
import secrets
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection, connections, transaction
from django.db.backends.postgresql.operations import DatabaseOperations


def app_role_name(database: str) -> str:
    return f"{database}_app"[:63]


def flush_as_owner(self, sql_list) -> None:
    """DatabaseOperations.execute_sql_flush for the suite: the TRUNCATE between transactional
    tests as the owner, with the audit tables' triggers off for that one transaction."""
    with transaction.atomic(using=self.connection.alias), self.connection.cursor() as cursor:
        cursor.execute("SET LOCAL ROLE NONE")
        cursor.execute("SET LOCAL session_replication_role = replica")
        for sql in sql_list:
            cursor.execute(sql)


def install_flush() -> None:
    DatabaseOperations.execute_sql_flush = flush_as_owner


def use_app_role() -> str:
    """Grant the test database's application role (as the owner), then make every connection
    act as it. Returns the role."""
    from django.core.management import call_command

    db = connection.settings_dict
    role = app_role_name(db["NAME"])
    password = secrets.token_urlsafe(24)
    with tempfile.NamedTemporaryFile("w", prefix="tp-app-role-", delete=False) as handle:
        handle.write(password + "\n")
    try:
        call_command("setup_app_role", role, password_file=handle.name, verbosity=0)
    finally:
        os.unlink(handle.name)
    _reconnect()
    options = db.setdefault("OPTIONS", {})
    options["options"] = f"{options.get('options', '')} -c role={role}".strip()
    db["APP_ROLE"] = {"USER": role, "PASSWORD": password}
    return role


def back_to_owner() -> None:
    """Undo use_app_role (pytest-django then drops the test database as the owner)."""
    db = connection.settings_dict
    role = (db.pop("APP_ROLE", None) or {}).get("USER")
    if role:
        options = db.get("OPTIONS", {})
        options["options"] = options.get("options", "").replace(f"-c role={role}", "").strip()
    _reconnect()


def _reconnect() -> None:
    for conn in connections.all(initialized_only=True):
        conn.close()
        if hasattr(conn, "close_pool"):
            conn.close_pool()


@contextmanager
def as_owner(using: str = "default") -> Iterator[None]:
    """Act as the owner on this connection for the block (tampering as someone with owner
    access would, DDL a test needs), then as the application role again."""
    conn = connections[using]
    with conn.cursor() as cursor:
        cursor.execute("SET ROLE NONE")
    try:
        yield
    finally:
        with conn.cursor() as cursor:
            cursor.execute("RESET ROLE")

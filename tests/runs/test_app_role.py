"""The application's database role (runs/approle.py, `manage.py setup_app_role`): the suite
runs as it (tests/dbroles.py), as production's web, worker and beat processes do; it may read
and write rows, never TRUNCATE, ALTER, DROP, switch triggers off or own anything, and never
delete or change an audit row the database keeps append-only."""

from __future__ import annotations

import io

import psycopg
import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction
from django.db.backends.base.operations import BaseDatabaseOperations
from django.db.backends.postgresql.operations import DatabaseOperations

from taskpilots.evidence.workers import database_url
from tests.dbroles import app_role_name, as_owner
from tests.factories import RunFactory

pytestmark = pytest.mark.django_db


def role() -> str:
    return connection.settings_dict["APP_ROLE"]["USER"]


def refused(sql: str, params=None) -> str:
    """The error PostgreSQL gives this connection's role for `sql` (nothing is changed)."""
    with pytest.raises(DatabaseError) as error, transaction.atomic(), connection.cursor() as c:
        c.execute(sql, params)
    return str(error.value)


def test_the_suite_acts_as_the_application_role():
    assert role() == app_role_name(connection.settings_dict["NAME"])
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT current_user, rolsuper, rolcreaterole, rolcreatedb, rolbypassrls "
            "FROM pg_roles WHERE rolname = current_user"
        )
        assert cursor.fetchone() == (role(), False, False, False, False)
        cursor.execute(
            "SELECT count(*) FROM pg_class WHERE relowner = "
            "(SELECT oid FROM pg_roles WHERE rolname = current_user)"
        )
        assert cursor.fetchone() == (0,)


def test_the_processes_the_tests_start_log_in_as_the_role():
    # Workers, gunicorn, commands on this database: the role's own login, no `-c role`.
    with psycopg.connect(database_url()) as conn:
        assert conn.execute("SELECT session_user, current_user").fetchone() == (role(), role())
    # A scratch database (bench, drill) is the owner's: created, migrated and dropped by it.
    with psycopg.connect(database_url("postgres")) as conn:
        (user,) = conn.execute("SELECT current_user").fetchone()
    assert user == connection.settings_dict["USER"] != role()


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("TRUNCATE runs_timelineevent", "permission denied"),
        ("TRUNCATE approvals_humandecision CASCADE", "permission denied"),
        ("ALTER TABLE runs_timelineevent DISABLE TRIGGER ALL", "must be owner"),
        ("ALTER TABLE approvals_humandecision ADD COLUMN x int", "must be owner"),
        ("DROP TABLE approvals_auditrecord", "must be owner"),
        ("DROP TRIGGER runs_timelineevent_no_truncate ON runs_timelineevent", "must be owner"),
        ("CREATE TABLE sneaky (id int)", "permission denied for schema"),
        ("SET session_replication_role = replica", "permission denied to set parameter"),
        ("SELECT setval('runs_step_id_seq', 1)", "permission denied for sequence"),
        ("UPDATE approvals_humandecision SET comment = 'x'", "permission denied"),
        ("DELETE FROM approvals_humandecision", "permission denied"),
        ("DELETE FROM approvals_ruleversion", "permission denied"),
        ("DELETE FROM approvals_takeover", "permission denied"),
        ("DELETE FROM runs_timelineevent", "permission denied"),
        ("DELETE FROM runs_run", "permission denied"),
        ("UPDATE approvals_auditrecord SET actor = 'x'", "permission denied"),
        ("INSERT INTO django_migrations (app, name, applied) VALUES ('x', 'y', now())", "denied"),
    ],
)
def test_the_role_cannot_change_the_schema_or_rewrite_the_trail(sql, message):
    assert message in refused(sql)


def test_the_role_reads_and_writes_what_the_application_needs():
    with connection.cursor() as cursor:
        cursor.execute("SELECT nextval(pg_get_serial_sequence('runs_step', 'id'))")
        cursor.execute("SELECT pg_advisory_xact_lock(1), tp_assert(true, 'ok')")
        cursor.execute(
            "SELECT has_table_privilege(current_user, 'taskpilots_cache', 'DELETE'), "
            "has_table_privilege(current_user, 'runs_timelineevent', 'UPDATE'), "
            "has_table_privilege(current_user, 'runs_wait', 'DELETE')"
        )
        assert cursor.fetchone() == (True, True, True)
    # Retention's UPDATE is allowed; the trigger refuses any other (as before).
    RunFactory().record("test.step", {})
    assert "append-only" in refused("UPDATE runs_timelineevent SET actor = 'x'")


def test_no_audit_table_can_be_truncated_or_deleted_from():
    from tests.runs.test_audit_seals import AUDIT_TABLES

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT relname FROM pg_class WHERE relname = ANY(%s) AND ("
            "has_table_privilege(current_user, oid, 'TRUNCATE') OR "
            "has_table_privilege(current_user, oid, 'DELETE') OR "
            "has_table_privilege(current_user, oid, 'TRIGGER') OR "
            "has_table_privilege(current_user, oid, 'REFERENCES'))",
            [AUDIT_TABLES],
        )
        assert cursor.fetchall() == []


def tables(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("  ")]


def setup(*args) -> str:
    out = io.StringIO()
    with as_owner():
        call_command("setup_app_role", *args, "-v", "2", stdout=out)
    return out.getvalue()


def test_setup_is_idempotent_and_follows_the_triggers(tmp_path):
    # A role of this test's own (roles are created in the test's transaction: rolled back).
    password = tmp_path / "password"
    password.write_text("s3cret\n", encoding="utf-8")
    first = setup("tp_test_other_app", "--password-file", str(password))
    again = setup("tp_test_other_app")
    assert "tp_test_other_app: created, password set;" in first
    assert "tp_test_other_app: exists;" in again
    assert tables(first) == tables(again)  # the same grants, table by table
    for line in (
        "approvals_humandecision: SELECT, INSERT\n",
        "approvals_auditrecord: SELECT, INSERT\n",
        "runs_timelineevent: SELECT, INSERT, UPDATE\n",
        "approvals_takeover: SELECT, INSERT, UPDATE\n",
        "django_migrations: SELECT\n",
        "runs_wait: SELECT, INSERT, UPDATE, DELETE\n",
    ):
        assert f"  {line}" in first
    with as_owner(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT rolpassword LIKE 'SCRAM-SHA-256$%%' FROM pg_authid WHERE rolname = %s",
            ["tp_test_other_app"],
        )
        assert cursor.fetchone() == (True,)  # hashed by the client: the server never saw it


@pytest.mark.parametrize(
    ("prepare", "message"),
    [
        ("CREATE ROLE tp_test_bad SUPERUSER", "is a superuser"),
        ("CREATE ROLE tp_test_bad CREATEROLE", "may create roles"),
        ("CREATE ROLE tp_test_bad; GRANT {owner} TO tp_test_bad", "is a member of"),
        (
            "CREATE ROLE tp_test_bad; CREATE TABLE tp_owned (id int); "
            "ALTER TABLE tp_owned OWNER TO tp_test_bad",
            "owns table tp_owned",
        ),
    ],
)
def test_setup_refuses_a_role_that_could_act_as_an_owner(prepare, message):
    owner = connection.settings_dict["USER"]
    with as_owner(), connection.cursor() as cursor:
        cursor.execute(prepare.format(owner=owner))
    with pytest.raises(CommandError, match=message):
        setup("tp_test_bad")
    with pytest.raises(CommandError, match="needs a role of its own"):
        setup(owner)


def test_flush_is_refused_by_the_audit_tables(monkeypatch):
    # `manage.py flush` (development): a TRUNCATE of every table, which the triggers refuse,
    # with the table and the reason (the suite's own flush truncates with them switched off).
    monkeypatch.setattr(
        DatabaseOperations, "execute_sql_flush", BaseDatabaseOperations.execute_sql_flush
    )
    with as_owner(), pytest.raises(CommandError) as error:
        call_command("flush", interactive=False, verbosity=0)
    cause = str(error.value.__cause__)
    assert "is part of the audit trail" in cause and "TRUNCATE refused" in cause

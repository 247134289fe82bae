"""The application's database role: least privilege for the web, worker and beat processes.

Migrations run as the owner of the tables (production's `migrate`, with the owner's URL). The
processes that serve connect as another role, which may read and write rows but not change the
schema: no TRUNCATE, ALTER, DROP or trigger changes (only an owner may), owning nothing, no
CREATE in the schema. Its privileges on each table follow from what the migrations declared on
that table, read from the catalogue, so a new table gets the right ones:

- a table with the strict append-only trigger (`taskpilots_refuse_any_change`: decisions,
  rule versions, metadata decisions, the records chain): SELECT, INSERT (written once, never
  changed);
- with the retention trigger (`taskpilots_refuse_change`: the timeline, snapshots): SELECT,
  INSERT, UPDATE (`prune_payloads` replaces old payloads; the trigger refuses any other UPDATE);
- with the TRUNCATE guard (`taskpilots_refuse_truncate`: runs, steps, the ledger, approval
  requests, takeovers, tool pauses, bulk jobs and items, the records head): SELECT, INSERT,
  UPDATE (their rows change as runs move; none is ever deleted);
- `django_migrations`: SELECT (only `migrate` writes it);
- any other table (users, sessions, the cache table, waits, metrics…): SELECT, INSERT, UPDATE,
  DELETE.

Sequences get USAGE and SELECT (nextval: the engine takes id blocks ahead, runs/batch.py; not
UPDATE, so no setval), functions EXECUTE, and the owner's future tables, sequences and functions
in the schema the default ones above (until `setup_app_role` runs again after the migration and
narrows the audit tables). `setup` is idempotent: it revokes what it does not grant.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db import DatabaseError, connection, transaction

SELECT_INSERT = ("SELECT", "INSERT")
NO_DELETE = ("SELECT", "INSERT", "UPDATE")
READ_WRITE = ("SELECT", "INSERT", "UPDATE", "DELETE")
READ_ONLY = ("SELECT",)

# Roles that may do more than read and write rows, which the application's must not have.
POWERS = {
    "rolsuper": "is a superuser",
    "rolcreaterole": "may create roles",
    "rolcreatedb": "may create databases",
    "rolreplication": "may replicate",
    "rolbypassrls": "bypasses row security",
}

_TABLES_SQL = """
SELECT c.relname,
    COALESCE(bool_or(p.proname = 'taskpilots_refuse_any_change'), false),
    COALESCE(bool_or(p.proname = 'taskpilots_refuse_change'), false),
    COALESCE(bool_or(p.proname = 'taskpilots_refuse_truncate'), false)
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_trigger t ON t.tgrelid = c.oid AND NOT t.tgisinternal
LEFT JOIN pg_proc p ON p.oid = t.tgfoid
WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p')
GROUP BY c.relname
ORDER BY c.relname
"""

_OWNED_SQL = """
SELECT 'table ' || relname FROM pg_class WHERE relowner = %(oid)s
UNION ALL SELECT 'function ' || proname FROM pg_proc WHERE proowner = %(oid)s
UNION ALL SELECT 'schema ' || nspname FROM pg_namespace WHERE nspowner = %(oid)s
UNION ALL SELECT 'database ' || datname FROM pg_database WHERE datdba = %(oid)s
"""


class RoleError(Exception):
    """The role cannot be the application's (the message says why and what to do)."""


@dataclass
class Grants:
    role: str
    created: bool = False
    password_set: bool = False
    tables: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def summary(self) -> str:
        counts: dict[tuple[str, ...], int] = {}
        for privileges in self.tables.values():
            counts[privileges] = counts.get(privileges, 0) + 1
        parts = [f"{n} {'/'.join(p)}" for p, n in sorted(counts.items(), key=lambda i: -len(i[0]))]
        return (
            f"{self.role}: {'created' if self.created else 'exists'}"
            f"{', password set' if self.password_set else ''}; {len(self.tables)} tables ("
            f"{', '.join(parts)}); sequences USAGE/SELECT; functions EXECUTE; the same by "
            "default on the owner's future tables. No TRUNCATE, no DDL, owns nothing."
        )


def table_privileges(name: str, strict: bool, retention: bool, guarded: bool) -> tuple[str, ...]:
    if name == "django_migrations":
        return READ_ONLY
    if strict:
        return SELECT_INSERT
    if retention or guarded:
        return NO_DELETE
    return READ_WRITE


def setup(role: str, password: str | None = None) -> Grants:
    """Create `role` if it is missing, set its password if given, and grant it exactly the
    application's privileges in this database (run as the tables' owner)."""
    grants = Grants(role)
    quoted = connection.ops.quote_name(role)
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_user, current_database(), current_schema()")
        owner, database, schema = cursor.fetchone()
    if role == owner:
        raise RoleError(
            f"{role} is the role running this command, the tables' owner: the application "
            "needs a role of its own (run setup_app_role as the owner, naming another role)."
        )
    with transaction.atomic():
        grants.created = _create(role, quoted)
        _check(role, owner)
        if password is not None:
            _set_password(role, quoted, password)
            grants.password_set = True
        q_owner, q_schema = connection.ops.quote_name(owner), connection.ops.quote_name(schema)
        with connection.cursor() as cursor:
            run = cursor.execute
            run(f"GRANT CONNECT ON DATABASE {connection.ops.quote_name(database)} TO {quoted}")
            run(f"REVOKE ALL ON SCHEMA {q_schema} FROM {quoted}")
            run(f"REVOKE CREATE ON SCHEMA {q_schema} FROM PUBLIC")
            run(f"GRANT USAGE ON SCHEMA {q_schema} TO {quoted}")
            run(f"REVOKE ALL ON ALL TABLES IN SCHEMA {q_schema} FROM {quoted}")
            run(_TABLES_SQL)
            for name, strict, retention, guarded in cursor.fetchall():
                grants.tables[name] = table_privileges(name, strict, retention, guarded)
            for name, privileges in grants.tables.items():
                table = f"{q_schema}.{connection.ops.quote_name(name)}"
                run(f"GRANT {', '.join(privileges)} ON TABLE {table} TO {quoted}")
            run(f"REVOKE ALL ON ALL SEQUENCES IN SCHEMA {q_schema} FROM {quoted}")
            run(f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {q_schema} TO {quoted}")
            run(f"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {q_schema} TO {quoted}")
            default = f"ALTER DEFAULT PRIVILEGES FOR ROLE {q_owner} IN SCHEMA {q_schema} GRANT"
            run(f"{default} {', '.join(READ_WRITE)} ON TABLES TO {quoted}")
            run(f"{default} USAGE, SELECT ON SEQUENCES TO {quoted}")
            run(f"{default} EXECUTE ON FUNCTIONS TO {quoted}")
    return grants


def _create(role: str, quoted: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role])
        if cursor.fetchone():
            return False
        try:
            with transaction.atomic():
                cursor.execute(
                    f"CREATE ROLE {quoted} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE "
                    "NOREPLICATION NOBYPASSRLS"
                )
        except DatabaseError as exc:  # created meanwhile by another run of this command
            if getattr(exc.__cause__, "sqlstate", None) != "42710":
                raise
            return False
    return True


def _check(role: str, owner: str) -> None:
    """Refuse a role with powers, one that acts as the owner, or one that owns anything."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT oid, rolcanlogin, {', '.join(POWERS)} FROM pg_roles WHERE rolname = %s",
            [role],
        )
        oid, can_login, *powers = cursor.fetchone()
        held = [text for text, has in zip(POWERS.values(), powers, strict=True) if has]
        if held:
            raise RoleError(
                f"{role} {' and '.join(held)}: the application's role must not. Name a new role "
                "(setup_app_role creates it), or remove these attributes first."
            )
        cursor.execute("SELECT pg_has_role(%s, %s, 'MEMBER')", [role, owner])
        if cursor.fetchone()[0]:
            raise RoleError(
                f"{role} is a member of {owner}, the tables' owner, so it could act as the "
                f"owner (TRUNCATE, ALTER, DROP): REVOKE {owner} FROM {role} first."
            )
        cursor.execute(_OWNED_SQL, {"oid": oid})
        owned = [name for (name,) in cursor.fetchall()]
        if owned:
            raise RoleError(
                f"{role} owns {', '.join(owned[:5])}{'…' if len(owned) > 5 else ''}: an owner may "
                f"TRUNCATE, ALTER and DROP. Give them to {owner} first (REASSIGN OWNED BY {role} "
                f"TO {owner}, as a superuser)."
            )
        if not can_login:
            cursor.execute(f"ALTER ROLE {connection.ops.quote_name(role)} LOGIN")


def _set_password(role: str, quoted: str, password: str) -> None:
    """Set the password, hashed here by libpq as the server wants it (SCRAM): the server and
    its logs never see the password itself."""
    from psycopg import sql

    raw = connection.connection
    hashed = raw.pgconn.encrypt_password(password.encode(), role.encode()).decode()
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER ROLE {quoted} PASSWORD {sql.Literal(hashed).as_string(raw)}")

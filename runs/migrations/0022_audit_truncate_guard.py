# TRUNCATE is neither UPDATE nor DELETE: the row triggers that keep snapshots and the timeline
# append-only (0002) never see it, and one statement empties a table, for its owner and for
# superusers alike. A statement-level BEFORE TRUNCATE trigger refuses it on every table of the
# audit trail (approvals adds its own in approvals/0020). It fires for superusers too; only a
# session in `session_replication_role = replica` (the test suite's flush between tests,
# tests/dbroles.py) or someone who disables the trigger gets past it, and verify_audit still
# finds what is missing then.
from django.db import migrations

FUNCTION = """
CREATE OR REPLACE FUNCTION taskpilots_refuse_truncate() RETURNS trigger AS $$
BEGIN
  RAISE EXCEPTION 'taskpilots: % is part of the audit trail (the record of what runs and people '
    'did, which verify_audit checks); TRUNCATE refused', TG_TABLE_NAME
    USING ERRCODE = 'restrict_violation',
      HINT = 'Nothing in TaskPilots truncates it: retention is prune_payloads, and a development '
        'database is reset by dropping it (make clean-var).';
END
$$ LANGUAGE plpgsql;
"""
TABLES = ["runs_run", "runs_step", "runs_snapshot", "runs_sideeffect", "runs_timelineevent"]


def guard(table: str) -> str:
    return (
        f"CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {table} "
        "FOR EACH STATEMENT EXECUTE FUNCTION taskpilots_refuse_truncate();"
    )


class Migration(migrations.Migration):
    dependencies = [("runs", "0021_status_domains")]

    operations = [
        migrations.RunSQL(
            FUNCTION, "DROP FUNCTION IF EXISTS taskpilots_refuse_truncate() CASCADE;"
        ),
        *[
            migrations.RunSQL(guard(t), f"DROP TRIGGER IF EXISTS {t}_no_truncate ON {t};")
            for t in TABLES
        ],
    ]

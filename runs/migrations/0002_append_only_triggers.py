# Snapshots and timeline events are append-only in the database itself, not only in the ORM:
# a raw UPDATE or DELETE is refused by a trigger.
from django.db import migrations

FUNCTION = """
CREATE OR REPLACE FUNCTION taskpilots_refuse_change() RETURNS trigger AS $$
BEGIN
  RAISE EXCEPTION 'taskpilots: % rows are append-only; % refused', TG_TABLE_NAME, TG_OP
    USING ERRCODE = 'restrict_violation';
END
$$ LANGUAGE plpgsql;
"""
TABLES = ["runs_snapshot", "runs_timelineevent"]


def trigger_sql(table: str) -> str:
    return (
        f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} "
        "FOR EACH ROW EXECUTE FUNCTION taskpilots_refuse_change();"
    )


class Migration(migrations.Migration):
    dependencies = [("runs", "0001_initial")]

    operations = [
        migrations.RunSQL(FUNCTION, "DROP FUNCTION IF EXISTS taskpilots_refuse_change() CASCADE;"),
        *[
            migrations.RunSQL(trigger_sql(t), f"DROP TRIGGER IF EXISTS {t}_append_only ON {t};")
            for t in TABLES
        ],
    ]

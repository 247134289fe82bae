# Sealed records (runs/seal.py, approvals/models/records.py): the records chain for the rows
# that belong to no run, with its head; decisions and rule versions append-only in the
# database like the timeline (a stricter function than the timeline's: retention's prune flag
# does not apply to them); TRUNCATE refused on every table of the people's side of the audit
# trail (runs/0022 for the core's); then every row written before seals existed is sealed as it
# is found now (on its run's timeline, or on the records chain).
import django.core.serializers.json
from django.db import migrations, models

STRICT = """
CREATE OR REPLACE FUNCTION taskpilots_refuse_any_change() RETURNS trigger AS $$
BEGIN
  RAISE EXCEPTION 'taskpilots: % rows are append-only; % refused', TG_TABLE_NAME, TG_OP
    USING ERRCODE = 'restrict_violation';
END
$$ LANGUAGE plpgsql;
"""
APPEND_ONLY = ["approvals_humandecision", "approvals_ruleversion", "approvals_auditrecord"]
GUARDED = [
    "approvals_approvalrequest",
    "approvals_takeover",
    "approvals_humandecision",
    "approvals_ruleversion",
    "approvals_toolpause",
    "approvals_toolmetadataoverride",
    "approvals_bulkaction",
    "approvals_bulkactionitem",
    "approvals_auditrecord",
    "approvals_auditrecordhead",
]
OVERRIDES = "approvals_toolmetadataoverride"


def append_only(table: str, function: str = "taskpilots_refuse_any_change") -> str:
    return (
        f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} "
        f"FOR EACH ROW EXECUTE FUNCTION {function}();"
    )


def guard(table: str) -> str:
    return (
        f"CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {table} "
        "FOR EACH STATEMENT EXECUTE FUNCTION taskpilots_refuse_truncate();"
    )


def seal_existing(apps, schema_editor):
    from runs import seal

    seal.backfill(lambda label: apps.get_model(label))


class Migration(migrations.Migration):
    dependencies = [
        ("approvals", "0019_failure_idx_tool_paused"),
        ("runs", "0022_audit_truncate_guard"),
    ]

    operations = [
        migrations.CreateModel(
            name="AuditRecord",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("seq", models.PositiveIntegerField(unique=True)),
                ("at", models.DateTimeField()),
                ("actor", models.CharField(max_length=200)),
                ("verb", models.CharField(max_length=80)),
                (
                    "data",
                    models.JSONField(encoder=django.core.serializers.json.DjangoJSONEncoder),
                ),
                ("data_digest", models.CharField(max_length=64)),
                ("prev_hash", models.CharField(max_length=64)),
                ("hash", models.CharField(max_length=64)),
            ],
            options={"ordering": ["seq"]},
        ),
        migrations.CreateModel(
            name="AuditRecordHead",
            fields=[
                (
                    "id",
                    models.PositiveSmallIntegerField(default=1, primary_key=True, serialize=False),
                ),
                ("seq", models.PositiveIntegerField(default=0)),
                ("hash", models.CharField(blank=True, default="", max_length=64)),
            ],
        ),
        migrations.RunSQL(
            "INSERT INTO approvals_auditrecordhead (id, seq, hash) VALUES (1, 0, '');",
            migrations.RunSQL.noop,
        ),
        migrations.RunSQL(
            STRICT, "DROP FUNCTION IF EXISTS taskpilots_refuse_any_change() CASCADE;"
        ),
        *[
            migrations.RunSQL(append_only(t), f"DROP TRIGGER IF EXISTS {t}_append_only ON {t};")
            for t in APPEND_ONLY
        ],
        # Decisions over tools' metadata: the same strict function (retention never prunes them).
        migrations.RunSQL(
            f"DROP TRIGGER {OVERRIDES}_append_only ON {OVERRIDES}; {append_only(OVERRIDES)}",
            f"DROP TRIGGER {OVERRIDES}_append_only ON {OVERRIDES}; "
            f"{append_only(OVERRIDES, 'taskpilots_refuse_change')}",
        ),
        *[
            migrations.RunSQL(guard(t), f"DROP TRIGGER IF EXISTS {t}_no_truncate ON {t};")
            for t in GUARDED
        ],
        migrations.RunPython(seal_existing, migrations.RunPython.noop),
    ]

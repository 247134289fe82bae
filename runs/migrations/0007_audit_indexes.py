# Indexes for the audit search and for retention. Plain SQL (no model state): the target
# index needs varchar_pattern_ops for prefix search, the finished index is partial.
from django.db import migrations

INDEXES = [
    (
        "side_effect_target_idx",
        "CREATE INDEX IF NOT EXISTS side_effect_target_idx "
        "ON runs_sideeffect (target varchar_pattern_ops, run_id);",
    ),
    (
        "run_finished_idx",
        "CREATE INDEX IF NOT EXISTS run_finished_idx "
        "ON runs_run (finished_at) WHERE finished_at IS NOT NULL;",
    ),
]


class Migration(migrations.Migration):
    dependencies = [("runs", "0006_timeline_data_digest")]

    operations = [migrations.RunSQL(sql, f"DROP INDEX IF EXISTS {name};") for name, sql in INDEXES]

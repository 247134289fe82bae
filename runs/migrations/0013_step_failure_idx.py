# The rule tester's recent failures (approvals/rules.py: recent_failures) read the newest
# failing steps; without this index they walked every step backwards past the ones that never
# failed (~50,000 of them at 100,000 runs). Partial: a step that never fails is never in it, so
# the engine's inserts and successful updates do not touch it. Plain SQL, no model state (as
# 0007).
from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("runs", "0012_worker_heartbeats")]

    operations = [
        migrations.RunSQL(
            "CREATE INDEX IF NOT EXISTS step_failure_idx ON runs_step (id) WHERE error_class <> '';",
            "DROP INDEX IF EXISTS step_failure_idx;",
        )
    ]

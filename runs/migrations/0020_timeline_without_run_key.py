# The timeline's foreign key to its run goes: each event is written by the statement that moves
# its run's chain head (the run row is locked and must exist, or nothing is written), and the
# key's check cost one lookup per event at every commit, the hot path's most frequent row.
# What the key also guarded, that a run with events cannot be deleted, a trigger now refuses for
# every run: a run is the audit record's subject and is never deleted.
import django.db.models.deletion
from django.db import migrations, models

REFUSE_DELETE = """
CREATE OR REPLACE FUNCTION taskpilots_refuse_run_delete() RETURNS trigger AS $$
BEGIN
  RAISE EXCEPTION 'taskpilots: runs are never deleted (run %)', OLD.id
    USING ERRCODE = 'restrict_violation';
END
$$ LANGUAGE plpgsql;
CREATE TRIGGER runs_run_never_deleted BEFORE DELETE ON runs_run
  FOR EACH ROW EXECUTE FUNCTION taskpilots_refuse_run_delete();
"""
ALLOW_DELETE = """
DROP TRIGGER IF EXISTS runs_run_never_deleted ON runs_run;
DROP FUNCTION IF EXISTS taskpilots_refuse_run_delete();
"""


class Migration(migrations.Migration):
    dependencies = [("runs", "0019_notify_on_requeue")]

    operations = [
        migrations.AlterField(
            model_name="timelineevent",
            name="run",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="events",
                to="runs.run",
            ),
        ),
        migrations.RunSQL(REFUSE_DELETE, ALLOW_DELETE),
    ]

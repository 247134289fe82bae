# The timeline chain now hashes the digest of each event's data instead of the data itself, so a
# retention job can drop old payloads while the chain stays verifiable. Existing chains are
# re-hashed here; the append-only trigger lets exactly this kind of update through when the
# transaction sets taskpilots.prune (the prune command does the same).
import hashlib
import json

from django.core.serializers.json import DjangoJSONEncoder
from django.db import migrations, models

FUNCTION = """
CREATE OR REPLACE FUNCTION taskpilots_refuse_change() RETURNS trigger AS $$
BEGIN
  IF TG_OP = 'UPDATE' AND current_setting('taskpilots.prune', true) = 'on' THEN
    RETURN NEW;
  END IF;
  RAISE EXCEPTION 'taskpilots: % rows are append-only; % refused', TG_TABLE_NAME, TG_OP
    USING ERRCODE = 'restrict_violation';
END
$$ LANGUAGE plpgsql;
"""
OLD_FUNCTION = """
CREATE OR REPLACE FUNCTION taskpilots_refuse_change() RETURNS trigger AS $$
BEGIN
  RAISE EXCEPTION 'taskpilots: % rows are append-only; % refused', TG_TABLE_NAME, TG_OP
    USING ERRCODE = 'restrict_violation';
END
$$ LANGUAGE plpgsql;
"""


def _canonical(value):
    return json.dumps(
        value, cls=DjangoJSONEncoder, sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )


def rehash(apps, schema_editor):
    TimelineEvent = apps.get_model("runs", "TimelineEvent")
    Run = apps.get_model("runs", "Run")
    schema_editor.execute("SET LOCAL taskpilots.prune = 'on'")
    run_ids = TimelineEvent.objects.values_list("run_id", flat=True).distinct()
    for run_id in run_ids:
        prev = ""
        for event in TimelineEvent.objects.filter(run_id=run_id).order_by("seq"):
            data_digest = hashlib.sha256(_canonical(event.data).encode()).hexdigest()
            material = _canonical(
                [event.seq, event.at.isoformat(), event.actor, event.verb, data_digest, prev]
            )
            event_hash = hashlib.sha256(material.encode()).hexdigest()
            TimelineEvent.objects.filter(pk=event.pk).update(
                data_digest=data_digest, prev_hash=prev, hash=event_hash
            )
            prev = event_hash
        Run.objects.filter(pk=run_id).update(event_hash=prev)


class Migration(migrations.Migration):
    dependencies = [("runs", "0005_run_created_id_index")]

    operations = [
        migrations.RunSQL(FUNCTION, OLD_FUNCTION),
        migrations.AddField(
            model_name="timelineevent",
            name="data_digest",
            field=models.CharField(default="", max_length=64),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="timelineevent",
            name="pruned",
            field=models.BooleanField(default=False),
        ),
        migrations.AddField(
            model_name="snapshot",
            name="pruned",
            field=models.BooleanField(default=False),
        ),
        migrations.RunPython(rehash, migrations.RunPython.noop),
    ]

# The engine's hot path writes fewer index entries per step (docs/benchmarks.md): foreign keys
# already covered by a composite index lose their own, the timeline's verb and actor indexes
# become partial (the engine's own events write neither), the idempotency key is unique by a
# constraint (no LIKE index), and the runnable-runs index no longer holds updated_at, so the run
# row's per-transaction update can be HOT (free space kept on its pages by a lower fillfactor).

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0010_tp_assert"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        # The new unique constraint first: the key is never without one.
        migrations.AddConstraint(
            model_name="sideeffect",
            constraint=models.UniqueConstraint(
                fields=("idempotency_key",), name="side_effect_unique_key"
            ),
        ),
        migrations.RemoveIndex(
            model_name="run",
            name="run_runnable_idx",
        ),
        migrations.RemoveIndex(
            model_name="timelineevent",
            name="timeline_verb_idx",
        ),
        migrations.RemoveIndex(
            model_name="timelineevent",
            name="timeline_actor_idx",
        ),
        migrations.AlterField(
            model_name="sideeffect",
            name="idempotency_key",
            field=models.CharField(max_length=255),
        ),
        migrations.AlterField(
            model_name="sideeffect",
            name="run",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="side_effects",
                to="runs.run",
            ),
        ),
        migrations.AlterField(
            model_name="sideeffect",
            name="snapshot",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to="runs.snapshot",
            ),
        ),
        migrations.AlterField(
            model_name="step",
            name="run",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="steps",
                to="runs.run",
            ),
        ),
        migrations.AlterField(
            model_name="timelineevent",
            name="run",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="events",
                to="runs.run",
            ),
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(
                condition=models.Q(("status__in", ["pending", "running", "compensating"])),
                fields=["created_at"],
                name="run_runnable_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="timelineevent",
            index=models.Index(
                condition=models.Q(("verb__in", ["run.needs_human", "run.sla_breached"])),
                fields=["at"],
                name="timeline_notify_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="timelineevent",
            index=models.Index(
                condition=models.Q(("actor", "system"), _negated=True),
                fields=["actor", "at"],
                name="timeline_actor_idx",
            ),
        ),
        migrations.RunSQL(
            "ALTER TABLE runs_run SET (fillfactor = 70)",
            "ALTER TABLE runs_run RESET (fillfactor)",
        ),
    ]

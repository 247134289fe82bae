# The metrics dashboard's durations as sketches (day and hour rows), and the stored counters
# behind /metrics. The old day rows kept every duration: they are dropped, and rebuilt with
# sketches by `manage.py rollup_metrics --full` (until then the dashboard reads those days from
# the run rows: the same figures, more slowly).

import django.contrib.postgres.fields
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("approvals", "0009_decisions_name_what_was_shown"),
    ]

    operations = [
        migrations.RunSQL("DELETE FROM approvals_metricsday", migrations.RunSQL.noop),
        migrations.RemoveField(model_name="metricsday", name="close_s"),
        migrations.RemoveField(model_name="metricsday", name="recover_s"),
        migrations.RemoveField(model_name="metricsday", name="resume_s"),
        migrations.RemoveField(model_name="metricsday", name="handling_s"),
        migrations.RemoveField(model_name="metricsday", name="latency_ms"),
        migrations.AddField(
            model_name="metricsday",
            name="sketch_kinds",
            field=django.contrib.postgres.fields.ArrayField(
                base_field=models.SmallIntegerField(), default=list
            ),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="metricsday",
            name="sketch_bins",
            field=django.contrib.postgres.fields.ArrayField(
                base_field=models.IntegerField(), default=list
            ),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="metricsday",
            name="sketch_counts",
            field=django.contrib.postgres.fields.ArrayField(
                base_field=models.IntegerField(), default=list
            ),
            preserve_default=False,
        ),
        migrations.CreateModel(
            name="MetricsHour",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("runs", models.IntegerField()),
                ("finished", models.IntegerField()),
                ("succeeded", models.IntegerField()),
                ("faulted_finished", models.IntegerField()),
                ("auto_recovered", models.IntegerField()),
                ("human_stepped_in", models.IntegerField()),
                ("takeovers", models.IntegerField()),
                ("runs_taken_over", models.IntegerField()),
                ("second_intervention", models.IntegerField()),
                ("failed_steps", models.IntegerField()),
                ("recovered", models.IntegerField()),
                ("recovered_locally", models.IntegerField()),
                ("tool_calls", models.IntegerField()),
                ("tool_failures", models.IntegerField()),
                ("steps_committed", models.IntegerField()),
                ("steps_duplicated", models.IntegerField()),
                ("steps_resent", models.IntegerField()),
                ("wrong_retries", models.IntegerField()),
                ("committed", models.IntegerField()),
                ("covered", models.IntegerField()),
                ("snapshots", models.IntegerField()),
                ("missing", models.IntegerField()),
                ("settled", models.IntegerField()),
                ("expired", models.IntegerField()),
                ("decided", models.IntegerField()),
                (
                    "tool_names",
                    django.contrib.postgres.fields.ArrayField(base_field=models.TextField()),
                ),
                (
                    "tool_classes",
                    django.contrib.postgres.fields.ArrayField(base_field=models.TextField()),
                ),
                (
                    "tool_counts",
                    django.contrib.postgres.fields.ArrayField(base_field=models.IntegerField()),
                ),
                (
                    "sketch_kinds",
                    django.contrib.postgres.fields.ArrayField(
                        base_field=models.SmallIntegerField()
                    ),
                ),
                (
                    "sketch_bins",
                    django.contrib.postgres.fields.ArrayField(base_field=models.IntegerField()),
                ),
                (
                    "sketch_counts",
                    django.contrib.postgres.fields.ArrayField(base_field=models.IntegerField()),
                ),
                ("hour", models.DateTimeField(unique=True)),
                ("computed_at", models.DateTimeField(default=django.utils.timezone.now)),
            ],
            options={"abstract": False},
        ),
        migrations.CreateModel(
            name="MetricsCounter",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("family", models.CharField(max_length=32)),
                ("name", models.CharField(max_length=200)),
                ("detail", models.CharField(blank=True, max_length=50)),
                ("value", models.BigIntegerField(default=0)),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(
                        fields=("family", "name", "detail"), name="metricscounter_unique"
                    )
                ],
            },
        ),
        migrations.CreateModel(
            name="MetricsCounterMark",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("name", models.CharField(default="counters", max_length=32, unique=True)),
                ("through", models.DateTimeField()),
            ],
        ),
    ]

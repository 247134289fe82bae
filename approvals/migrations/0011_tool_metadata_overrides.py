# Admins' decisions over tools' own metadata (risk, side effect, dedupes by key), with their
# history: rows are only ever added, which the same trigger as the timeline's enforces (the
# engine's caches compare the table's row count and newest id to notice a change).

import django.contrib.postgres.fields
import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("approvals", "0010_metrics_sketches_hours_counters"),
        ("runs", "0006_timeline_data_digest"),  # taskpilots_refuse_change()
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="ToolMetadataOverride",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("tool", models.CharField(max_length=150)),
                (
                    "risk",
                    models.CharField(
                        blank=True,
                        choices=[("low", "Low"), ("medium", "Medium"), ("high", "High")],
                        default="",
                        max_length=10,
                    ),
                ),
                ("side_effect", models.BooleanField(blank=True, null=True)),
                ("dedupes_by_key", models.BooleanField(blank=True, null=True)),
                ("reason", models.TextField()),
                ("tool_metadata", models.JSONField(default=dict)),
                ("before", models.JSONField(default=dict)),
                (
                    "loosened",
                    django.contrib.postgres.fields.ArrayField(
                        base_field=models.CharField(max_length=20), blank=True, default=list
                    ),
                ),
                ("changed_at", models.DateTimeField(default=django.utils.timezone.now)),
                (
                    "changed_by",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
            options={
                "indexes": [models.Index(fields=["tool", "-id"], name="tool_override_newest_idx")],
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(
                            ("risk", ""), ("risk__in", ["low", "medium", "high"]), _connector="OR"
                        ),
                        name="tool_override_risk_valid",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(("reason__regex", "\\S")),
                        name="tool_override_reason_given",
                    ),
                ],
            },
        ),
        migrations.RunSQL(
            "CREATE TRIGGER approvals_toolmetadataoverride_append_only BEFORE UPDATE OR DELETE "
            "ON approvals_toolmetadataoverride "
            "FOR EACH ROW EXECUTE FUNCTION taskpilots_refuse_change();",
            "DROP TRIGGER IF EXISTS approvals_toolmetadataoverride_append_only "
            "ON approvals_toolmetadataoverride;",
        ),
    ]

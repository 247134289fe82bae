# Two failure classes (empty_result, api_drift), their default rules next to the others (before
# the catch-all at 1000), and pauses TaskPilots opens itself (paused_by empty) for API drift.

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

RULES = [
    dict(position=70, name="Empty result: a person checks the data", failure_class="empty_result",
         action="escalate", queue="support"),
    dict(position=80, name="API drift: pause the tool, admins fix it", failure_class="api_drift",
         action="escalate", queue="admin"),
]  # fmt: skip


# As in 0006: a shipped rule's history starts with its version as created by nobody.
FIELDS = (
    "position", "name", "enabled", "workflow", "step", "tool", "failure_class", "risk", "action",
    "queue", "max_attempts", "backoff_base_seconds", "backoff_cap_seconds", "wait_window_seconds",
    "probe_interval_seconds", "approval_sla_seconds", "escalate_to", "escalate_after_seconds",
)  # fmt: skip


def forwards(apps, schema_editor):
    EscalationRule = apps.get_model("approvals", "EscalationRule")
    RuleVersion = apps.get_model("approvals", "RuleVersion")
    for values in RULES:
        rule, created = EscalationRule.objects.get_or_create(name=values["name"], defaults=values)
        if created:
            RuleVersion.objects.get_or_create(
                rule=rule,
                version=rule.version,
                defaults={
                    "change": "created",
                    "data": {name: getattr(rule, name) for name in FIELDS},
                    "changed_at": rule.updated_at,
                },
            )


def backwards(apps, schema_editor):
    EscalationRule = apps.get_model("approvals", "EscalationRule")
    RuleVersion = apps.get_model("approvals", "RuleVersion")
    names = [r["name"] for r in RULES]
    RuleVersion.objects.filter(rule__name__in=names).delete()
    EscalationRule.objects.filter(name__in=names).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("approvals", "0013_inputs_approval_conditions"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name="escalationrule",
            name="rule_failure_class_valid",
        ),
        migrations.AlterField(
            model_name="escalationrule",
            name="failure_class",
            field=models.CharField(
                blank=True,
                choices=[
                    ("transient", "Transient (retryable)"),
                    ("outage", "External outage"),
                    ("invalid_input", "Invalid input (data uncertainty)"),
                    ("permission", "Permission denied"),
                    ("unknown_outcome", "Unknown outcome (side-effect boundary)"),
                    ("empty_result", "Empty result"),
                    ("api_drift", "API version drift"),
                    ("timeout", "Wait timed out"),
                ],
                default="",
                max_length=20,
            ),
        ),
        migrations.AlterField(
            model_name="toolpause",
            name="paused_by",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.AddConstraint(
            model_name="escalationrule",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("failure_class", ""),
                    (
                        "failure_class__in",
                        [
                            "transient",
                            "outage",
                            "invalid_input",
                            "permission",
                            "unknown_outcome",
                            "empty_result",
                            "api_drift",
                            "timeout",
                        ],
                    ),
                    _connector="OR",
                ),
                name="rule_failure_class_valid",
            ),
        ),
        migrations.RunPython(forwards, backwards),
    ]

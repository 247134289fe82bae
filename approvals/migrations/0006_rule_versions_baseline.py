# Every rule gets its history from here on: the rules that exist now are recorded as their
# current version, created by nobody (the migrations that shipped them).
from django.db import migrations

FIELDS = (
    "position", "name", "enabled", "workflow", "step", "tool", "failure_class", "risk", "action",
    "queue", "max_attempts", "backoff_base_seconds", "backoff_cap_seconds", "wait_window_seconds",
    "probe_interval_seconds", "approval_sla_seconds", "escalate_to", "escalate_after_seconds",
)  # fmt: skip


def forwards(apps, schema_editor):
    EscalationRule = apps.get_model("approvals", "EscalationRule")
    RuleVersion = apps.get_model("approvals", "RuleVersion")
    for rule in EscalationRule.objects.all():
        RuleVersion.objects.get_or_create(
            rule=rule,
            version=rule.version,
            defaults={
                "change": "created",
                "data": {name: getattr(rule, name) for name in FIELDS},
                "changed_at": rule.updated_at,
            },
        )


class Migration(migrations.Migration):
    dependencies = [("approvals", "0005_rules_history_pauses_notifications")]

    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]

# The three console roles and the escalation rules TaskPilots ships with. Admins edit the rules
# in the console; these are only the starting point.
from django.db import migrations

GROUPS = ["support", "auditor", "admin"]

DEFAULT_RULES = [
    dict(position=10, name="Retry transient errors", failure_class="transient", action="retry",
         queue="ops", max_attempts=5, backoff_base_seconds=1, backoff_cap_seconds=60),
    dict(position=20, name="Wait out an outage, then escalate", failure_class="outage",
         action="wait", queue="ops", wait_window_seconds=900, probe_interval_seconds=30),
    dict(position=30, name="Unknown outcome: a person confirms", failure_class="unknown_outcome",
         action="escalate", queue="support"),
    dict(position=40, name="Invalid input: a person checks the data",
         failure_class="invalid_input", action="escalate", queue="support"),
    dict(position=50, name="Permission denied: admins fix access", failure_class="permission",
         action="escalate", queue="admin"),
    dict(position=60, name="Timed-out wait: a person decides", failure_class="timeout",
         action="escalate", queue="support"),
    dict(position=1000, name="Anything else: operations", action="escalate", queue="ops"),
]  # fmt: skip


def forwards(apps, schema_editor):
    Group = apps.get_model("auth", "Group")
    EscalationRule = apps.get_model("approvals", "EscalationRule")
    for name in GROUPS:
        Group.objects.get_or_create(name=name)
    for rule in DEFAULT_RULES:
        EscalationRule.objects.get_or_create(name=rule["name"], defaults=rule)


def backwards(apps, schema_editor):
    EscalationRule = apps.get_model("approvals", "EscalationRule")
    EscalationRule.objects.filter(name__in=[r["name"] for r in DEFAULT_RULES]).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("approvals", "0001_initial"),
        ("auth", "0012_alter_user_first_name_max_length"),
    ]

    operations = [migrations.RunPython(forwards, backwards)]

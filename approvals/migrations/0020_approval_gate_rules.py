# Approval rules for the gate in front of every side effect (runs.engine.gate, approvals/gate.py):
# the `approve` action, thresholds in a currency and by records touched, how many approvers are
# needed at or below a threshold, and the rules TaskPilots ships with.
from decimal import Decimal

from django.db import migrations, models

FIELDS = (
    "position", "name", "enabled", "workflow", "step", "tool", "failure_class", "risk", "action",
    "queue", "max_attempts", "backoff_base_seconds", "backoff_cap_seconds", "wait_window_seconds",
    "probe_interval_seconds", "approval_sla_seconds", "escalate_to", "escalate_after_seconds",
    "approvers_required", "approvers_below", "amount_param", "amount_above", "amount_currency",
    "records_param", "records_above",
)  # fmt: skip
ACTIONS = ["retry", "wait", "degrade", "compensate", "escalate", "fail", "approve"]

# Gates the workflow does not have to declare. Admins edit them in the console.
DEFAULT_RULES = [
    dict(position=1100, name="Large amounts: two people approve", action="approve", queue="support",
         approvers_required=2, approvers_below=0, amount_above=Decimal("10000"),
         amount_currency="USD"),
    dict(position=1110, name="Writes touching more than 100 records: a person approves",
         action="approve", queue="support", approvers_required=1, approvers_below=0,
         records_above=100),
    dict(position=1120, name="High-risk writes: a person approves each call", action="approve",
         queue="support", risk="high", approvers_required=1, approvers_below=0, enabled=False),
]  # fmt: skip


def forwards(apps, schema_editor):
    EscalationRule = apps.get_model("approvals", "EscalationRule")
    RuleVersion = apps.get_model("approvals", "RuleVersion")
    # Two-person rules with a threshold keep their meaning: one approver at or below it.
    EscalationRule.objects.filter(approvers_required=2).exclude(amount_param="").update(
        approvers_below=1
    )
    for fields in DEFAULT_RULES:
        rule, created = EscalationRule.objects.get_or_create(name=fields["name"], defaults=fields)
        if created:
            data = {name: getattr(rule, name) for name in FIELDS}
            RuleVersion.objects.create(rule=rule, version=rule.version, change="created", data=data)


def backwards(apps, schema_editor):
    EscalationRule = apps.get_model("approvals", "EscalationRule")
    RuleVersion = apps.get_model("approvals", "RuleVersion")
    names = [r["name"] for r in DEFAULT_RULES]
    RuleVersion.objects.filter(rule__name__in=names).delete()
    EscalationRule.objects.filter(name__in=names).delete()


class Migration(migrations.Migration):
    dependencies = [("approvals", "0019_failure_idx_tool_paused")]

    operations = [
        migrations.RemoveConstraint(model_name="escalationrule", name="rule_action_valid"),
        migrations.AddField(
            model_name="escalationrule",
            name="amount_currency",
            field=models.CharField(blank=True, default="", max_length=3),
        ),
        migrations.AddField(
            model_name="escalationrule",
            name="approvers_below",
            field=models.PositiveSmallIntegerField(default=0),
        ),
        migrations.AddField(
            model_name="escalationrule",
            name="records_above",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="escalationrule",
            name="records_param",
            field=models.CharField(blank=True, default="", max_length=100),
        ),
        migrations.AlterField(
            model_name="escalationrule",
            name="action",
            field=models.CharField(
                choices=[
                    ("retry", "Retry with backoff"),
                    ("wait", "Wait for the outage"),
                    ("degrade", "Degrade to the fallback tool"),
                    ("compensate", "Compensate committed side effects"),
                    ("escalate", "Escalate to a person"),
                    ("fail", "Fail the run"),
                    ("approve", "Ask a person to approve the call"),
                ],
                max_length=20,
            ),
        ),
        migrations.AddConstraint(
            model_name="escalationrule",
            constraint=models.CheckConstraint(
                condition=models.Q(("action__in", ACTIONS)), name="rule_action_valid"
            ),
        ),
        migrations.AddConstraint(
            model_name="escalationrule",
            constraint=models.CheckConstraint(
                condition=models.Q(("approvers_below__lt", models.F("approvers_required"))),
                name="rule_approvers_below_fewer",
            ),
        ),
        migrations.RunPython(forwards, backwards),
    ]

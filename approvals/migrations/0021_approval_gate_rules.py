# Approval rules for the gate in front of every side effect (runs.engine.gate, approvals/gate.py):
# the `approve` action, thresholds in a currency and by records touched, and how many approvers
# are needed at or below a threshold. The rules TaskPilots ships with: 0022.
from django.db import migrations, models

ACTIONS = ["retry", "wait", "degrade", "compensate", "escalate", "fail", "approve"]


class Migration(migrations.Migration):
    dependencies = [("approvals", "0020_sealed_records")]

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
    ]

# The approval rules TaskPilots ships with (gates the workflow does not have to declare), and the
# two-person rules that existed before keep their meaning: one approver at or below their
# threshold.
from decimal import Decimal

from django.db import migrations

FIELDS = (
    "position", "name", "enabled", "workflow", "step", "tool", "failure_class", "risk", "action",
    "queue", "max_attempts", "backoff_base_seconds", "backoff_cap_seconds", "wait_window_seconds",
    "probe_interval_seconds", "approval_sla_seconds", "escalate_to", "escalate_after_seconds",
    "approvers_required", "approvers_below", "amount_param", "amount_above", "amount_currency",
    "records_param", "records_above",
)  # fmt: skip
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
    from runs import seal

    EscalationRule = apps.get_model("approvals", "EscalationRule")
    RuleVersion = apps.get_model("approvals", "RuleVersion")
    # Two-person rules with a threshold keep their meaning: one approver at or below it.
    kept = EscalationRule.objects.filter(approvers_required=2).exclude(amount_param="")
    changed = list(kept.values_list("pk", flat=True))
    kept.update(approvers_below=1)
    for fields in DEFAULT_RULES:
        rule, created = EscalationRule.objects.get_or_create(name=fields["name"], defaults=fields)
        if created:
            data = {name: getattr(rule, name) for name in FIELDS}
            RuleVersion.objects.create(rule=rule, version=rule.version, change="created", data=data)
    # Sealed as the rows are now (runs/seal.py): the new rules and their versions, and the
    # rules this migration changed.
    seal.seal_rows(EscalationRule, changed, get_model=apps.get_model)
    seal.backfill(apps.get_model)
    # The rows' deferred key checks now, not at commit: a later migration may alter the tables
    # in this same transaction (tests migrate back and forth in one).
    schema_editor.execute("SET CONSTRAINTS ALL IMMEDIATE")


def backwards(apps, schema_editor):
    EscalationRule = apps.get_model("approvals", "EscalationRule")
    RuleVersion = apps.get_model("approvals", "RuleVersion")
    names = [r["name"] for r in DEFAULT_RULES]
    rules = list(EscalationRule.objects.filter(name__in=names).values_list("pk", flat=True))
    # Rule versions are append-only (approvals 0020): this migration takes back its own.
    trigger = "ALTER TABLE approvals_ruleversion {} TRIGGER approvals_ruleversion_append_only"
    schema_editor.execute(trigger.format("DISABLE"))
    RuleVersion.objects.filter(rule_id__in=rules).delete()
    EscalationRule.objects.filter(pk__in=rules).delete()
    schema_editor.execute("SET CONSTRAINTS ALL IMMEDIATE")
    schema_editor.execute(trigger.format("ENABLE"))


class Migration(migrations.Migration):
    dependencies = [("approvals", "0021_approval_gate_rules")]

    operations = [migrations.RunPython(forwards, backwards)]

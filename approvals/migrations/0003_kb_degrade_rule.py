# The support workflow's knowledge-base search has a fallback (the static FAQ): when the search is
# failing, answer from the FAQ instead of waiting or asking a person.
from django.db import migrations

RULE = {
    "position": 5,
    "name": "Knowledge base failing: answer from the FAQ",
    "tool": "kb.search",
    "action": "degrade",
    "queue": "ops",
}


def forwards(apps, schema_editor):
    EscalationRule = apps.get_model("approvals", "EscalationRule")
    EscalationRule.objects.get_or_create(name=RULE["name"], defaults=RULE)


def backwards(apps, schema_editor):
    apps.get_model("approvals", "EscalationRule").objects.filter(name=RULE["name"]).delete()


class Migration(migrations.Migration):
    dependencies = [("approvals", "0002_groups_and_default_rules")]

    operations = [migrations.RunPython(forwards, backwards)]

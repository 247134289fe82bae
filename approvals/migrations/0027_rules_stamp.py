"""The approval rules' stamp (approvals.models.RulesStamp): one row, replaced by a statement
trigger in every transaction that changes escalation rules, whatever the path."""

from django.db import migrations, models

CREATE = """
INSERT INTO approvals_rulesstamp (id, stamp) VALUES (1, gen_random_uuid()::text);

CREATE OR REPLACE FUNCTION approvals_rules_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO approvals_rulesstamp (id, stamp) VALUES (1, gen_random_uuid()::text)
    ON CONFLICT (id) DO UPDATE SET stamp = EXCLUDED.stamp;
    RETURN NULL;
END $$;

CREATE TRIGGER approvals_rules_changed
AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON approvals_escalationrule
FOR EACH STATEMENT EXECUTE FUNCTION approvals_rules_changed();
"""

DROP = """
DROP TRIGGER IF EXISTS approvals_rules_changed ON approvals_escalationrule;
DROP FUNCTION IF EXISTS approvals_rules_changed();
"""


class Migration(migrations.Migration):
    dependencies = [
        ("approvals", "0026_slack"),
    ]

    operations = [
        migrations.CreateModel(
            name="RulesStamp",
            fields=[
                (
                    "id",
                    models.PositiveSmallIntegerField(default=1, primary_key=True, serialize=False),
                ),
                ("stamp", models.CharField(max_length=36)),
            ],
            options={
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(("id", 1)), name="rules_stamp_one_row"
                    )
                ],
            },
        ),
        migrations.RunSQL(CREATE, DROP),
    ]

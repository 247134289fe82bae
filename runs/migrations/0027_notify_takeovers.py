# The notification scan's partial index also covers run.taken_over and run.released (a Slack
# message about the run's open request loses or gets back its buttons: approvals/slack.py).
# In the migration's transaction, as 0026 did: the partial index holds only the notifying
# verbs, but building it reads the whole timeline while writes to it wait.

from django.db import migrations, models

VERBS = [
    "run.needs_human",
    "run.sla_breached",
    "side_effect.external_mismatch",
    "tool.paused",
    "run.requeued",
    "approval.first_approved",
    "approval.approved",
    "approval.approved_with_edits",
    "approval.rejected",
    "approval.expired",
    "approval.cancelled",
    "run.taken_over",
    "run.released",
]


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0026_notify_slack_updates"),
    ]

    operations = [
        migrations.RemoveIndex(model_name="timelineevent", name="timeline_notify_idx"),
        migrations.AddIndex(
            model_name="timelineevent",
            index=models.Index(
                condition=models.Q(("verb__in", VERBS)),
                fields=["at"],
                name="timeline_notify_idx",
            ),
        ),
    ]

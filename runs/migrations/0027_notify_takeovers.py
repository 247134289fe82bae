# The notification scan's partial index also covers run.taken_over and run.released (a Slack
# message about the run's open request loses or gets back its buttons: approvals/slack.py).
# Built concurrently: the timeline is the largest table, and writes go on meanwhile.

from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
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
    atomic = False

    dependencies = [
        ("runs", "0026_notify_slack_updates"),
    ]

    operations = [
        RemoveIndexConcurrently(model_name="timelineevent", name="timeline_notify_idx"),
        AddIndexConcurrently(
            model_name="timelineevent",
            index=models.Index(
                condition=models.Q(("verb__in", VERBS)),
                fields=["at"],
                name="timeline_notify_idx",
            ),
        ),
    ]

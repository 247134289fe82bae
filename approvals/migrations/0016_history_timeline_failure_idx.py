# Rules tested against history (approvals/rules_history.py) read the routing decisions of the
# last 7 or 30 days from the timeline, newest first. Without this index that is a scan of every
# event; partial, so only failure events (a small share) write to it. Plain SQL on the runs
# table, no model state (as runs 0013): the events are the engine's, the reader is here.
from django.db import migrations

VERBS = (
    "step.retry_scheduled",
    "step.waiting_for_tool",
    "step.escalated",
    "step.failed",
    "step.unknown_outcome",
    "step.degraded",
)


class Migration(migrations.Migration):
    dependencies = [
        ("approvals", "0015_twoperson_approvals"),
        ("runs", "0017_notify_on_tool_paused"),
    ]

    operations = [
        migrations.RunSQL(
            "CREATE INDEX IF NOT EXISTS runs_timeline_failure_idx ON runs_timelineevent (at) "
            "WHERE verb IN (" + ", ".join(f"'{verb}'" for verb in VERBS) + ");",
            "DROP INDEX IF EXISTS runs_timeline_failure_idx;",
        )
    ]

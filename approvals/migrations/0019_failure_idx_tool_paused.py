# The history preview (approvals/rules_history.py) reads `step.tool_paused` too: a step whose own
# call drifted and paused its tool. The failure index's verb list must name it, or the scan
# cannot use the index (tests/approvals/test_rules_history.py checks the plan). The new index is
# built next to the old one, then takes its name, in one transaction (as 0016, not concurrently:
# migrations are tested inside transactions).
from django.db import migrations

_OLD_VERBS = (
    "step.retry_scheduled",
    "step.waiting_for_tool",
    "step.escalated",
    "step.failed",
    "step.unknown_outcome",
    "step.degraded",
)
# As written, not imported: a later change to the preview's list needs its own migration.
_NEW_VERBS = (*_OLD_VERBS, "step.tool_paused")


def _listed(verbs) -> str:
    return ", ".join(f"'{verb}'" for verb in verbs)


def _create(verbs: str) -> str:
    return (
        "CREATE INDEX IF NOT EXISTS runs_timeline_failure_idx_new "
        f"ON runs_timelineevent (at) WHERE verb IN ({verbs});"
    )


_SWAP = (
    "DROP INDEX IF EXISTS runs_timeline_failure_idx;",
    "ALTER INDEX runs_timeline_failure_idx_new RENAME TO runs_timeline_failure_idx;",
)


class Migration(migrations.Migration):
    dependencies = [("approvals", "0018_live_claims")]

    operations = [
        migrations.RunSQL(
            [_create(_listed(_NEW_VERBS)), *_SWAP], [_create(_listed(_OLD_VERBS)), *_SWAP]
        ),
    ]

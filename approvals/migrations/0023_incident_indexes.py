# The inbox's incident view (approvals/incidents.py) groups the steps parked for a person by
# failure class and tool, and reads the health of those tools from their recovery waits. Both
# read small partial indexes: parked steps are few next to all steps, recovery waits few next
# to all waits, so the engine's hot path writes neither index for the common step or wait.
# RunSQL on the runs app's tables, as 0019 does (the approvals app owns the console's reads).
from django.db import migrations

_CREATE = (
    "CREATE INDEX IF NOT EXISTS runs_step_parked_cause_idx "
    "ON runs_step (error_class, tool) WHERE status IN ('needs_human', 'unknown_outcome');",
    "CREATE INDEX IF NOT EXISTS runs_wait_tool_recovery_idx "
    "ON runs_wait (event_type, created_at) WHERE kind = 'tool_recovery';",
)
_DROP = (
    "DROP INDEX IF EXISTS runs_step_parked_cause_idx;",
    "DROP INDEX IF EXISTS runs_wait_tool_recovery_idx;",
)


class Migration(migrations.Migration):
    dependencies = [("approvals", "0022_default_approval_rules")]

    operations = [migrations.RunSQL(list(_CREATE), list(_DROP))]

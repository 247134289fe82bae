# Agent payloads (a run's input, step results, the parameters in a snapshot, receipts, the
# timeline's data) are often over the 2 KB at which PostgreSQL compresses a value in the row.
# Its default compressor, pglz, was the largest single item in PostgreSQL's CPU per run under
# `bench engine` (about 6% of it, measured with perf); lz4 compresses several times faster for
# a slightly larger result. This sets lz4 on those columns where the server was built with it
# (`pg_config --configure` shows --with-lz4; Debian's PostgreSQL is); elsewhere it changes
# nothing. Only values written afterwards are affected: a column can hold values of both
# kinds, and reads need no change.
from django.db import migrations

COLUMNS = {
    "runs_run": ["input", "result"],
    "runs_step": ["result", "read_record", "spec", "routing"],
    "runs_snapshot": [
        "params",
        "prior_results_summary",
        "verification_baseline",
        "permissions",
        "human_decision",
    ],
    "runs_sideeffect": ["receipt"],
    "runs_timelineevent": ["data"],
    "runs_wait": ["payload"],
    "runs_inboundevent": ["payload"],
}


def _set(method: str) -> str:
    alters = "".join(
        f"EXECUTE 'ALTER TABLE {table} ALTER COLUMN {column} SET COMPRESSION {method}';"
        for table, columns in COLUMNS.items()
        for column in columns
    )
    return (
        "DO $$ BEGIN IF EXISTS (SELECT 1 FROM pg_settings "
        "WHERE name = 'default_toast_compression' AND 'lz4' = ANY (enumvals)) "
        f"THEN {alters} END IF; END $$;"
    )


class Migration(migrations.Migration):
    dependencies = [("runs", "0024_notify_second_approver")]

    operations = [migrations.RunSQL(_set("lz4"), _set("pglz"))]

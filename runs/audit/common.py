"""What the audit modules share: the export format, batch sizes, the retention period."""

from __future__ import annotations

from taskpilots.env import env_int

# How long finished runs keep their full payloads (TASKPILOTS_RETENTION_DAYS, default 365).
RETENTION_DAYS = env_int("TASKPILOTS_RETENTION_DAYS", 365, minimum=1)

EXPORT_FORMAT = "taskpilots-audit"
# 2: `record` lines (sealed rows' content) and the records chain's section; 1 is still read.
EXPORT_VERSION = 2
READABLE_VERSIONS = (1, 2)
PRUNED_DATA = {"pruned": True}
# Runs per batch when walking or exporting many runs; events are read `CHUNK` rows at a time.
RUN_BATCH = 500
CHUNK = 2000
PROGRESS_EVERY = 1000

RECORD_ENTRY_FIELDS = ("seq", "at", "actor", "verb", "data", "data_digest", "prev_hash", "hash")

EVENT_FIELDS = (
    "run",
    "seq",
    "at",
    "actor",
    "verb",
    "data",
    "data_digest",
    "pruned",
    "prev_hash",
    "hash",
)


def retention_days() -> int:
    from django.conf import settings

    return int(settings.TASKPILOTS.get("RETENTION_DAYS", RETENTION_DAYS))


# The CSV export's first line (a file that starts with it is a CSV export, not verifiable).
CSV_HEADER = "run,workflow,seq,at,actor,verb,data"

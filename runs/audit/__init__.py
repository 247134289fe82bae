"""The audit trail: verify the hash-chained timeline, export it, prune old payloads.

- Verification walks each run's events in seq order and names the first broken one (run, seq,
  what is wrong). It works on the database (and then also compares every chain with the run's
  head, so events cut off the end are found) or on an exported JSON Lines file, offline: the
  export carries each run's head and a closing line with the counts, so a truncated or
  shortened file fails too. Nothing here needs the database for a file.
- Beside the chain, checks read what the chain vouches for (BATCH_CHECKS, one function each,
  run on every batch of runs whose chains verified): every snapshot against the checksum its
  `snapshot.written` event recorded, and every sealed row (runs/seal.py: decisions, takeovers,
  approval requests, ledger rows a person settled, bulk items) against its latest seal. The
  records chain (the sealed rows that belong to no run: rule versions and rules, tool pauses,
  metadata decisions, bulk jobs) is verified the same way by `verify_records`. An export
  carries each sealed row's content as a `record` line after its run's events, so the offline
  check finds the same edits.
- Export streams one run or a search result as JSON Lines (verifiable) or CSV (for people),
  reading the events in batches with `.iterator()` so a large export never sits in memory.
- Pruning replaces the payloads of runs that finished before the retention cutoff: event data
  (seals excepted: they carry digests, and what checking a sealed row needs) becomes
  {"pruned": true} and snapshot params, prior results and verification baselines
  become {}. `data_digest`, the hashes and the snapshot checksums stay, so the chain still
  verifies and still proves what the payload was. The append-only trigger lets exactly these
  UPDATEs through in transactions that `SET LOCAL taskpilots.prune = 'on'`.

One module each: `verify`, `export`, `prune`, and `common` (the export format, batch sizes, the
retention period), re-exported here.
"""

from runs.audit.common import (
    CHUNK,
    CSV_HEADER,
    EVENT_FIELDS,
    EXPORT_FORMAT,
    EXPORT_VERSION,
    PROGRESS_EVERY,
    PRUNED_DATA,
    READABLE_VERSIONS,
    RECORD_ENTRY_FIELDS,
    RETENTION_DAYS,
    RUN_BATCH,
    retention_days,
)
from runs.audit.export import (
    event_record,
    export_csv,
    export_jsonl,
)
from runs.audit.prune import (
    PruneReport,
    prune_payloads,
)
from runs.audit.verify import (
    ChainChecker,
    Problem,
    VerifyReport,
    verify_chain,
    verify_database,
    verify_export,
    verify_queryset_runs,
    verify_records,
    verify_run,
)

__all__ = [
    "RETENTION_DAYS",
    "EXPORT_FORMAT",
    "EXPORT_VERSION",
    "READABLE_VERSIONS",
    "PRUNED_DATA",
    "RUN_BATCH",
    "CHUNK",
    "PROGRESS_EVERY",
    "RECORD_ENTRY_FIELDS",
    "EVENT_FIELDS",
    "retention_days",
    "CSV_HEADER",
    "Problem",
    "VerifyReport",
    "ChainChecker",
    "verify_chain",
    "verify_queryset_runs",
    "verify_run",
    "verify_records",
    "verify_database",
    "verify_export",
    "event_record",
    "export_jsonl",
    "export_csv",
    "PruneReport",
    "prune_payloads",
]

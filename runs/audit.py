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
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from runs import seal
from runs.coverage import Coverage
from runs.invisible import escape_json, neutralise
from runs.models import Run, Snapshot, TimelineEvent, chain_hash, digest
from runs.signals import payloads_pruning
from runs.verbs import Verb
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


# --------------------------------------------------------------------------------------------
# Verification


@dataclass(frozen=True)
class Problem:
    run_id: str  # a run's id, or seal.RECORDS for the records chain
    seq: int | None
    message: str

    def __str__(self) -> str:
        where = "records" if self.run_id == seal.RECORDS else f"run {self.run_id}"
        where += f" seq {self.seq}" if self.seq is not None else ""
        return f"{where}: {self.message}"


@dataclass
class VerifyReport:
    runs: int = 0
    events: int = 0
    snapshots: int = 0
    pruned_events: int = 0
    records: int = 0  # sealed rows checked
    record_entries: int | None = None  # the records chain's entries, when it was checked
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        text = (
            f"{self.runs} runs, {self.events} events ({self.pruned_events} pruned), "
            f"{self.snapshots} snapshots, {self.records} sealed rows checked"
        )
        if self.record_entries is not None:
            text += f", the records chain ({self.record_entries} entries)"
        if self.ok:
            return f"OK: {text}; every chain verifies."
        return f"FAILED: {text}; {len(self.problems)} broken chain(s)."


class ChainChecker:
    """Checks one run's events as they come, in seq order; keeps the first problem only."""

    def __init__(self, run_id: str, head_seq: int | None = None, head_hash: str | None = None):
        self.run_id = str(run_id)
        self.head_seq, self.head_hash = head_seq, head_hash
        self.expected_seq, self.prev_hash = 1, ""
        self.problem: Problem | None = None
        # snapshot id → (event seq, checksum) as the chain recorded them
        self.snapshot_checksums: dict[int, tuple[int, str]] = {}
        # (model, id) → the latest seal of that row in this chain
        self.seals: dict[tuple[str, Any], seal.Seal] = {}
        # Every committed call behind approval covered by an approval of its parameters.
        self.coverage = Coverage()

    def _fail(self, seq: int | None, message: str) -> Problem:
        self.problem = Problem(self.run_id, seq, message)
        return self.problem

    def feed(
        self,
        seq: int,
        at_iso: str,
        actor: str,
        verb: str,
        data: Any,
        data_digest: str,
        pruned: bool,
        prev_hash: str,
        event_hash: str,
    ) -> Problem | None:
        if self.problem is not None:
            return self.problem
        expected = self.expected_seq
        if seq > expected:
            return self._fail(expected, f"event missing (the next event found is seq {seq})")
        if seq < expected:
            return self._fail(seq, f"out of order or duplicated (expected seq {expected})")
        if prev_hash != self.prev_hash:
            return self._fail(
                seq,
                "prev_hash does not match the previous event's hash "
                "(an event was inserted, removed or reordered before it)",
            )
        if pruned:
            if data != PRUNED_DATA:
                return self._fail(seq, "marked pruned but still carries a payload")
        elif digest(data) != data_digest:
            return self._fail(seq, "data was changed (it no longer matches its data_digest)")
        if chain_hash(seq, at_iso, actor, verb, data_digest, prev_hash) != event_hash:
            return self._fail(
                seq, "time, actor, verb or digest was changed (the hash does not match)"
            )
        snapshot_id = data.get("snapshot") if isinstance(data, dict) else None
        if verb == Verb.SNAPSHOT_WRITTEN and not pruned and isinstance(snapshot_id, int):
            self.snapshot_checksums[snapshot_id] = (seq, str(data.get("checksum", "")))
        elif verb == seal.SEALED and not pruned:
            found = seal.read_seal(seq, data)
            if found is not None:
                self.seals[(found.label, found.pk)] = found
        self.coverage.feed(seq, verb, data, actor, pruned=pruned)
        self.expected_seq, self.prev_hash = seq + 1, event_hash
        return None

    def finish(self) -> Problem | None:
        if self.problem is not None:
            return self.problem
        if self.head_seq is None:
            return self._uncovered()
        last = self.expected_seq - 1
        if last != self.head_seq:
            return self._fail(
                last + 1 if last < self.head_seq else self.head_seq + 1,
                f"the chain ends at seq {last} but the run's head says seq {self.head_seq} "
                "(events were removed from the end, or added after it)",
            )
        if self.prev_hash != (self.head_hash or ""):
            return self._fail(last, "the last event's hash does not match the run's head hash")
        return self._uncovered()

    def _uncovered(self) -> Problem | None:
        if not self.coverage.problems:
            return None
        seq, message = self.coverage.problems[0]
        return self._fail(seq, message)


def verify_chain(events: Iterable) -> tuple[bool, str]:
    """Walk one run's events (TimelineEvent rows) in seq order with the verifier every audit
    uses; (ok, message naming the first broken event)."""
    checker: ChainChecker | None = None
    for event in events:
        checker = checker or ChainChecker(event.run_id)
        checker.feed(
            event.seq,
            event.at.isoformat(),
            event.actor,
            event.verb,
            event.data,
            event.data_digest,
            event.pruned,
            event.prev_hash,
            event.hash,
        )
    problem = checker.problem if checker else None
    return (problem is None, "ok" if problem is None else str(problem))


def verify_queryset_runs(
    runs, *, progress: Callable[[int, int], None] | None = None
) -> VerifyReport:
    """Verify the chains of `runs` (a Run queryset) in the database, `RUN_BATCH` runs at a time.

    Each batch reads the run heads, their events and their snapshots in one REPEATABLE READ
    transaction (when not already inside one), so a run that moves on meanwhile is seen
    consistently and is not reported as broken."""
    report = VerifyReport()
    last, next_progress = None, PROGRESS_EVERY
    while True:
        with _consistent_reads():
            page = runs.order_by("pk")
            if last is not None:
                page = page.filter(pk__gt=last)
            heads = list(page.values_list("pk", "event_seq", "event_hash")[:RUN_BATCH])
            if not heads:
                break
            last = heads[-1][0]
            _check_batch(heads, report)
        report.runs += len(heads)
        if progress and report.runs >= next_progress:
            progress(report.runs, report.events)
            next_progress += PROGRESS_EVERY
    return report


@contextmanager
def _consistent_reads() -> Iterator[None]:
    """One REPEATABLE READ transaction (when not already inside one): what moves meanwhile is
    not seen half-moved."""
    outermost = not connection.in_atomic_block
    with transaction.atomic():
        if outermost:  # the first statement of the transaction may set its isolation
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        yield


def _check_batch(heads: list[tuple], report: VerifyReport) -> None:
    """Feed each run's events to its checker, close the chains, then run BATCH_CHECKS on the
    runs whose chains verified; the first problem of each run is its report."""
    checkers = {pk: ChainChecker(pk, seq, head) for pk, seq, head in heads}
    events = (
        TimelineEvent.objects.filter(run_id__in=list(checkers))
        .order_by("run_id", "seq")
        .values_list("run_id", *EVENT_FIELDS[1:])
    )
    for (
        run_id,
        seq,
        at,
        actor,
        verb,
        data,
        data_digest,
        pruned,
        prev,
        event_hash,
    ) in events.iterator(chunk_size=CHUNK):
        report.events += 1
        report.pruned_events += pruned
        checkers[run_id].feed(
            seq, at.isoformat(), actor, verb, data, data_digest, pruned, prev, event_hash
        )
    for checker in checkers.values():
        checker.finish()
    intact = {pk: checker for pk, checker in checkers.items() if checker.problem is None}
    for check in BATCH_CHECKS:
        check(intact, report)
        intact = {pk: checker for pk, checker in intact.items() if checker.problem is None}
    for checker in checkers.values():
        if checker.problem is not None:
            report.problems.append(checker.problem)


def _check_snapshots(checkers: dict[Any, ChainChecker], report: VerifyReport) -> None:
    """Every snapshot against its own checksum (unless pruned) and the one its
    `snapshot.written` event recorded."""
    snapshots = Snapshot.objects.filter(run_id__in=list(checkers)).order_by("pk")
    for snapshot in snapshots.iterator(chunk_size=CHUNK):
        report.snapshots += 1
        checker = checkers[snapshot.run_id]
        if checker.problem is not None:
            continue
        recorded = checker.snapshot_checksums.get(snapshot.pk)
        if recorded is not None and recorded[1] != snapshot.checksum:
            checker._fail(
                recorded[0], f"snapshot {snapshot.pk} no longer has the checksum recorded here"
            )
        elif not snapshot.pruned and snapshot.compute_checksum() != snapshot.checksum:
            seq = recorded[0] if recorded else None
            checker._fail(seq, f"snapshot {snapshot.pk} content does not match its checksum")


def _check_seals(checkers: dict[Any, ChainChecker], report: VerifyReport) -> None:
    """Every sealed row of these runs against its latest seal in their chains (the first
    mismatch of each run, by seal seq, then rows that have no seal)."""
    by_id = {checker.run_id: checker for checker in checkers.values()}
    pairs = seal.run_pairs({run_id: checker.seals for run_id, checker in by_id.items()})
    report.records += sum(pair.row is not None for pair in pairs)
    for chain, finding in seal.first_findings(pairs).items():
        if chain in by_id:
            by_id[chain]._fail(None, finding.message)


# What is checked beside the chains, for each batch of runs whose chains verified: each takes
# {run id: its ChainChecker} and the report, and fails a run's checker with what it finds.
BATCH_CHECKS: list[Callable[[dict[Any, ChainChecker], VerifyReport], None]] = [
    _check_snapshots,
    _check_seals,
]


def verify_run(run) -> VerifyReport:
    return verify_queryset_runs(Run.objects.filter(pk=run.pk))


def verify_records(report: VerifyReport | None = None) -> VerifyReport:
    """The records chain (the sealed rows that belong to no run) in the database: the chain
    against its head, then every such row against its latest seal; in one REPEATABLE READ
    transaction."""
    report = report or VerifyReport()
    chain = seal.records_chain()
    if chain is None:
        return report
    with _consistent_reads():
        checker = ChainChecker(seal.RECORDS, *chain.head())
        entries = chain.objects.order_by("seq").values_list(*RECORD_ENTRY_FIELDS)
        count = 0
        for seq, at, actor, verb, data, data_digest, prev, entry_hash in entries.iterator(
            chunk_size=CHUNK
        ):
            count += 1
            checker.feed(
                seq, at.isoformat(), actor, verb, data, data_digest, False, prev, entry_hash
            )
        if checker.finish() is None:
            pairs = seal.record_pairs(checker.seals)
            report.records += sum(pair.row is not None for pair in pairs)
            for finding in seal.first_findings(pairs).values():
                checker._fail(None, finding.message)
    report.record_entries = count
    if checker.problem is not None:
        report.problems.append(checker.problem)
    return report


def verify_database(progress: Callable[[int, int], None] | None = None) -> VerifyReport:
    """Every run's chain, then the records chain."""
    return verify_records(verify_queryset_runs(Run.objects.all(), progress=progress))


def verify_export(
    lines: Iterable[str | bytes], progress: Callable[[int, int], None] | None = None
) -> VerifyReport:
    """Verify an export made by `export_jsonl`, offline (no database): a header, then each run's
    head line and its events in order, then an end line whose counts match the file."""
    reader = _ExportReader(progress)
    for number, raw in enumerate(lines, start=1):
        line = raw.decode() if isinstance(raw, bytes) else raw
        if line.strip() and not reader.read(number, line):
            return reader.report
    return reader.finish()


class _ExportReader:
    """Reads an export line by line; `read` returns False once the file is broken.

    A section (a run's, or the records chain's) is its head line, its events in order, then
    the `record` lines of the rows its chain sealed: when the section closes, the chain is
    checked against its head, then each record's content against the row's latest seal in
    the chain (a record without a seal, or a seal without its record, is named too)."""

    def __init__(self, progress: Callable[[int, int], None] | None):
        self.report = VerifyReport()
        self.progress = progress
        self.version = EXPORT_VERSION
        self.checker: ChainChecker | None = None
        self.records: dict[tuple[str, Any], dict] = {}
        self.record_lines = 0
        self.seen_header = self.seen_end = False
        self.runs_seen: set[str] = set()

    def _problem(self, number: int, message: str) -> bool:
        self.report.problems.append(Problem("-", None, f"line {number}: {message}"))
        return False

    def _close_run(self) -> None:
        checker, records = self.checker, self.records
        self.checker, self.records = None, {}
        if checker is None:
            return
        if checker.finish() is None and self.version >= 2:
            chain = checker.run_id
            pairs = [
                seal.Pair(label, pk, chain, seal.Row(label, pk, chain, content), None)
                for (label, pk), content in records.items()
            ]
            pairs = [
                seal.Pair(p.label, p.pk, chain, p.row, checker.seals.pop((p.label, p.pk), None))
                for p in pairs
            ]
            pairs += [seal.Pair(k[0], k[1], chain, None, s) for k, s in checker.seals.items()]
            self.report.records += len(records)
            finding = seal.first_findings(pairs).get(chain)
            if finding is not None:
                checker._fail(None, finding.message)
        if checker.problem is not None:
            self.report.problems.append(checker.problem)

    def read(self, number: int, line: str) -> bool:
        if self.seen_end:
            return self._problem(number, "content after the end line")
        try:
            record = json.loads(line)
        except ValueError:
            if not self.seen_header and line.startswith(CSV_HEADER):
                return self._problem(
                    number,
                    "this is a CSV export, which is for people and cannot be verified: export "
                    "JSON Lines (export_audit --format jsonl, or the JSONL link) and verify that",
                )
            return self._problem(number, "not valid JSON")
        kind = record.get("type") if isinstance(record, dict) else None
        if not self.seen_header:
            return self._header(number, record, kind)
        handler = {
            "run": self._run,
            "event": self._event,
            "record": self._record,
            "records": self._records,
            "end": self._end,
        }.get(kind)
        if handler is None:
            return self._problem(number, f"unknown line type {kind!r}")
        return handler(number, record)

    def _header(self, number: int, record, kind) -> bool:
        if kind != "header" or record.get("format") != EXPORT_FORMAT:
            return self._problem(number, "not a TaskPilots audit export (no header line)")
        if record.get("version") not in READABLE_VERSIONS:
            return self._problem(number, f"unsupported export version {record.get('version')}")
        self.version = record["version"]
        self.seen_header = True
        return True

    def _run(self, number: int, record: dict) -> bool:
        self._close_run()
        run_id = str(record.get("run"))
        if run_id in self.runs_seen:
            return self._problem(number, f"run {run_id} appears twice")
        self.runs_seen.add(run_id)
        self.checker = ChainChecker(run_id, record.get("head_seq"), record.get("head_hash"))
        self.report.runs += 1
        if self.progress and self.report.runs % PROGRESS_EVERY == 0:
            self.progress(self.report.runs, self.report.events)
        return True

    def _event(self, number: int, record: dict) -> bool:
        if self.checker is None or str(record.get("run")) != self.checker.run_id:
            return self._problem(number, "an event outside its run's section")
        try:
            fields = ("actor", "verb")
            self.checker.feed(
                int(record["seq"]),
                str(record["at"]),
                *(str(record[f]) for f in fields),
                record["data"],
                str(record["data_digest"]),
                bool(record["pruned"]),
                str(record["prev_hash"]),
                str(record["hash"]),
            )
        except (KeyError, TypeError, ValueError):
            return self._problem(number, "an event with missing or malformed fields")
        if self.checker.run_id == seal.RECORDS:
            self.report.record_entries = (self.report.record_entries or 0) + 1
            return True
        self.report.events += 1
        self.report.pruned_events += bool(record["pruned"])
        return True

    def _record(self, number: int, record: dict) -> bool:
        """A sealed row's content, after the events of the chain that sealed it."""
        if self.checker is None or str(record.get("run")) != self.checker.run_id:
            return self._problem(number, "a record outside its chain's section")
        label, pk, content = record.get("model"), record.get("id"), record.get("content")
        if not isinstance(label, str) or not isinstance(content, dict):
            return self._problem(number, "a record with missing or malformed fields")
        if (label, pk) in self.records:
            return self._problem(number, f"{label} {pk} appears twice")
        self.records[(label, pk)] = content
        self.record_lines += 1
        return True

    def _records(self, number: int, record: dict) -> bool:
        """The records chain's section: its head, then its entries and the rows they seal."""
        self._close_run()
        if seal.RECORDS in self.runs_seen:
            return self._problem(number, "the records chain appears twice")
        self.runs_seen.add(seal.RECORDS)
        self.checker = ChainChecker(seal.RECORDS, record.get("head_seq"), record.get("head_hash"))
        self.report.record_entries = 0
        return True

    def _end(self, number: int, record: dict) -> bool:
        self._close_run()
        self.seen_end = True
        runs = self.report.runs
        events = self.report.events
        counted = (record.get("runs"), record.get("events"))
        if counted != (runs, events):
            self.report.problems.append(
                Problem(
                    "-",
                    None,
                    f"the end line counts {counted[0]} runs and {counted[1]} events; the file "
                    f"holds {runs} and {events}",
                )
            )
        elif self.version >= 2:
            entries = self.report.record_entries or 0
            if (record.get("records"), record.get("entries", 0)) != (self.record_lines, entries):
                self.report.problems.append(
                    Problem(
                        "-",
                        None,
                        f"the end line counts {record.get('records')} records and "
                        f"{record.get('entries', 0)} records chain entries; the file holds "
                        f"{self.record_lines} and {entries}",
                    )
                )
        return True

    def finish(self) -> VerifyReport:
        if not self.seen_header:
            self._problem(0, "empty file")
        elif not self.seen_end:
            self._close_run()
            self.report.problems.append(Problem("-", None, "the export is truncated (no end line)"))
        return self.report


# --------------------------------------------------------------------------------------------
# Export


def _run_batches(runs) -> Iterator[list]:
    batch: list = []
    for run in runs.iterator(chunk_size=RUN_BATCH):
        batch.append(run)
        if len(batch) >= RUN_BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


def _events_of(batch) -> Iterator:
    events = TimelineEvent.objects.filter(run_id__in=[r.pk for r in batch]).order_by(
        "run_id", "seq"
    )
    return events.iterator(chunk_size=CHUNK)


def event_record(event) -> dict[str, Any]:
    return {
        "type": "event",
        "run": str(event.run_id),
        "seq": event.seq,
        "at": event.at.isoformat(),
        "actor": event.actor,
        "verb": event.verb,
        "data": event.data,
        "data_digest": event.data_digest,
        "pruned": event.pruned,
        "prev_hash": event.prev_hash,
        "hash": event.hash,
    }


def _run_record(run) -> dict[str, Any]:
    return {
        "type": "run",
        "run": str(run.pk),
        "workflow": run.workflow,
        "workflow_version": run.workflow_version,
        "status": run.status,
        "created_at": run.created_at.isoformat(),
        "finished_at": run.finished_at.isoformat() if run.finished_at else None,
        "head_seq": run.event_seq,
        "head_hash": run.event_hash,
    }


def _line(record: dict) -> str:
    # Invisible and bidi format characters as \uXXXX escapes: the same values (so the digests
    # and hashes verify), but an editor or a terminal shows them instead of obeying them.
    return escape_json(json.dumps(record, ensure_ascii=False, sort_keys=True, default=str)) + "\n"


def _record_line(pair: seal.Pair) -> dict[str, Any]:
    assert pair.row is not None
    return {
        "type": "record",
        "run": pair.chain,
        "model": pair.label,
        "id": pair.pk,
        "content": pair.row.content,
    }


def _record_lines(pairs: Iterable[seal.Pair]) -> dict[str, list[dict]]:
    """Each chain's record lines (the rows it sealed, or that must be sealed), in a stable
    order. A seal whose row is gone has none: the offline check names it."""
    lines: dict[str, list[dict]] = {}
    for pair in sorted(pairs, key=lambda p: (p.chain, p.label, str(p.pk))):
        if pair.row is not None:
            lines.setdefault(pair.chain, []).append(_record_line(pair))
    return lines


def export_jsonl(
    runs,
    *,
    exported_by: str = "",
    query: dict | None = None,
    now: datetime | None = None,
    progress: Callable[[int, int], None] | None = None,
    records: bool = False,
) -> Iterator[str]:
    """JSON Lines: a header, then per run (ordered by id) a `run` line with its chain head, its
    events in seq order and a `record` line for each sealed row of the run (its content as the
    seal hashes it); with `records`, the records chain's section the same way (a `records`
    line with its head, its entries as `event` lines, its rows' `record` lines); then an `end`
    line with the counts. `verify_export` checks it."""
    yield _line(
        {
            "type": "header",
            "format": EXPORT_FORMAT,
            "version": EXPORT_VERSION,
            "exported_at": (now or timezone.now()).isoformat(),
            "exported_by": exported_by,
            "query": query or {},
            "fields": list(EVENT_FIELDS),
            "hash": "sha256(canonical_json([seq, at, actor, verb, data_digest, prev_hash]))",
            "data_digest": (
                "sha256(canonical_json(data)); canonical = sorted keys, no spaces, UTF-8"
            ),
            "records": (
                "a sealed row's content ({column: value}) after the events of the chain that "
                "sealed it; its latest `record.sealed` event carries sha256(canonical_json("
                "content over the columns it names)) and each column's digest"
            ),
        }
    )
    run_count = event_count = record_count = entry_count = 0
    for batch in _run_batches(runs.order_by("pk")):
        by_run: dict[Any, list] = {}
        for event in _events_of(batch):
            by_run.setdefault(event.run_id, []).append(event)
        lines = _record_lines(seal.run_pairs(_seals_of(batch, by_run)))
        for run in batch:
            yield _line(_run_record(run))
            for event in by_run.pop(run.pk, []):
                yield _line(event_record(event))
                event_count += 1
            for line in lines.get(str(run.pk), []):
                yield _line(line)
                record_count += 1
            run_count += 1
            if progress and run_count % PROGRESS_EVERY == 0:
                progress(run_count, event_count)
    if records and seal.records_chain() is not None:
        for line in _records_section():
            yield _line(line)
            entry_count += line["type"] == "event"
            record_count += line["type"] == "record"
    yield _line(
        {
            "type": "end",
            "runs": run_count,
            "events": event_count,
            "records": record_count,
            "entries": entry_count,
        }
    )


def _seals_of(batch, by_run: dict[Any, list]) -> dict[str, dict]:
    """The latest seal of each row, per run of the batch, from the events read for it."""
    seals: dict[str, dict] = {str(run.pk): {} for run in batch}
    for run_id, events in by_run.items():
        for event in events:
            if event.verb == seal.SEALED and not event.pruned:
                found = seal.read_seal(event.seq, event.data)
                if found is not None:
                    seals[str(run_id)][(found.label, found.pk)] = found
    return seals


def _records_section() -> Iterator[dict[str, Any]]:
    """The records chain as read in one REPEATABLE READ transaction: its head, its entries and
    its rows' record lines."""
    chain = seal.records_chain()
    with _consistent_reads():
        head_seq, head_hash = chain.head()
        entries = list(chain.objects.order_by("seq").values_list(*RECORD_ENTRY_FIELDS))
        seals = {}
        for seq, _at, _actor, verb, data, *_rest in entries:
            found = seal.read_seal(seq, data) if verb == seal.SEALED else None
            if found is not None:
                seals[(found.label, found.pk)] = found
        lines = _record_lines(seal.record_pairs(seals)).get(seal.RECORDS, [])
    yield {"type": "records", "run": seal.RECORDS, "head_seq": head_seq, "head_hash": head_hash}
    for seq, at, actor, verb, data, data_digest, prev, entry_hash in entries:
        yield {
            "type": "event",
            "run": seal.RECORDS,
            "seq": seq,
            "at": at.isoformat(),
            "actor": actor,
            "verb": verb,
            "data": data,
            "data_digest": data_digest,
            "pruned": False,
            "prev_hash": prev,
            "hash": entry_hash,
        }
    yield from lines


class _Echo:
    """A file-like object whose write() hands the row back, for csv.writer in a generator."""

    def write(self, value: str) -> str:
        return value


_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _cell(value: Any) -> str:
    """Agent data is untrusted. Text shows invisible and bidi format characters as markers
    (`[U+202E]`); JSON writes them as \\uXXXX escapes, so the cell still parses to exactly the
    event's data. Spreadsheets run cells that start like a formula: those get a leading '."""
    if isinstance(value, str):
        text = neutralise(value)
    else:
        text = escape_json(json.dumps(value, ensure_ascii=False))
    return "'" + text if text.startswith(_FORMULA_START) else text


# How a CSV export's first line begins (export_csv): verify_export recognises one.
CSV_HEADER = "run,workflow,seq,at,actor,verb,data"


def export_csv(runs) -> Iterator[str]:
    """CSV for people (one row per event). Hash fields are included; use JSONL to verify. The
    last column repeats a side effect's external id (its commit proof) from the event's data."""
    writer = csv.writer(_Echo())
    yield writer.writerow(
        [
            "run",
            "workflow",
            "seq",
            "at",
            "actor",
            "verb",
            "data",
            "data_digest",
            "pruned",
            "prev_hash",
            "hash",
            "external_id",
        ]
    )
    for batch in _run_batches(runs.order_by("pk")):
        workflows = {run.pk: run.workflow for run in batch}
        for event in _events_of(batch):
            yield writer.writerow(
                [
                    str(event.run_id),
                    _cell(workflows[event.run_id]),
                    event.seq,
                    event.at.isoformat(),
                    _cell(event.actor),
                    _cell(event.verb),
                    _cell(event.data),
                    event.data_digest,
                    "true" if event.pruned else "false",
                    event.prev_hash,
                    event.hash,
                    _cell(_external_id(event.data)),
                ]
            )


def _external_id(data: Any) -> str:
    """The commit proof an event names (a side effect committed or reused), for people reading
    the CSV without parsing its JSON cell."""
    value = data.get("external_id") if isinstance(data, dict) else None
    return str(value) if value not in (None, "") else ""


# --------------------------------------------------------------------------------------------
# Retention


@dataclass
class PruneReport:
    cutoff: datetime
    dry_run: bool
    runs: int = 0
    events: int = 0
    snapshots: int = 0

    def summary(self) -> str:
        verb = "would prune" if self.dry_run else "pruned"
        return (
            f"{verb} {self.events} events and {self.snapshots} snapshots; {self.runs} runs "
            f"finished before {self.cutoff.isoformat()}"
        )


def prune_payloads(
    older_than_days: int | None = None,
    *,
    now: datetime | None = None,
    dry_run: bool = False,
    batch_size: int = RUN_BATCH,
    progress: Callable[[PruneReport], None] | None = None,
) -> PruneReport:
    """Drop the payloads of runs that finished before the cutoff.

    1. Walk finished runs with finished_at < now - days, by id, `batch_size` at a time.
    2. Per batch, in one transaction that sets `taskpilots.prune`: events not yet pruned get
       data {"pruned": true} and pruned=true, except seals (`record.sealed`: a row's id and
       digests, no payload, and what checking the row needs); snapshots get params and prior
       results {} and pruned=true. data_digest, hashes and checksums are left alone (the chain
       still proves what the payload was).
    3. With dry_run, only count what would change.
    """
    days = retention_days() if older_than_days is None else older_than_days
    cutoff = (now or timezone.now()) - timedelta(days=days)
    if not dry_run:
        # Whatever reads the payloads must keep what it needs first (the metrics rollup stores
        # every ended run's figures, so pruning never changes a figure).
        payloads_pruning.send(sender=Run, now=now)
    report = PruneReport(cutoff=cutoff, dry_run=dry_run)
    finished = Run.objects.filter(status__in=Run.TERMINAL, finished_at__lt=cutoff)
    last = None
    while True:
        page = finished.order_by("pk")
        if last is not None:
            page = page.filter(pk__gt=last)
        ids = list(page.values_list("pk", flat=True)[:batch_size])
        if not ids:
            break
        last = ids[-1]
        if dry_run:
            events = (
                TimelineEvent.objects.filter(run_id__in=ids, pruned=False)
                .exclude(verb=seal.SEALED)
                .count()
            )
            snapshots = Snapshot.objects.filter(run_id__in=ids, pruned=False).count()
        else:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SET LOCAL taskpilots.prune = 'on'")
                cursor.execute(
                    "UPDATE runs_timelineevent SET data = %s::jsonb, pruned = true "
                    "WHERE run_id = ANY(%s) AND NOT pruned AND verb <> %s",
                    [json.dumps(PRUNED_DATA), ids, seal.SEALED],
                )
                events = cursor.rowcount
                cursor.execute(
                    "UPDATE runs_snapshot SET params = '{}'::jsonb, "
                    "prior_results_summary = '{}'::jsonb, verification_baseline = '{}'::jsonb, "
                    "pruned = true "
                    "WHERE run_id = ANY(%s) AND NOT pruned",
                    [ids],
                )
                snapshots = cursor.rowcount
                # SET LOCAL lasts to the end of the whole transaction: when called inside an
                # outer one, switch it off so nothing else there slips past the trigger.
                cursor.execute("SET LOCAL taskpilots.prune = 'off'")
        report.events += events
        report.snapshots += snapshots
        report.runs += len(ids)
        if progress:
            progress(report)
    return report

"""Verification of the hash-chained timeline, of what it vouches for (snapshots, sealed rows),
of the records chain, in the database or in an exported file."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from django.db import connection, transaction

from runs import seal
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
    RUN_BATCH,
)
from runs.coverage import Coverage
from runs.models import Run, Snapshot, TimelineEvent, chain_hash, digest
from runs.verbs import Verb

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

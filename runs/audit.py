"""The audit trail: verify the hash-chained timeline, export it, prune old payloads.

- Verification walks each run's events in seq order and names the first broken one (run, seq,
  what is wrong). It works on the database (and then also compares every chain with the run's
  head, so events cut off the end are found, and every snapshot with the checksum its
  `snapshot.written` event recorded) or on an exported JSON Lines file, offline: the export
  carries each run's head and a closing line with the counts, so a truncated or shortened file
  fails too. Nothing here needs the database for a file.
- Export streams one run or a search result as JSON Lines (verifiable) or CSV (for people),
  reading the events in batches with `.iterator()` so a large export never sits in memory.
- Pruning replaces the payloads of runs that finished before the retention cutoff: event data
  becomes {"pruned": true} and snapshot params, prior results and verification baselines
  become {}. `data_digest`, the hashes and the snapshot checksums stay, so the chain still
  verifies and still proves what the payload was. The append-only trigger lets exactly these
  UPDATEs through in transactions that `SET LOCAL taskpilots.prune = 'on'`.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from runs.invisible import escape_json, neutralise
from runs.models import Run, Snapshot, TimelineEvent, chain_hash, digest
from runs.signals import payloads_pruning
from runs.verbs import Verb
from taskpilots.env import env_int

# How long finished runs keep their full payloads (TASKPILOTS_RETENTION_DAYS, default 365).
RETENTION_DAYS = env_int("TASKPILOTS_RETENTION_DAYS", 365, minimum=1)

EXPORT_FORMAT = "taskpilots-audit"
EXPORT_VERSION = 1
PRUNED_DATA = {"pruned": True}
# Runs per batch when walking or exporting many runs; events are read `CHUNK` rows at a time.
RUN_BATCH = 500
CHUNK = 2000
PROGRESS_EVERY = 1000

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
    run_id: str
    seq: int | None
    message: str

    def __str__(self) -> str:
        where = f"run {self.run_id}" + (f" seq {self.seq}" if self.seq is not None else "")
        return f"{where}: {self.message}"


@dataclass
class VerifyReport:
    runs: int = 0
    events: int = 0
    snapshots: int = 0
    pruned_events: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        text = (
            f"{self.runs} runs, {self.events} events ({self.pruned_events} pruned), "
            f"{self.snapshots} snapshots checked"
        )
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
        self.expected_seq, self.prev_hash = seq + 1, event_hash
        return None

    def finish(self) -> Problem | None:
        if self.problem is not None or self.head_seq is None:
            return self.problem
        last = self.expected_seq - 1
        if last != self.head_seq:
            return self._fail(
                last + 1 if last < self.head_seq else self.head_seq + 1,
                f"the chain ends at seq {last} but the run's head says seq {self.head_seq} "
                "(events were removed from the end, or added after it)",
            )
        if self.prev_hash != (self.head_hash or ""):
            return self._fail(last, "the last event's hash does not match the run's head hash")
        return None


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
        outermost = not connection.in_atomic_block
        with transaction.atomic():
            if outermost:  # the first statement of the transaction may set its isolation
                with connection.cursor() as cursor:
                    cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
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


def _check_batch(heads: list[tuple], report: VerifyReport) -> None:
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
    for checker in checkers.values():
        problem = checker.finish()
        if problem is not None:
            report.problems.append(problem)


def verify_run(run) -> VerifyReport:
    return verify_queryset_runs(Run.objects.filter(pk=run.pk))


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
    """Reads an export line by line; `read` returns False once the file is broken."""

    def __init__(self, progress: Callable[[int, int], None] | None):
        self.report = VerifyReport()
        self.progress = progress
        self.checker: ChainChecker | None = None
        self.seen_header = self.seen_end = False
        self.runs_seen: set[str] = set()

    def _problem(self, number: int, message: str) -> bool:
        self.report.problems.append(Problem("-", None, f"line {number}: {message}"))
        return False

    def _close_run(self) -> None:
        problem = self.checker.finish() if self.checker is not None else None
        if problem is not None:
            self.report.problems.append(problem)
        self.checker = None

    def read(self, number: int, line: str) -> bool:
        if self.seen_end:
            return self._problem(number, "content after the end line")
        try:
            record = json.loads(line)
        except ValueError:
            return self._problem(number, "not valid JSON")
        kind = record.get("type") if isinstance(record, dict) else None
        if not self.seen_header:
            return self._header(number, record, kind)
        handler = {"run": self._run, "event": self._event, "end": self._end}.get(kind)
        if handler is None:
            return self._problem(number, f"unknown line type {kind!r}")
        return handler(number, record)

    def _header(self, number: int, record, kind) -> bool:
        if kind != "header" or record.get("format") != EXPORT_FORMAT:
            return self._problem(number, "not a TaskPilots audit export (no header line)")
        if record.get("version") != EXPORT_VERSION:
            return self._problem(number, f"unsupported export version {record.get('version')}")
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
        self.report.events += 1
        self.report.pruned_events += bool(record["pruned"])
        return True

    def _end(self, number: int, record: dict) -> bool:
        self._close_run()
        self.seen_end = True
        counted = (record.get("runs"), record.get("events"))
        if counted != (self.report.runs, self.report.events):
            self.report.problems.append(
                Problem(
                    "-",
                    None,
                    f"the end line counts {counted[0]} runs and {counted[1]} events; the file "
                    f"holds {self.report.runs} and {self.report.events}",
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


def export_jsonl(
    runs,
    *,
    exported_by: str = "",
    query: dict | None = None,
    now: datetime | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Iterator[str]:
    """JSON Lines: a header, then per run (ordered by id) a `run` line with its chain head and
    its events in seq order, then an `end` line with the counts. `verify_export` checks it."""
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
        }
    )
    run_count = event_count = 0
    for batch in _run_batches(runs.order_by("pk")):
        by_run: dict[Any, list] = {}
        for event in _events_of(batch):
            by_run.setdefault(event.run_id, []).append(event)
        for run in batch:
            yield _line(_run_record(run))
            for event in by_run.pop(run.pk, []):
                yield _line(event_record(event))
                event_count += 1
            run_count += 1
            if progress and run_count % PROGRESS_EVERY == 0:
                progress(run_count, event_count)
    yield _line({"type": "end", "runs": run_count, "events": event_count})


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
       data {"pruned": true} and pruned=true; snapshots get params and prior results {} and
       pruned=true. data_digest, hashes and checksums are left alone (the chain still proves
       what the payload was).
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
            events = TimelineEvent.objects.filter(run_id__in=ids, pruned=False).count()
            snapshots = Snapshot.objects.filter(run_id__in=ids, pruned=False).count()
        else:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SET LOCAL taskpilots.prune = 'on'")
                cursor.execute(
                    "UPDATE runs_timelineevent SET data = %s::jsonb, pruned = true "
                    "WHERE run_id = ANY(%s) AND NOT pruned",
                    [json.dumps(PRUNED_DATA), ids],
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

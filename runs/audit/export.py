"""Export of runs' timelines as JSON Lines (verifiable offline) or CSV (for people)."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from typing import Any

from django.utils import timezone

from runs import seal
from runs.audit.common import (
    CHUNK,
    EVENT_FIELDS,
    EXPORT_FORMAT,
    EXPORT_VERSION,
    PROGRESS_EVERY,
    RECORD_ENTRY_FIELDS,
    RUN_BATCH,
)
from runs.audit.verify import _consistent_reads
from runs.invisible import escape_json, neutralise
from runs.models import TimelineEvent

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

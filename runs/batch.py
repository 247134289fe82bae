"""One round trip per transaction: a state change of one run as one prepared SQL statement.

The engine's hot path (runs.engine.inline) has the model verbs describe their changes into a
batch (`Run.start(into=batch)`, `Step.succeed_attempt(…, into=batch)`, `SideEffect.commit(…,
into=batch)`, …: the same rows, the same compare-and-sets and the same hash-chained timeline
events as when the verbs carry them out themselves) and sends them as one statement
whose parts are data-modifying CTEs, sent with server-side binding as a prepared statement.
PostgreSQL plans each of the hot path's few statement shapes once per connection and runs the
statement as a transaction of its own (all of it or nothing); the worker pays for one execute
instead of one per statement, and no ORM.

1. The run's row is changed first (the final SELECT reads its part first: the lock order), by a
   compare-and-set on the chain head the worker holds (`event_seq`, `event_hash`) and the status
   it expects. The worker hashes the transaction's events itself, in order, from that head.
2. Every other compare-and-set must touch exactly one row (`tp_assert`, runs/migrations/0010):
   a row that is not in the state the worker expects (a lease taken back, a run cancelled or
   taken over, a key used before) makes the statement raise, nothing is written, and `Refused`
   tells the caller to take the ordinary path (the model verbs), which knows what to do in every
   case.
3. The events go in one INSERT.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import re
import threading
import uuid
from datetime import datetime
from typing import Any

import orjson
import psycopg
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connection, connections, models, transaction
from django.utils import timezone
from psycopg.types.json import JsonLoader

from runs import hooks, statements
from runs.models import (
    ALIKE_LEAVES,
    LEASE_UNEXPIRED,
    SqlValue,
    TimelineEvent,
    chain_heads,
    db_json,
    json_loads,
    orjson_encodes_alike,
)

# tp_assert's SQLSTATE, and the unique violation (a key or position someone else took first).
_REFUSALS = {"TP001", "23505"}


class Refused(Exception):
    """The transaction did not apply: a row was not as expected. Nothing was written."""


class Batch:
    """The parts of one transaction of one run, sent as one statement by `commit()`."""

    def __init__(self, run_id, head: tuple[int, str], *, expect_status: str | None = None):
        self.run_id = run_id
        self.head = head
        self.seq, self.hash = head
        self.expect_status = expect_status
        # The run's status as this batch leaves it so far (a verb's event says where it came from).
        self.run_status = expect_status
        self.run_changes: dict[str, Any] = {}
        self.version_bumps = 0
        # (CTE body, params, what): a change that must touch exactly one row; `what` names it.
        self.parts: list[tuple[str, list, str]] = []
        self.values: list[tuple[str, list]] = []  # scalar subqueries whose value is returned
        self.shared_reads: list[str] = []  # parameterless reads made once (shared)
        self.checks: list[tuple[str, list, str]] = []
        self.events: list[str] = []  # each a JSON object (see event)
        self.last_at = None

    def change_run(self, **changes: Any) -> None:
        """Columns of the run's row to change together with its head."""
        self.run_changes.update(changes)
        self.run_status = changes.get("status", self.run_status)

    def update(self, model, pk, values: dict[str, Any], where: dict[str, Any], what: str) -> None:
        """A model verb's compare-and-set (runs.models: `Step._move`, `SideEffect._move`, …) as
        a part that must touch exactly one row: `values` by field name, as the ORM would write
        them; `where` by field name, a value to equal, a tuple of values to be one of, or
        LEASE_UNEXPIRED. The same description the verb executes through the ORM otherwise."""
        # A tuple of statuses (the verb's own constants) goes into the statement's text: one
        # shape per verb, and no array parameter to send.
        shape = []
        guards = []
        for name, value in where.items():
            if value is LEASE_UNEXPIRED:
                shape.append((name, _UNEXPIRED))
            elif type(value) is tuple:
                shape.append((name, value))
            else:
                shape.append((name, _EQUAL))
                guards.append(value)
        sql, json_values = _update_plan(model, tuple(values), tuple(shape))
        params = [
            db_json(v) if is_json else v
            for is_json, v in zip(json_values, values.values(), strict=True)
        ]
        params.append(pk)
        params += guards
        self.must(sql, params, what)

    def bump_version(self) -> None:
        """One more state change of the run: its lock_version goes up by one for each."""
        self.version_bumps += 1

    def must(self, sql: str, params: list, what: str) -> None:
        """An UPDATE or INSERT that must touch exactly one row, or nothing is written."""
        self.parts.append((sql, params, what))

    def insert(self, instance) -> None:
        """INSERT the unsaved model `instance`, every column (its id taken ahead: Ids), as one
        jsonb row: one parameter however many columns, parsed once by the server (as `json` it
        was lexed again by json_populate_record and by each jsonb column's input)."""
        table = instance._meta.db_table
        values = instance.__dict__
        row = {column: values[attname] for column, attname in _columns(instance)}
        self.must(statements.insert_row(table), [_row_json(row)], f"{table} row not written")

    def read(self, sql: str, params: list) -> int:
        """A read in the same round trip: its first row as a dict of its columns (or None)."""
        return self.value(f"(SELECT row_to_json(r) FROM ({sql}) r LIMIT 1)", params)

    def check(self, condition: str, params: list, what: str) -> None:
        """A condition that must hold when the statement runs, or nothing is written."""
        self.checks.append((condition, params, what))

    def shared(self, sql: str) -> str:
        """A parameterless read the statement makes once however many checks and values use
        it (the open pauses, the approval rules' stamp: a MATERIALIZED CTE, where each use
        as a subquery was a read of its own): the SQL to use in their place."""
        if sql not in self.shared_reads:
            self.shared_reads.append(sql)
        return f"SELECT v FROM s{self.shared_reads.index(sql)}"

    def value(self, sql: str, params: list) -> int:
        """A scalar subquery in the same round trip: its value, by the index returned."""
        self.values.append((sql, params))
        return len(self.values) - 1

    def event(self, verb: str, data: dict, *, actor: str = "system") -> None:
        """A timeline event of this transaction, chained after the previous one. The
        transaction's events share one time (as PostgreSQL's now() is the transaction's)."""
        if self.last_at is None:
            self.last_at = timezone.now()
            self._at_iso = self.last_at.isoformat()
        self.seq += 1
        actor_json, verb_json, text, data_digest, event_hash = TimelineEvent.chained(
            self.seq, self.hash, verb, data, actor=actor, at_iso=self._at_iso
        )
        # `text` is canonical JSON already: it goes in as the object it encodes.
        self.events.append(
            f'{{"seq":{self.seq},"at":"{self._at_iso}","actor":{actor_json},'
            f'"verb":{verb_json},"data":{text},"digest":"{data_digest}",'
            f'"prev":"{self.hash}","hash":"{event_hash}"}}'
        )
        self.hash = event_hash

    def statement(self) -> tuple[str, list]:
        """The one statement (runs.statements.batch_statement): the run's change, the parts,
        the events, then the guards and the returned values; and its parameters, in order."""
        run_sql, params = self._run_change()
        for _, part_params, _ in self.parts:
            params += part_params
        params += [self.run_id, f"[{','.join(self.events)}]"]
        for _, check_params, _ in self.checks:
            params += check_params
        for _, value_params in self.values:
            params += value_params
        text = statements.batch_statement(
            run_sql,
            tuple([(sql, what) for sql, _, what in self.parts]),
            tuple([(condition, what) for condition, _, what in self.checks]),
            tuple([sql for sql, _ in self.values]),
            tuple(self.shared_reads),
        )
        return text, params

    def _run_change(self) -> tuple[str, list]:
        sets = ["event_seq = %s", "event_hash = %s", "updated_at = %s"]
        params: list[Any] = [self.seq, self.hash, self.last_at]
        if self.version_bumps:
            sets.append(f"lock_version = lock_version + {int(self.version_bumps)}")
        for column, value in self.run_changes.items():
            if isinstance(value, SqlValue):
                sets.append(f"{column} = {value}")
            else:
                sets.append(f"{column} = %s")
                params.append(value)
        params += [self.run_id, *self.head]
        if self.expect_status is not None:
            params.append(self.expect_status)
        text = statements.run_change(tuple(sets), expect_status=self.expect_status is not None)
        return text, params

    def commit(self) -> list:
        """Run the statement (one round trip, its own transaction); the values of `insert` and
        `read`, by the index they returned. Raises Refused when a guard failed."""
        if not self.events:
            raise ValueError("a batch records at least one event")
        sql, params = self.statement()
        try:
            row = execute_one(sql, params)
        except DatabaseError as exc:
            sqlstate = getattr(exc.__cause__, "sqlstate", None)
            if sqlstate in _REFUSALS:
                raise Refused(str(exc.__cause__).splitlines()[0]) from exc
            raise
        chain_heads.remember(self.run_id, self.seq, self.hash)
        if hooks.event_observers:
            hooks.events_written(self.run_id, [json.loads(text) for text in self.events])
        checks = 1 + len(self.parts) + len(self.checks)
        return list(row[checks:])


def create_run(run, events: list[tuple[str, dict, str]]) -> bool:
    """INSERT the unsaved `run` with its first `events` ((verb, data, actor), chained from the
    start of its chain) as one prepared statement, its own transaction. False, with nothing
    written, when the run's business key started a run already. The run's chain head and times
    are set on it from the events."""
    batch = Batch(run.pk, (0, ""))
    for verb, data, actor in events:
        batch.event(verb, data, actor=actor)
    run.event_seq, run.event_hash = batch.seq, batch.hash
    run.created_at = run.updated_at = batch.last_at
    row = {column: run.__dict__[attname] for column, attname in _columns(run)}
    (created,) = execute_one(statements.CREATE_RUN, [_row_json(row), f"[{','.join(batch.events)}]"])
    if not created:
        return False
    chain_heads.remember(run.pk, batch.seq, batch.hash)
    if hooks.event_observers:
        hooks.events_written(run.pk, [json.loads(text) for text in batch.events])
    run._state.adding = False
    run._state.db = DEFAULT_DB_ALIAS
    return True


@functools.lru_cache(maxsize=512)
def _native(text: str) -> str:
    """%s placeholders as $1, $2, … (a RawCursor sends the text as it is: psycopg would parse
    a long statement with many parameters again on every execute)."""
    numbers = itertools.count(1)
    return re.sub("%s", lambda _: f"${next(numbers)}", text)


_EQUAL, _UNEXPIRED = "=", "unexpired"


@functools.lru_cache(maxsize=256)
def _update_plan(model, names: tuple[str, ...], where: tuple[tuple[str, str], ...]):
    """Batch.update's statement (runs.statements.compare_and_set) for one shape of change, and
    which of its values are JSON (sent as the ORM stores them, runs.models.db_json; every other
    value goes as it is, as the ORM sends it to PostgreSQL): worked out once per shape."""
    fields = model._meta
    columns = tuple(fields.get_field(name).column for name in names)
    guards = tuple((fields.get_field(name).column, kind) for name, kind in where)
    json_values = tuple(isinstance(fields.get_field(name), models.JSONField) for name in names)
    return statements.compare_and_set(fields.db_table, columns, guards), json_values


_COLUMNS: dict[type, list[tuple[str, str]]] = {}


def _columns(instance) -> list[tuple[str, str]]:
    """(column, attribute) of every concrete field, in the table's order."""
    model = type(instance)
    if model not in _COLUMNS:
        _COLUMNS[model] = [(f.column, f.attname) for f in model._meta.concrete_fields]
    return _COLUMNS[model]


def _json_default(value):
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


# Rows for jsonb_populate_record: datetimes to the microsecond (DjangoJSONEncoder keeps
# milliseconds only), JSONField values as they are (already plain JSON: to_json_value).
_python_row_json = json.JSONEncoder(
    ensure_ascii=False, separators=(",", ":"), default=_json_default, check_circular=False
).encode
# A column of these types needs no look inside (what most columns hold): the times and ids
# `_json_default` writes, and the plain values orjson writes alike.
_ROW_LEAVES = ALIKE_LEAVES | {datetime, uuid.UUID}


def _row_json(row: dict) -> str:
    """The row's JSON: by orjson where it writes what Python's encoder writes (every column a
    time, an id or a value orjson_encodes_alike; the times through the same `_json_default`), a
    payload of a few kilobytes then costs microseconds instead of a tenth of a millisecond."""
    for value in row.values():
        if type(value) not in _ROW_LEAVES and not orjson_encodes_alike(value):
            return _python_row_json(row)
    try:
        return orjson.dumps(
            row, default=_json_default, option=orjson.OPT_PASSTHROUGH_DATETIME
        ).decode()
    except orjson.JSONEncodeError:
        return _python_row_json(row)


def execute_one(sql: str, params: list, *, writes: bool = True):
    """One prepared statement with server-side binding; its first row. Outside a transaction
    (the engine's case) it is a transaction of its own; inside one (tests), a savepoint keeps a
    refused statement from aborting the caller's transaction."""
    sql = _native(sql)
    db = connections[DEFAULT_DB_ALIAS]  # this thread's: one lookup, not one per attribute
    db.ensure_connection()
    try:
        if writes and db.in_atomic_block:
            with transaction.atomic():
                return _execute(db, sql, params)
        return _execute(db, sql, params)
    finally:
        if db.queries_logged:  # what the tests' statement counts see
            db.queries_log.append({"sql": sql, "time": "0.000"})


def _execute(db, sql: str, params: list):
    with db.wrap_database_errors:
        cursor = _cursor(db)
        cursor.execute(sql, params, prepare=True)
        return cursor.fetchone()


# Each thread's RawCursor, kept across statements (a cursor caches how each parameter type is
# sent) in a thread-local of this module's rather than on Django's connection wrapper. Only the
# last one is kept: it holds its connection, which must not outlive the pool's use of it.
_local = threading.local()


class _JsonLoader(JsonLoader):
    _loads = staticmethod(json_loads)


def _cursor(db) -> psycopg.RawCursor:
    """This thread's cursor on the connection the wrapper `db` holds now: a new one when the
    pooled wrapper holds another connection than the last time, or the last one was closed."""
    cursor = getattr(_local, "cursor", None)
    if cursor is None or cursor.connection is not db.connection or cursor.closed:
        cursor = _local.cursor = psycopg.RawCursor(db.connection)
        # The json values the statements return (read rows, the open pauses) by orjson; jsonb
        # stays text as Django's connection loads it (a JSONField's from_db_value reads it).
        cursor.adapters.register_loader("json", _JsonLoader)
    return cursor


class Ids:
    """Ids taken from a table's sequence ahead of the INSERTs, so an event in the same statement
    can name the row (a snapshot's `snapshot.written` event names its id). Per process: a block
    at a time, fetched again after a fork. Thread-safe: the block is handed out under a lock, and
    a refill only adds ids the sequence gave this process (nextval never repeats), so no id is
    handed out twice."""

    BLOCK = 64

    def __init__(self, table: str) -> None:
        self.table = table
        self.free: list[int] = []
        self.pid = os.getpid()
        self.lock = threading.Lock()

    def next(self) -> int:
        with self.lock:
            if self.pid != os.getpid():
                self.free, self.pid = [], os.getpid()
            if self.free:
                return self.free.pop()
        # Refilled outside the lock (a round trip): threads that find it empty at once each
        # fetch a block of their own, and keep the rest for the others.
        with connection.cursor() as cursor:
            cursor.execute(statements.ID_BLOCK, [self.table, self.BLOCK])
            block = [row[0] for row in cursor.fetchall()]
        with self.lock:
            if self.pid == os.getpid():
                self.free.extend(block[:0:-1])
        return block[0]


SNAPSHOT_IDS = Ids("runs_snapshot")
STEP_IDS = Ids("runs_step")
SIDE_EFFECT_IDS = Ids("runs_sideeffect")

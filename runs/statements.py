"""Every statement the engine sends to its own tables by hand, in one place (as DBOS keeps its
system database's in one module): the timeline append and the run lock, the hot path's one-
statement transactions (their frame, the events INSERT, a new run, a verb's compare-and-set,
the fresh-run read), ids taken ahead, and liveness (register, beat, take back, the fence).

Text only: no import of the models, so the models, runs.batch and runs.engine all take their
statements from here. What is not here: the ORM's queries (the model verbs carried out in the
caller's transaction, reads), and the open-pauses read, which the people's side owns
(approvals.models.ToolPause.open_statement, handed to the engine through runs.people).
"""

from __future__ import annotations

import functools
import re

# -- the timeline ------------------------------------------------------------------------------

# TimelineEvent.append: lock the run row, read the chain head, insert the event hashed by the
# server over exactly what TimelineEvent.compute_hash hashes, move the head; one round trip.
APPEND_EVENT = """
WITH head AS (
    SELECT event_seq + 1 AS seq, event_hash AS prev FROM runs_run WHERE id = %(run)s FOR UPDATE
), event AS (
    INSERT INTO runs_timelineevent
        (run_id, seq, at, actor, verb, data, data_digest, pruned, prev_hash, hash)
    SELECT %(run)s, head.seq, %(at)s, %(actor)s, %(verb)s, %(data)s::jsonb, %(digest)s, false,
        head.prev,
        encode(sha256(convert_to(
            '[' || head.seq || ',' || %(middle)s || ',"' || head.prev || '"]', 'UTF8')), 'hex')
    FROM head
    RETURNING id, seq, prev_hash, hash
)
UPDATE runs_run SET event_seq = event.seq, event_hash = event.hash, updated_at = %(at)s
FROM event WHERE runs_run.id = %(run)s
RETURNING event.id, event.seq, event.prev_hash, event.hash
"""

# Run.lock: the lock order (a run's row before its steps, ledger rows, waits, …).
LOCK_RUN = "SELECT 1 FROM runs_run WHERE id = %s FOR UPDATE"
LOCK_RUN_OR_SKIP = LOCK_RUN + " SKIP LOCKED"

# -- the hot path's one-statement transactions (runs.batch) -------------------------------------

# The events travel as one jsonb array (cheaper to build and to send than eight arrays).
INSERT_EVENTS = (
    "INSERT INTO runs_timelineevent "
    "(run_id, seq, at, actor, verb, data, data_digest, pruned, prev_hash, hash) "
    "SELECT %s, e.seq, e.at, e.actor, e.verb, e.data, e.digest, false, e.prev, e.hash FROM "
    "jsonb_to_recordset(%s::jsonb) AS e(seq int, at timestamptz, actor text, verb text, "
    "data jsonb, digest text, prev text, hash text)"
)

# A new run and its first events: nothing at all when its business key started a run already
# (the key's unique index decides, also between two starts racing for it).
CREATE_RUN = (
    "WITH run AS (INSERT INTO runs_run "
    "SELECT * FROM jsonb_populate_record(NULL::runs_run, %s::jsonb) "
    "ON CONFLICT (business_key) DO NOTHING RETURNING id), "
    "events AS (INSERT INTO runs_timelineevent "
    "(run_id, seq, at, actor, verb, data, data_digest, pruned, prev_hash, hash) "
    "SELECT run.id, e.seq, e.at, e.actor, e.verb, e.data, e.digest, false, e.prev, e.hash "
    "FROM run, "
    "jsonb_to_recordset(%s::jsonb) AS e(seq int, at timestamptz, actor text, verb text, "
    "data jsonb, digest text, prev text, hash text)) "
    "SELECT count(*) FROM run"
)

# Ids taken from a table's sequence ahead of the INSERTs (runs.batch.Ids).
ID_BLOCK = "SELECT nextval(pg_get_serial_sequence(%s, 'id')) FROM generate_series(1, %s)"


_WORD = re.compile(r"[a-z_]+")


@functools.lru_cache(maxsize=32)
def insert_row(table: str) -> str:
    """INSERT one row of `table`, every column, from one jsonb parameter."""
    return f"INSERT INTO {table} SELECT * FROM jsonb_populate_record(NULL::{table}, %s::jsonb)"


@functools.lru_cache(maxsize=256)
def compare_and_set(
    table: str, columns: tuple[str, ...], where: tuple[tuple[str, str], ...]
) -> str:
    """UPDATE `columns` of one row WHERE id and the guards: (column, "=") equals a parameter,
    (column, "unexpired") is later than now(), (column, (value, …)) is one of those constants
    (a verb's statuses: lowercase words only, written into the text)."""
    sets = ", ".join(f"{column} = %s" for column in columns)
    conditions = ["id = %s"]
    for column, kind in where:
        if kind == "unexpired":
            conditions.append(f"{column} > now()")
        elif isinstance(kind, tuple):
            if not all(_WORD.fullmatch(str(value)) for value in kind):
                raise ValueError(f"not a status: {kind!r}")
            listed = ", ".join(f"'{value}'" for value in map(str, kind))
            conditions.append(f"{column} IN ({listed})")
        else:
            conditions.append(f"{column} = %s")
    return f"UPDATE {table} SET {sets} WHERE {' AND '.join(conditions)}"


@functools.lru_cache(maxsize=256)
def run_change(sets: tuple[str, ...], *, expect_status: bool) -> str:
    """The run's row in a batch: `sets` (each "column = …"), by a compare-and-set on the chain
    head the worker holds (and on the status it expects)."""
    where = "id = %s AND event_seq = %s AND event_hash = %s"
    if expect_status:
        where += " AND status = %s"
    return f"UPDATE runs_run SET {', '.join(sets)} WHERE {where}"


@functools.lru_cache(maxsize=512)
def batch_statement(
    run_sql: str,
    parts: tuple[tuple[str, str], ...],
    checks: tuple[tuple[str, str], ...],
    values: tuple[str, ...],
    shared: tuple[str, ...] = (),
) -> str:
    """A batch's one statement: the run's change, then each part (SQL, what it guards), each a
    data-modifying CTE that must touch exactly one row (tp_assert, runs/migrations/0010), the
    events, the reads the conditions and values share (`sN`, each made once: Batch.shared),
    then the conditions (SQL, what) and the values returned."""
    ctes = [f"run AS ({run_sql} RETURNING 1)"]
    asserts = ["tp_assert((SELECT count(*) FROM run) = 1, 'run moved')"]
    for n, (sql, what) in enumerate(parts):
        ctes.append(f"c{n} AS ({sql} RETURNING 1)")
        asserts.append(f"tp_assert((SELECT count(*) FROM c{n}) = 1, '{what}')")
    ctes.append(f"events AS ({INSERT_EVENTS})")
    ctes += [f"s{n} AS MATERIALIZED (SELECT ({sql}) AS v)" for n, sql in enumerate(shared)]
    asserts += [f"tp_assert({condition}, '{what}')" for condition, what in checks]
    selected = asserts + [f"({sql})" for sql in values]
    return f"WITH {', '.join(ctes)} SELECT {', '.join(selected)}"


@functools.lru_cache(maxsize=16)
def select_fresh_run(columns: tuple[str, ...], pauses: str | None, rules: str | None) -> str:
    """The hot path's read of a run it may start (runs.engine.inline.claim_fresh): its columns,
    whether it has steps, and (when given) the open pauses and the approval rules' digest."""
    return (
        f"SELECT {', '.join(f'r.{column}' for column in columns)}, "
        "EXISTS (SELECT 1 FROM runs_step s WHERE s.run_id = r.id)"
        + (f", ({pauses})" if pauses else "")
        + (f", ({rules})" if rules else "")
        + " FROM runs_run r WHERE r.id = %s"
    )


# -- liveness (runs.engine.liveness) ----------------------------------------------------------

# Steps whose lease owner stopped beating: their leases expire now; the runs to hint, and the
# workers newly found dead.
TAKE_BACK_STALE = """
WITH taken AS (
    UPDATE runs_step s SET lease_expires_at = now()
    WHERE s.status = 'running' AND s.lease_expires_at > now() AND EXISTS (
        SELECT 1 FROM runs_worker w
        WHERE w.id = s.lease_owner AND w.id <> %(me)s
          AND w.beat_at < now() - make_interval(secs => %(dead_after)s))
    RETURNING s.run_id
), found AS (
    UPDATE runs_worker SET dead_at = now(), found_dead_by = %(me)s
    WHERE id <> %(me)s AND dead_at IS NULL AND stopped_at IS NULL
      AND beat_at < now() - make_interval(secs => %(dead_after)s)
    RETURNING id
)
SELECT (SELECT array_agg(DISTINCT run_id) FROM taken), (SELECT array_agg(id) FROM found)
"""

# The previous incarnations of this node: dead now, their leases taken back at once.
TAKE_BACK_PREVIOUS = """
WITH found AS (
    UPDATE runs_worker SET dead_at = now(), found_dead_by = %(me)s
    WHERE node = %(node)s AND id <> %(me)s AND dead_at IS NULL AND stopped_at IS NULL
    RETURNING id
), taken AS (
    UPDATE runs_step s SET lease_expires_at = now()
    WHERE s.status = 'running' AND s.lease_expires_at > now() AND EXISTS (
        SELECT 1 FROM runs_worker w
        WHERE w.id = s.lease_owner AND w.node = %(node)s AND w.id <> %(me)s)
    RETURNING s.run_id
)
SELECT DISTINCT run_id FROM taken
"""

REGISTER_WORKER = """
INSERT INTO runs_worker (id, node, host, pid, started_at, beat_at, stopped_at, dead_at,
    found_dead_by)
VALUES (%(me)s, %(node)s, %(host)s, %(pid)s, now(), now(), NULL, NULL, '')
ON CONFLICT (id) DO UPDATE SET beat_at = now(), stopped_at = NULL, dead_at = NULL
"""

# A beat; it returns when this worker had been found dead (while it was away), if it had.
BEAT = """
UPDATE runs_worker w SET beat_at = now(), dead_at = NULL
FROM (SELECT id, dead_at FROM runs_worker WHERE id = %s FOR UPDATE) before
WHERE w.id = before.id
RETURNING before.dead_at
"""

WORKER_STOPPED = "UPDATE runs_worker SET stopped_at = now() WHERE id = %s"

# The fence before a call: the step is still running under this worker's lease and attempt,
# unexpired.
STILL_HELD = (
    "SELECT 1 FROM runs_step WHERE id = %s AND status = 'running' AND lease_owner = %s "
    "AND attempts = %s AND lease_expires_at > now()"
)

"""Admins' decisions over tools' own metadata, as the engine sees them.

`runs.tools.get` and `all_tools` pass every tool through `apply` (installed by
ApprovalsConfig.ready; `runs` never imports this): the tool as its code registered it, or a copy
(`dataclasses.replace`) with the decision in force (approvals.models.ToolMetadataOverride). The
engine calls `get` several times per step, so `apply` costs the caller no statement:

- Each process keeps the decisions in force in memory, with the history's stamp (its row count
  and newest id: rows are only ever added, so every committed change moves it).
- At most every REFRESH_SECONDS, a `get` reads the stamp, and the decisions when it moved — on
  a connection of its own, opened for the read and closed (like the heartbeat's, outside the
  pool: a worker's threads hold its pooled connections while they call `get`, and the read
  must never wait behind them), with short timeouts. The engine's statements, transactions and
  pooled connections never include it. Every other `get` reads nothing. A process whose Django
  never connected to the database (a command without one, a test without database access)
  reads nothing either.
- The process that saves a change reads the decisions again within the saving transaction, on
  its own connection (one statement, on every save): it uses the change at once. The tools page
  does the same read first, so it shows what is in force.
- The copy of a tool is made once per (tool, decision) and kept; a tool with no decision is
  returned as it is (the same object).

So a worker in another process uses a change from its first `get` that comes REFRESH_SECONDS or
more after the change committed: within 2 s in a busy worker, at its next step in an idle one.
A step keeps what it already read (a call in flight is not re-decided). When the decisions
cannot be read (no database, a schema not migrated yet, a lock held on the table), the last
ones read stay in force — the tools' own metadata if none ever were — and the read is tried
again REFRESH_SECONDS later; that is logged.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from typing import Any

import psycopg
from django.db import connection, connections, transaction
from django.db.backends.signals import connection_created

from runs import tools as tool_registry

logger = logging.getLogger("taskpilots.engine")

# How stale a process's copy of the decisions may be (after a change committed elsewhere).
REFRESH_SECONDS = 2.0
# A read on the side gives up on connecting, on a lock (a migration of the table) or on a slow
# server after these: a `get` is never held up for long.
CONNECT_TIMEOUT_SECONDS = 2
LOCK_TIMEOUT_MS = 1000
STATEMENT_TIMEOUT_MS = 2000

_TABLE = "approvals_toolmetadataoverride"
_STAMP = f"SELECT count(*), coalesce(max(id), 0) FROM {_TABLE}"
# The stamp and the newest row of every tool, in one statement (so one snapshot).
_LOAD = f"""
SELECT s.n, s.top, o.id, o.tool, o.risk, o.side_effect, o.dedupes_by_key
FROM (SELECT count(*) AS n, coalesce(max(id), 0) AS top FROM {_TABLE}) s
LEFT JOIN (SELECT DISTINCT ON (tool) id, tool, risk, side_effect, dedupes_by_key
           FROM {_TABLE} ORDER BY tool, id DESC) o ON true
"""
_NEVER = float("-inf")

Read = Callable[[str], list[tuple]]


@dataclasses.dataclass(frozen=True)
class Decision:
    """A decision in force: its row and the fields it sets."""

    pk: int
    fields: Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class _Loaded:
    stamp: tuple[int, int] | None  # None: read everything at the next `apply`
    decisions: Mapping[str, Decision]
    checked_at: float


class NotConnected(Exception):
    """This process has not used the database yet: nothing to read on the side for."""


def read_here(sql: str) -> list[tuple]:
    """One read on the caller's connection, which sees its own transaction's writes. Inside a
    transaction a savepoint keeps a failed read from breaking it."""
    guard = transaction.atomic() if connection.in_atomic_block else nullcontext()
    with guard, connection.cursor() as cursor:
        cursor.execute(sql)
        return cursor.fetchall()


def read_on_the_side(sql: str) -> list[tuple]:
    """One autocommitted read on a connection of its own, opened for it and closed: committed
    data only, bounded by CONNECT_TIMEOUT_SECONDS, LOCK_TIMEOUT_MS and STATEMENT_TIMEOUT_MS."""
    if not _django_connected.is_set():
        raise NotConnected
    params = connections["default"].get_connection_params()
    params.pop("cursor_factory", None)
    limits = f"-clock_timeout={LOCK_TIMEOUT_MS} -cstatement_timeout={STATEMENT_TIMEOUT_MS}"
    params["options"] = f"{params.get('options', '')} {limits}".strip()
    params.setdefault("connect_timeout", CONNECT_TIMEOUT_SECONDS)
    with psycopg.connect(**params, autocommit=True) as conn:
        return conn.execute(sql).fetchall()


# Set once Django has opened a connection in this process (Django's own database access rules
# then hold for the side reads too: pytest-django's blocker, a command without a database).
_django_connected = threading.Event()


def _on_connection_created(sender, connection, **kwargs) -> None:
    if connection.alias == "default":
        _django_connected.set()


class LocalMetadata:
    """One process's copy of the decisions (module docstring). Thread-safe: the state is one
    immutable value swapped whole, and one thread at a time reads the database for it."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        refresh_seconds: float | None = None,
        read: Read | None = None,
    ) -> None:
        self.clock = clock
        self.refresh_seconds = REFRESH_SECONDS if refresh_seconds is None else refresh_seconds
        # How the timed checks reach PostgreSQL (read_on_the_side; tests give another).
        self.read = read or read_on_the_side
        self.reset()

    def reset(self) -> None:
        """Forget everything (a forked child, a test): the next `apply` reads it all again."""
        self._loaded = _Loaded(None, {}, _NEVER)
        self._copies: dict[str, tuple[tool_registry.Tool, int, tool_registry.Tool]] = {}
        self._reading = threading.Lock()
        # The reads that answered, by kind ("stamp", "load"), for tests and a look in a shell.
        self.reads: collections.Counter[str] = collections.Counter()

    def apply(self, tool: tool_registry.Tool) -> tool_registry.Tool:
        """`tool` with the decision in force over it (the same object when there is none)."""
        loaded = self._loaded
        if self.clock() - loaded.checked_at >= self.refresh_seconds:
            loaded = self.refresh()
        decision = loaded.decisions.get(tool.name)
        if decision is None:
            return tool
        cached = self._copies.get(tool.name)
        if cached is not None and cached[0] is tool and cached[1] == decision.pk:
            return cached[2]
        copy = dataclasses.replace(tool, **decision.fields)
        self._copies[tool.name] = (tool, decision.pk, copy)
        return copy

    def decisions(self) -> Mapping[str, Decision]:
        """The decisions this process holds now (without reading anything)."""
        return self._loaded.decisions

    def refresh(self, *, here: bool = False) -> _Loaded:
        """The timed check: read the stamp, and the decisions when it moved (or when none were
        ever read), on the side. `here`: read the decisions in any case, on the caller's
        connection (one statement). A thread that finds another one reading goes on with what
        is held, unless nothing was ever read."""
        loaded = self._loaded
        if not self._reading.acquire(blocking=here or loaded.stamp is None):
            return loaded
        try:
            if self._loaded is not loaded and not here:  # another thread just read them
                return self._loaded
            now = self.clock()
            read = read_here if here else self.read
            try:
                if loaded.stamp is not None and not here:
                    stamp = tuple(read(_STAMP)[0])
                    self.reads["stamp"] += 1
                    if stamp == loaded.stamp:
                        self._loaded = dataclasses.replace(loaded, checked_at=now)
                        return self._loaded
                rows = read(_LOAD)
                self.reads["load"] += 1
                self._loaded = _decisions(rows, now)
            except NotConnected:  # tried again at the next `get`, quietly
                pass
            except Exception as exc:  # see the module docstring: the last decisions stay
                logger.warning(
                    "local tool metadata could not be read (%s: %s); %s",
                    type(exc).__name__,
                    (str(exc).splitlines() or [""])[0],
                    "the last decisions read stay in force"
                    if loaded.decisions
                    else "the tools' own metadata applies",
                )
                self._loaded = dataclasses.replace(loaded, checked_at=now)
            return self._loaded
        finally:
            self._reading.release()


def _decisions(rows: list[tuple], now: float) -> _Loaded:
    decisions: dict[str, Decision] = {}
    for _n, _top, pk, tool, risk, side_effect, dedupes_by_key in rows:
        if pk is None:
            continue
        fields: dict[str, Any] = {}
        if risk:
            fields["risk"] = risk
        if side_effect is not None:
            fields["side_effect"] = side_effect
        if dedupes_by_key is not None:
            fields["dedupes_by_key"] = dedupes_by_key
        if fields:  # a clear: the tool's own metadata
            decisions[tool] = Decision(pk, fields)
    return _Loaded((rows[0][0], rows[0][1]), decisions, now)


# This process's copy, behind runs.tools.get (approvals.people.People.local_metadata).
CACHE = LocalMetadata()
# A forked child (a prefork pool process) must not inherit a lock held by a parent's thread.
os.register_at_fork(after_in_child=CACHE.reset)


def install() -> None:
    connection_created.connect(_on_connection_created, dispatch_uid="local-tool-metadata")
    if connections["default"].connection is not None:  # installed late (a test)
        _django_connected.set()


def changed() -> None:
    """A decision was written in the current transaction: this process uses it at once. (If
    that transaction rolled back, the next timed check finds the stamp moved back.)"""
    CACHE.refresh(here=True)

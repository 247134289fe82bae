"""Admins' decisions over tools' own metadata, as the engine sees them.

`runs.tools.get` and `all_tools` pass every tool through `apply` (installed by
ApprovalsConfig.ready; `runs` never imports this): the tool as its code registered it, or a copy
(`dataclasses.replace`) with the decision in force (approvals.models.ToolMetadataOverride). The
engine calls `get` several times per step, so `apply` reads no database on its way:

- The decisions in force are kept per process, with the history's stamp (its row count and
  newest id: rows are only ever added, so every committed change moves it).
- At most every REFRESH_SECONDS, the first `get` asks PostgreSQL for the stamp (one statement
  on the index), and reloads the decisions only when it moved (one more). No other `get` reads
  anything.
- The process that saves a change drops what it holds at once and again when the change
  commits, so its next `get` reloads.
- The copy of a tool is made once per (tool, decision) and kept; a tool with no decision is
  returned as it is (the same object).

So a worker in another process uses a change from its first `get` that comes more than
REFRESH_SECONDS after the change committed: within REFRESH_SECONDS (2 s) in a busy worker, and
at the next step in an idle one. What a step already read keeps for that step (a call in
flight is not re-decided). When the decisions cannot be read at all (no database, a schema not
migrated yet), the last ones read stay in force — the tools' own metadata if none ever were —
and the read is tried again REFRESH_SECONDS later; that is logged.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from typing import Any

from django.db import connection, transaction

from runs import tools as tool_registry

logger = logging.getLogger("taskpilots.engine")

# How stale a process's copy of the decisions may be (after a change committed elsewhere).
REFRESH_SECONDS = 2.0

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


class LocalMetadata:
    """One process's copy of the decisions (module docstring). Thread-safe: the state is one
    immutable value swapped whole, and one thread at a time reads the database for it."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        refresh_seconds: float | None = None,
    ) -> None:
        self.clock = clock
        self.refresh_seconds = REFRESH_SECONDS if refresh_seconds is None else refresh_seconds
        self.reset()

    def reset(self) -> None:
        """Forget everything (a forked child, a test): the next `apply` reads it all again."""
        self._loaded = _Loaded(None, {}, _NEVER)
        self._copies: dict[str, tuple[tool_registry.Tool, int, tool_registry.Tool]] = {}
        self._reading = threading.Lock()

    def invalidate(self) -> None:
        """A change was saved (or committed) here: the next `apply` reads the decisions."""
        self._loaded = dataclasses.replace(self._loaded, stamp=None, checked_at=_NEVER)

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

    def refresh(self, *, force: bool = False) -> _Loaded:
        """Read the stamp, and the decisions if it moved (or `force`: read them in any case,
        in one statement). A thread that finds another one reading goes on with what is held,
        unless nothing usable is held."""
        loaded = self._loaded
        blocking = force or loaded.stamp is None
        if not self._reading.acquire(blocking=blocking):
            return loaded
        try:
            if self._loaded is not loaded and not force:  # another thread just read it
                return self._loaded
            now = self.clock()
            try:
                if loaded.stamp is not None and not force:
                    stamp = tuple(_fetch(_STAMP)[0])
                    if stamp == loaded.stamp:
                        self._loaded = dataclasses.replace(loaded, checked_at=now)
                        return self._loaded
                self._loaded = _read_all(now)
            except Exception as exc:  # no database, no table yet, a test without database
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


def _fetch(sql: str) -> list[tuple]:
    # Inside the caller's transaction a savepoint keeps a failed read from breaking it; outside
    # one, a single autocommit statement.
    guard = transaction.atomic() if connection.in_atomic_block else nullcontext()
    with guard, connection.cursor() as cursor:
        cursor.execute(sql)
        return cursor.fetchall()


def _read_all(now: float) -> _Loaded:
    rows = _fetch(_LOAD)
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


# This process's copy, behind runs.tools.get.
CACHE = LocalMetadata()
# A forked child (a prefork pool process) must not inherit a lock held by a parent's thread.
os.register_at_fork(after_in_child=CACHE.reset)


def install() -> None:
    tool_registry.set_local_metadata(CACHE.apply)


def changed() -> None:
    """A decision was written in the current transaction: reload now (for this transaction's
    own reads) and again once it commits (for everyone else's in this process)."""
    CACHE.invalidate()
    transaction.on_commit(CACHE.invalidate)

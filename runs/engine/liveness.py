"""Liveness: dead workers noticed in seconds, slow workers never doubled.

The lease is the safety net, not the detector. Every worker process beats in PostgreSQL (its
`Worker` row) every TASKPILOTS_HEARTBEAT_SECONDS, from a thread of its own:

1. At start it registers its incarnation, and takes back at once the leases its own previous
   incarnation (the same node name) still held: a restarted worker never waits for them.
2. Each beat also looks for other workers whose heartbeat stopped more than
   TASKPILOTS_WORKER_DEAD_SECONDS ago and takes their leases back (the steps' leases expire
   now; the runs are hinted, so another worker claims them through the ordinary reclaim path,
   which raises the step's attempt: the fencing value). A worker judges others only after it
   has itself been beating without a gap for that long, so a PostgreSQL restart, which stops
   everyone's heartbeat at once, does not make every worker declare every other one dead.
3. A worker that was only paused (SIGSTOP, a long GC pause, a frozen VM) and wakes up after its
   claim was taken back records nothing over the new owner's work (every recording is
   conditional on its Lease: owner and attempt) and sends nothing new: before every call, and
   again as the call's request is about to leave (runs.tools.about_to_send), it checks
   `fence(claim)`. That costs nothing while the claim is young and the heartbeat vouches for
   it (fresh, and beating without a gap since the claim was made: a process back from a pause
   restarts its streak), and otherwise asks PostgreSQL whether the claim still holds.
   What no check in the sender can close is a pause between that last check and the bytes
   leaving (a few statements of the HTTP client): the request then lands after the new
   owner's lookup. The settle window narrows it (the new owner looks up only once it has
   passed); a tool that dedupes by key closes it.

A stopped worker (warm shutdown) marks its row stopped; its steps finished before it stopped.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time

import psycopg
from django.db import connection, connections

from runs import statements
from runs.engine.dispatch import conf, hint, worker_id
from runs.tools import NotSent

logger = logging.getLogger("taskpilots.engine")

# Between a check that passes and the call it allows, and for clocks: what the checks keep back.
SAFETY_SECONDS = 1.0


class ClaimLost(NotSent):
    """The claim was taken back while this worker was paused or cut off: do nothing more for
    the step (its new owner reconciles whatever this worker left)."""


class Heartbeat:
    """This process's heartbeat thread (one per worker process; see the module docstring)."""

    current: Heartbeat | None = None

    def __init__(self, node: str, worker: str | None = None) -> None:
        self.node = node
        self.worker = worker or worker_id()
        self.interval = conf("HEARTBEAT_SECONDS")
        self.dead_after = conf("WORKER_DEAD_SECONDS")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # A connection of its own, outside the pool: a beat must never wait behind the worker's
        # threads for a pooled connection (a late beat would make this worker look dead).
        self._conn = None
        # Monotonic times: when the last beat that succeeded was sent, and since when beats
        # have succeeded without a gap.
        self.last_beat: float | None = None
        self.steady_since: float | None = None

    @classmethod
    def start(cls, node: str) -> Heartbeat:
        """Register this incarnation, take back the previous one's leases, start beating."""
        if cls.current is not None and cls.current.worker == worker_id():
            return cls.current
        heartbeat = cls(node)
        heartbeat._register()
        heartbeat._thread = threading.Thread(target=heartbeat._run, daemon=True, name="heartbeat")
        heartbeat._thread.start()
        cls.current = heartbeat
        return heartbeat

    def stop(self) -> None:
        """A clean shutdown: stop beating and say so (nothing of ours is left running)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.interval + 5)
        try:
            self._execute(statements.WORKER_STOPPED, [self.worker])
        except Exception:  # the database being away at shutdown: the others find us stale
            logger.warning("could not mark worker %s stopped", self.worker)
        finally:
            self._close()
        if Heartbeat.current is self:
            Heartbeat.current = None

    def fresh(self) -> bool:
        """Whether no other worker can have found this one dead: its last beat went out less
        than WORKER_DEAD_SECONDS (minus a safety margin) ago."""
        last = self.last_beat
        return last is not None and time.monotonic() - last < self.dead_after - SAFETY_SECONDS

    def vouches_for(self, claimed_at: float) -> bool:
        """Whether no other worker can have found this one dead since `claimed_at` (monotonic):
        it is fresh now, and its beats have had no gap since then. A process that was away
        (paused, cut off) restarts its streak at its first beat back, so a claim made before
        the pause is not vouched for even once the beats are fresh again."""
        fresh = self.fresh()  # read before the streak: a beat updates last_beat first
        since = self.steady_since
        return fresh and since is not None and since <= claimed_at

    # -- the thread ------------------------------------------------------------------------

    def _register(self) -> None:
        sent = time.monotonic()
        params = {
            "me": self.worker,
            "node": self.node,
            "host": socket.gethostname()[:200],
            "pid": os.getpid(),
        }
        self._execute(statements.REGISTER_WORKER, params)
        runs = [row[0] for row in self._execute(statements.TAKE_BACK_PREVIOUS, params)]
        self.last_beat = self.steady_since = sent
        for run_id in runs:
            hint(run_id)
        if runs:
            logger.warning(
                "worker %s took back %d steps its previous incarnation held", self.worker, len(runs)
            )

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._beat()
            except Exception:  # a beat that fails (PostgreSQL restarting): the streak restarts
                self.steady_since = None
                logger.warning("heartbeat of %s failed", self.worker, exc_info=True)
                self._close()

    def _beat(self) -> None:
        sent = time.monotonic()
        if self.last_beat is not None and sent - self.last_beat >= self.dead_after - SAFETY_SECONDS:
            # This process itself was away (paused, cut off) long enough that another worker
            # may have found it dead: the streak restarts, and claims made before it are no
            # longer vouched for (fence asks PostgreSQL about them).
            self.steady_since = None
        judge = self.steady_since is not None and sent - self.steady_since >= self.dead_after
        rows = self._execute(statements.BEAT, [self.worker])
        if not rows:  # our row is gone (pruned while we were away): register again
            self._register()
            return
        if rows[0][0] is not None:
            logger.warning("worker %s was found dead while away; beating again", self.worker)
        taken = []
        if judge:
            params = {"me": self.worker, "dead_after": self.dead_after}
            runs, found = self._execute(statements.TAKE_BACK_STALE, params)[0]
            taken = runs or []
            if found:
                logger.warning("workers %s stopped beating: their leases taken back", found)
        self.last_beat = sent
        if self.steady_since is None:
            self.steady_since = sent
        for run_id in taken:
            hint(run_id)

    def _execute(self, sql: str, params) -> list:
        """One autocommitted statement on the heartbeat's own connection; its rows."""
        if self._conn is None or self._conn.closed:
            params_of = connections["default"].get_connection_params()
            params_of.pop("cursor_factory", None)
            self._conn = psycopg.connect(**params_of, autocommit=True)
        with self._conn.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchall() if cursor.description else []

    def _close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None


def fence(claim) -> None:
    """Before a call for `claim`: raise ClaimLost unless this worker surely still holds it.

    Free while the claim is young (well inside its lease) and this process's heartbeat is fresh
    (no one can have found it dead); otherwise one query asks whether the step is still running
    under this worker's lease and attempt, unexpired."""
    young = time.monotonic() - claim.claimed_at < conf("LEASE_SECONDS") - SAFETY_SECONDS
    heartbeat = Heartbeat.current
    if young and (
        heartbeat is None
        or heartbeat.worker != claim.worker
        or heartbeat.vouches_for(claim.claimed_at)
    ):
        return
    step = claim.step
    with connection.cursor() as cursor:
        cursor.execute(statements.STILL_HELD, [step.pk, claim.worker, step.attempts])
        held = cursor.fetchone() is not None
    if not held:
        raise ClaimLost(
            f"step {step.name!r} (attempt {step.attempts}) is no longer held by {claim.worker}"
        )

"""Dispatch: Celery messages are only hints that a run has work (PostgreSQL decides)."""

from __future__ import annotations

import logging
import os
import secrets
import socket

from celery import current_app
from django.conf import settings
from django.db import transaction

logger = logging.getLogger("taskpilots.engine")
ADVANCE_TASK = "runs.tasks.advance_run"


def conf(name: str):
    return settings.TASKPILOTS[name]


def worker_id() -> str:
    """This process's incarnation, the name on its leases: host, pid and a token drawn when the
    process started (again after a fork: prefork pool children are incarnations of their own),
    so a restarted worker — even one that gets the same pid, as in a container — is never taken
    for its previous incarnation (runs.engine.liveness)."""
    return _incarnation[0]


def _new_incarnation() -> None:
    _incarnation[0] = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


_incarnation = [""]
_new_incarnation()
os.register_at_fork(after_in_child=_new_incarnation)


def enqueue(run_id, *, countdown: float | None = None, expires: float | None = None) -> None:
    """Ask a worker to advance the run once the current transaction commits.

    `expires` bounds hints that are repeated anyway (the sweeper's): when no worker consumes for
    a while, stale copies are dropped on receipt instead of each costing a database round trip.
    """
    if conf("DISPATCH") != "celery":
        return
    transaction.on_commit(lambda: hint(run_id, countdown=countdown, expires=expires))


def hint(run_id, *, countdown: float | None = None, expires: float | None = None) -> None:
    """Send the hint now (enqueue sends it once the current transaction commits)."""
    if conf("DISPATCH") != "celery":
        return
    try:
        options: dict = {"countdown": countdown} if countdown else {}
        if expires:
            options["expires"] = expires
        # By name: runs.tasks imports the engine, not the other way round.
        current_app.send_task(ADVANCE_TASK, (str(run_id),), **options)
    except Exception:  # the broker being down only delays the run: the sweeper re-derives it
        logger.warning("could not enqueue run %s; the sweeper will pick it up", run_id)


def queued_hints() -> int:
    """How many hints wait in the broker for a worker (0 when it cannot say, or when hints are
    not sent at all): the sweeper's measure of a backlog."""
    if conf("DISPATCH") != "celery":
        return 0
    try:
        with current_app.connection_for_read() as conn:
            queue = current_app.conf.task_default_queue
            return conn.default_channel.queue_declare(queue=queue, passive=True).message_count
    except Exception:  # a broker that is down or cannot say: no backlog known
        return 0

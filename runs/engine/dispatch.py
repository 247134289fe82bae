"""Dispatch: Celery messages are only hints that a run has work (PostgreSQL decides)."""

from __future__ import annotations

import atexit
import logging
import os
import secrets
import socket
import threading
import time

from celery import current_app, signals
from django.conf import settings
from django.db import transaction
from kombu.utils.uuid import uuid

logger = logging.getLogger("taskpilots.engine")
ADVANCE_TASK = "runs.tasks.advance_run"
ADVANCE_MANY_TASK = "runs.tasks.advance_runs"


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
    if countdown or expires:
        transaction.on_commit(lambda: hint(run_id, countdown=countdown, expires=expires))
    else:
        transaction.on_commit(lambda: hint_soon(run_id))


def hint(run_id, *, countdown: float | None = None, expires: float | None = None) -> None:
    """Send the hint now (enqueue sends it once the current transaction commits)."""
    if conf("DISPATCH") != "celery":
        return
    try:
        sender = None if countdown or expires or _publish_observed() else _sender()
        if sender is not None and sender.short:
            sender.send(str(run_id))
        else:
            options: dict = {"countdown": countdown} if countdown else {}
            if expires:
                options["expires"] = expires
            # By name: runs.tasks imports the engine, not the other way round.
            current_app.send_task(ADVANCE_TASK, (str(run_id),), **options)
    except Exception:  # the broker being down only delays the run: the sweeper re-derives it
        logger.warning("could not enqueue run %s; the sweeper will pick it up", run_id)


def hint_soon(run_id) -> None:
    """The plain hint, sent within HINT_LINGER_MS together with the others this process sends
    meanwhile: one message for up to HINT_BATCH runs (`_Coalescer`). Immediately, alone, where
    lingering is off or a publish is observed (tracing wants each hint's own span)."""
    if conf("DISPATCH") != "celery":
        return
    linger = conf("HINT_LINGER_MS")
    if linger <= 0 or _publish_observed():
        hint(run_id)
        return
    try:
        sender = _sender()
    except Exception:  # the app cannot work the message out (a broker URL it cannot parse)
        hint(run_id)
        return
    _coalescer.add(sender, str(run_id), linger / 1000)


def hint_many(run_ids: list[str]) -> None:
    """Hints for these runs now, as one message (one run: the plain hint)."""
    if not run_ids or conf("DISPATCH") != "celery":
        return
    if len(run_ids) == 1:
        hint(run_ids[0])
        return
    try:
        sender = None if _publish_observed() else _sender()
        if sender is not None and sender.short:
            sender.send_many(run_ids)
        else:
            current_app.send_task(ADVANCE_MANY_TASK, (list(run_ids),))
    except Exception:  # as for one hint: the sweeper re-derives what was lost
        logger.warning("could not enqueue %d runs; the sweeper will pick them up", len(run_ids))


class _Coalescer:
    """Hints sent together: a run's hint waits up to the linger for others, and whatever came
    in meanwhile leaves as one message (a batch per sender, that is per queue), by a thread of
    its own so no caller waits. A message costs the sender, the broker and the worker's consumer
    about the same for one run as for sixteen: under a burst (runs started by many threads, an
    incident's bulk recovery) this takes most of that cost off each run; alone, a run's hint
    leaves a linger later than it would have.

    A hint held here when the process dies is lost like one the broker lost: the sweeper
    re-derives the run (STALE_RUN_SECONDS). A normal exit sends what is held (atexit)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[_HintSender, list[str]] = {}
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._linger = 0.0

    def add(self, sender: _HintSender, run_id: str, linger: float) -> None:
        with self._lock:
            self._held.setdefault(sender, []).append(run_id)
            self._linger = linger
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, daemon=True, name="hints")
                self._thread.start()
        self._wake.set()

    def _serve(self) -> None:
        while True:
            self._wake.wait()
            time.sleep(self._linger)
            self._wake.clear()
            try:
                self.flush()
            except Exception:  # this thread is every later hint's way out: it goes on
                logger.exception("could not send the hints held; the sweeper will pick them up")

    def flush(self) -> None:
        """Send every hint held, now."""
        with self._lock:
            held, self._held = self._held, {}
        size = conf("HINT_BATCH")
        for sender, run_ids in held.items():
            for start in range(0, len(run_ids), size):
                chunk = run_ids[start : start + size]
                try:
                    sender.send_batch(chunk)
                except Exception:  # the broker being down only delays the runs (the sweeper)
                    logger.warning(
                        "could not enqueue %d runs; the sweeper will pick them up", len(chunk)
                    )


_coalescer = _Coalescer()
atexit.register(lambda: _coalescer.flush())


def _after_fork() -> None:
    """A forked child holds none of its parent's hints (the parent sends them) and none of its
    threads."""
    global _coalescer
    _coalescer = _Coalescer()


os.register_at_fork(after_in_child=_after_fork)


def flush_hints() -> None:
    """Send the hints this process holds, now (tests; a process about to exit does it itself)."""
    _coalescer.flush()


class _HintSender:
    """The plain hint (no countdown, no expiry) as `send_task` would send it, for about half its
    CPU: the message's route, headers and publish options are worked out once per process, and
    each hint fills in its ids and publishes through the app's producer pool.

    `send_task` works the same message out again for every call — settings read one by one,
    the reprs of its arguments, copies of the queue to find out it is declared already — and a
    run's creation pays that once, as does every hint a worker sends (the client's CPU per step
    in `python manage.py bench engine` is where it shows). This builds the message with Celery's
    own `as_task_v2`, for the route Celery's router gives the task, and copies it per hint: the
    worker receives the same protocol-2 message (tests/runs/test_dispatch.py compares the two on
    the configured broker).
    """

    def __init__(self, app, task: str = ADVANCE_TASK) -> None:
        # Protocol 2 is Celery's default; under protocol 1 hints go through `send_task`.
        self.short = app.conf.task_protocol == 2
        # The time limits the registered task carries (Celery's task_time_limit settings), as
        # `send_task` puts them in the message where runs.tasks is imported; a worker reads the
        # same values from its own registry when a message has none.
        message = app.amqp.as_task_v2(
            "-",
            task,
            args=("-",),
            ignore_result=None,
            time_limit=app.conf.task_time_limit,
            soft_time_limit=app.conf.task_soft_time_limit,
        )
        self.headers, self.embed = message.headers, message.body[2]
        queue = app.amqp.router.route({}, task, ("-",), {})["queue"]
        exchange_type = getattr(queue.exchange, "type", "direct")
        if exchange_type == "direct":
            exchange, routing_key = "", queue.name
        else:
            exchange = queue.exchange.name or app.amqp.default_exchange
            routing_key = queue.routing_key or app.conf.task_default_routing_key
        self.app = app
        self.options = {
            "exchange": exchange,
            "routing_key": routing_key,
            "serializer": app.conf.task_serializer,
            "compression": app.conf.task_compression,
            "retry": app.conf.task_publish_retry,
            "retry_policy": dict(app.conf.task_publish_retry_policy or {}),
            "delivery_mode": getattr(queue.exchange, "delivery_mode", None)
            or app.conf.task_default_delivery_mode,
            "reply_to": "",
        }
        self.queue = queue
        self.declared = hash(queue)
        self._many: _HintSender | None = None

    def send(self, run_id: str) -> None:
        self._publish((run_id,), f"('{run_id}',)")

    def send_batch(self, run_ids: list[str]) -> None:
        """One message for these runs: the plain hint for one, runs.tasks.advance_runs for more."""
        if len(run_ids) == 1:
            self.send(run_ids[0])
        else:
            self.send_many(run_ids)

    def send_many(self, run_ids: list[str]) -> None:
        """One message for these runs: runs.tasks.advance_runs."""
        if self._many is None:
            self._many = _HintSender(self.app, ADVANCE_MANY_TASK)
        run_ids = list(run_ids)
        self._many._publish((run_ids,), repr((run_ids,)))

    def _publish(self, args: tuple, argsrepr: str) -> None:
        task_id = uuid()
        headers = dict(self.headers, id=task_id, root_id=task_id, argsrepr=argsrepr)
        with self.app.producer_or_acquire() as producer:
            # Declared once per broker connection, as kombu's `maybe_declare` does, but without
            # binding a copy of the queue on every publish to find that out.
            declared = self.declared in producer.connection.declared_entities
            producer.publish(
                (args, {}, self.embed),
                headers=headers,
                correlation_id=task_id,
                declare=None if declared else [self.queue],
                **self.options,
            )


_sender_cache: list = [None, None]  # [(app id, default queue), sender]


def _sender() -> _HintSender:
    """This process's sender for the app's current default queue (tests/worker.py gives each
    test its own queue by changing it at run time, and `send_task` follows such a change)."""
    app = current_app._get_current_object()
    key = (id(app), app.conf.task_default_queue)
    if _sender_cache[0] != key:
        _sender_cache[1] = _HintSender(app)
        _sender_cache[0] = key
    return _sender_cache[1]


def _publish_observed() -> bool:
    """The short path skips what `send_task` does around publishing, its signals (tracing
    instrumentation listens there): where any receiver is connected, hints take the long path."""
    return bool(
        signals.before_task_publish.receivers
        or signals.after_task_publish.receivers
        or signals.task_sent.receivers
    )


def forget_hint_senders() -> None:
    """Work out the hint message again on next use (a test that changed the app's routes)."""
    _sender_cache[0] = None


os.register_at_fork(after_in_child=forget_hint_senders)


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

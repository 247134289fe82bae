"""Real Celery workers for tests (see taskpilots/evidence/workers.py)."""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from django.conf import settings

from taskpilots.celery import app as celery_app
from taskpilots.evidence.workers import WorkerProcess, Workers, wait_for

__all__ = ["WorkerProcess", "Workers", "private_workers", "reading_queue", "wait_for"]

MODULES = "taskpilots.demo.tools,tests.runs.flows"


@contextmanager
def reading_queue(name: str):
    """A reader of the queue `name` on the configured broker (what hints sent there look like),
    the queue deleted afterwards."""
    with celery_app.connection_for_read() as conn:
        simple = conn.SimpleQueue(name)
        try:
            yield simple
        finally:
            simple.close()
            conn.default_channel.queue_delete(name)


@contextmanager
def private_workers(env: dict[str, str] | None = None, *, dispatch: bool = True) -> Iterator:
    """A pool of worker processes (none started yet) on a queue of this test's own, which this
    process sends its hints to. `dispatch`: send hints from now on (False: the test parks runs
    in-process first and turns dispatch on itself). Afterwards: what each worker said (shown by
    pytest when the test failed), every worker stopped — a stopped one woken first — the queue
    deleted and dispatch off again."""
    queue = f"tp-test-{uuid.uuid4().hex[:10]}"
    previous_queue = celery_app.conf.task_default_queue
    celery_app.conf.task_default_queue = queue
    if dispatch:
        settings.TASKPILOTS["DISPATCH"] = "celery"
    pool = Workers(queue, {"TASKPILOTS_WORKFLOW_MODULES": MODULES, **(env or {})})
    try:
        yield pool
    finally:
        for worker in pool.started:
            print(f"--- worker {worker.name} ---\n" + "".join(worker.output[-60:]))
            if worker.alive:
                os.killpg(worker.process.pid, signal.SIGCONT)
        pool.close()
        settings.TASKPILOTS["DISPATCH"] = "none"
        celery_app.conf.task_default_queue = previous_queue
        pool.delete_queue()

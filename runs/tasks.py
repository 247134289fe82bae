"""Celery tasks: thin wrappers that take ids, call the engine, and are safe to run twice."""

from __future__ import annotations

from celery import shared_task
from django.db import close_old_connections

from runs import engine


@shared_task(name="runs.tasks.advance_run", acks_late=True, reject_on_worker_lost=True)
def advance_run(run_id: str) -> int:
    close_old_connections()  # drop a connection that broke since the last task
    return engine.advance(run_id)


@shared_task(name="runs.tasks.advance_runs", acks_late=True, reject_on_worker_lost=True)
def advance_runs(run_ids: list[str]) -> int:
    """The hints of several runs in one message (runs.engine.dispatch.hint_soon)."""
    close_old_connections()
    return engine.advance_each(run_ids)


@shared_task(name="runs.tasks.sweep", acks_late=True)
def sweep() -> dict:
    close_old_connections()
    return engine.sweep().as_dict()


@shared_task(name="runs.tasks.check_consistency", acks_late=True, ignore_result=True)
def check_consistency() -> dict:
    # Safe twice: a mismatch is recorded once, and a pass only moves the cursor.
    close_old_connections()
    from runs.engine.consistency import check_consistency as check

    return check().as_dict()

"""Celery tasks of the approvals app: thin, take ids, safe to run twice."""

from __future__ import annotations

from celery import shared_task

# The modules the tasks run are imported by each task, not here: a worker imports this module as
# it starts, and bulk actions, the metrics and the notifications (with the console's forms and
# the API's schemas behind them) would cost every worker's start, and every restarted worker's
# recovery, a third of a second (docs/benchmarks.md, "Recovery latency").


@shared_task(name="approvals.tasks.deliver_notification", acks_late=True, ignore_result=True)
def deliver_notification(delivery_id: int) -> str:
    from approvals import notifications

    # A second run of the same message finds the row claimed or sent and does nothing; failures
    # are retried from the database by the sweeper (backoff in next_attempt_at), not by ETAs.
    return notifications.deliver(delivery_id)


@shared_task(name="approvals.tasks.rollup_metrics", acks_late=True, ignore_result=True)
def rollup_metrics() -> int:
    from approvals.metrics import store

    # Safe to overlap: rollups take turns on an advisory lock and only ever replace a row by one
    # computed at a later timeline head.
    return store.rollup()


@shared_task(
    name="approvals.tasks.run_bulk_action",
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
)
def run_bulk_action(bulk_id: int) -> int:
    # A worker killed midway hands the message on (acks_late + reject_on_worker_lost); items
    # are marked in the transaction of their action, so a second run only does what is left.
    from django.db import close_old_connections

    from approvals import bulk

    close_old_connections()
    return bulk.execute(bulk_id)


@shared_task(name="approvals.tasks.resume_bulk_actions", acks_late=True, ignore_result=True)
def resume_bulk_actions() -> list[int]:
    from approvals import bulk

    return bulk.resume_stale()

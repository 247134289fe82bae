from __future__ import annotations

import os
from pathlib import Path

from celery import Celery, signals

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "taskpilots.settings")

app = Celery("taskpilots")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@signals.worker_init.connect
@signals.beat_init.connect
def _make_filesystem_broker_folders(**kwargs) -> None:
    # The filesystem broker (local development) needs its folders before the first poll; settings
    # only name them (they create nothing at import), so a worker started by hand creates them.
    options = app.conf.broker_transport_options or {}
    for key in ("data_folder_in", "data_folder_out", "processed_folder", "control_folder"):
        if options.get(key):
            Path(options[key]).mkdir(parents=True, exist_ok=True)


@signals.worker_init.connect
def _refuse_a_worker_that_could_exhaust_postgresql(sender=None, **kwargs) -> None:
    # Before the pool starts: a configuration whose connections PostgreSQL cannot serve stops
    # here with what to change, instead of failing runs later (taskpilots/dbpool.py).
    from django.core.exceptions import ImproperlyConfigured

    from taskpilots import dbpool

    pool_cls = sender.pool_cls
    module = pool_cls if isinstance(pool_cls, str) else getattr(pool_cls, "__module__", "")
    pool = next(
        (name for name in ("prefork", "thread", "solo", "gevent", "eventlet") if name in module),
        module,
    )
    pool = "threads" if pool == "thread" else pool
    concurrency = sender.concurrency if isinstance(sender.concurrency, int) else 1
    try:
        dbpool.check_worker(pool, concurrency)
    except ImproperlyConfigured as exc:
        raise SystemExit(f"TaskPilots worker: {exc}") from None

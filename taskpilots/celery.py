from __future__ import annotations

import json
import os
import time
from pathlib import Path

from celery import Celery, signals


def _process_started() -> float | None:
    """When this process started (wall clock, to the kernel's 10 ms), from /proc: Linux only."""
    try:
        ticks = os.sysconf("SC_CLK_TCK")
        since_boot = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - since_boot / ticks
        return time.time() - age
    except (OSError, ValueError, IndexError, AttributeError):
        return None


# When this process reached each point of a worker's start (wall clock): printed with the ready
# line, so a supervisor or a benchmark sees where a start's time goes (docs/benchmarks.md,
# "Recovery latency"). process → app: the interpreter and Celery; → django: settings and the
# apps; → tasks: the task modules; → heartbeat: registered, and its previous incarnation's
# leases taken back; → ready: consuming.
STARTED: dict[str, float | None] = {"process": _process_started(), "app": time.time()}

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "taskpilots.settings")
# A worker skips Django's system checks as it starts. Celery's Django fixup runs them all, and
# the URL checks import every view, the console and the API's schemas: a third of a second of
# every start, and of a restarted worker's recovery. `manage.py migrate` and `check`, the web
# process and the tests run them; CELERY_SKIP_CHECKS= (empty) runs them in the worker again.
os.environ.setdefault("CELERY_SKIP_CHECKS", "1")

app = Celery("taskpilots")
app.config_from_object("django.conf:settings", namespace="CELERY")


@signals.import_modules.connect
def _django_set_up(**kwargs) -> None:
    # After Celery's Django fixup (django.setup()), before the task modules: connected before
    # autodiscover_tasks below, so called in between.
    STARTED.setdefault("django", time.time())


app.autodiscover_tasks()


@signals.import_modules.connect
def _tasks_imported(**kwargs) -> None:
    STARTED.setdefault("tasks", time.time())


@signals.worker_init.connect
@signals.beat_init.connect
def _make_filesystem_broker_folders(**kwargs) -> None:
    # The filesystem broker (local development) needs its folders before the first poll; settings
    # only name them (they create nothing at import), so a worker started by hand creates them.
    options = app.conf.broker_transport_options or {}
    for key in ("data_folder_in", "data_folder_out", "processed_folder", "control_folder"):
        if options.get(key):
            Path(options[key]).mkdir(parents=True, exist_ok=True)


_worker: dict[str, str] = {}  # this worker's node name and pool, for its pool processes


def _pool_name(pool_cls) -> str:
    module = pool_cls if isinstance(pool_cls, str) else getattr(pool_cls, "__module__", "")
    pool = next(
        (name for name in ("prefork", "thread", "solo", "gevent", "eventlet") if name in module),
        module,
    )
    return "threads" if pool == "thread" else pool


@signals.worker_init.connect
def _start_worker(sender=None, **kwargs) -> None:
    """Before the pool starts: refuse a configuration whose connections PostgreSQL cannot serve
    (taskpilots/dbpool.py), then start beating (runs/engine/liveness.py) — in this process, or
    for prefork in each pool process."""
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured
    from django.db import connections

    from taskpilots import dbpool

    pool = _pool_name(sender.pool_cls)
    concurrency = sender.concurrency if isinstance(sender.concurrency, int) else 1
    idle = settings.TASKPILOTS["DB_IDLE_IN_TRANSACTION_SECONDS"]
    for options in (
        settings.DATABASES["default"]["OPTIONS"],
        connections["default"].settings_dict["OPTIONS"],
    ):
        if "keepalives" not in options:
            dbpool.apply_worker_options(options, idle)
    try:
        dbpool.check_worker(pool, concurrency)
    except ImproperlyConfigured as exc:
        raise SystemExit(f"TaskPilots worker: {exc}") from None
    _worker.update(node=sender.hostname, pool=pool)
    if pool != "prefork":
        from runs.engine.liveness import Heartbeat

        Heartbeat.start(sender.hostname)
        STARTED["heartbeat"] = time.time()


@signals.worker_process_init.connect
def _start_pool_process(**kwargs) -> None:
    from billiard.process import current_process

    from runs.engine.liveness import Heartbeat

    index = getattr(current_process(), "index", None)
    Heartbeat.start(f"{_worker.get('node', 'worker')}#{index}")


@signals.worker_shutdown.connect
@signals.worker_process_shutdown.connect
def _stop_beating(**kwargs) -> None:
    from runs.engine.liveness import Heartbeat

    if Heartbeat.current is not None:
        Heartbeat.current.stop()


# Printed whatever the log level: what supervisors and the tests' worker processes wait for
# (taskpilots/evidence/workers.py) to know the worker consumes.
READY_LINE = "taskpilots worker ready:"


@signals.worker_ready.connect
def _say_ready(sender=None, **kwargs) -> None:
    import sys

    STARTED["ready"] = time.time()
    first = STARTED["process"] or STARTED["app"]
    took = f"in {STARTED['ready'] - first:.2f} s" if first else ""
    # The process's own stdout: Celery redirects sys.stdout into its logger, at its level.
    stream = sys.__stdout__
    if stream is not None:
        hostname = getattr(sender, "hostname", "")
        stream.write(f"{READY_LINE} {hostname} {took}; start {json.dumps(STARTED)}\n")
        stream.flush()


def start_times(line: str) -> dict[str, float]:
    """The start's wall-clock times a worker's ready line carries (see STARTED), or {}."""
    _, found, times = line.partition("; start ")
    if READY_LINE not in line or not found:
        return {}
    try:
        return {k: v for k, v in json.loads(times).items() if v is not None}
    except ValueError:
        return {}

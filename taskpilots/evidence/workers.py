"""Real Celery worker processes, started and killed on demand: used by the recovery tests, the
drills and the benchmarks.

Each worker is `celery -A taskpilots worker` in its own process group, on the configured broker,
against the database this process uses, consuming a queue private to its caller.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from django.conf import settings
from django.db import connection

from taskpilots import workerconf
from taskpilots.celery import READY_LINE
from taskpilots.env import format_database_url
from taskpilots.processes import Child

ROOT = Path(__file__).resolve().parents[2]


def database_url(name: str | None = None, *, owner: bool = False) -> str:
    """The URL of the database this process is connected to (the test database in tests), for
    the processes it starts, or of another database `name` on the same server (the scratch
    databases of bench and drill, which are the owner's: created, migrated and dropped by it).

    In the test suite this process logs in as the owner and acts as the application role
    (tests/dbroles.py: `APP_ROLE` and `-c role=…`); the workers, gunicorn and commands it starts
    on this database log in as that role itself, unless `owner` (a benchmark's scratch table)."""
    db = connection.settings_dict
    login = db.get("APP_ROLE") if name is None and not owner else None
    options = dict(db.get("OPTIONS") or {})
    acting = db.get("APP_ROLE", {}).get("USER")
    if acting and options.get("options"):
        options["options"] = options["options"].replace(f"-c role={acting}", "").strip()
        if not options["options"]:
            del options["options"]
    return format_database_url({**db, **(login or {}), "OPTIONS": options}, name)


class WorkerProcess:
    def __init__(
        self,
        name: str,
        queue: str,
        env: dict[str, str],
        concurrency: int = 1,
        pool: str | None = None,
        options: list[str] | None = None,
        listen: str | None = None,
    ):
        self.name, self.queue, self.env, self.concurrency = name, queue, env, concurrency
        # The queue it consumes at start (the benchmarks' barrier: another one, joined later).
        self.listen = listen or queue
        # The production pool (taskpilots.workerconf: threads). (The solo pool with gossip and
        # mingle off stalls on this Celery version after its first task: measured, see the
        # drill's history.)
        self.pool = pool or workerconf.POOL
        # The pool options as a whole (taskpilots.workerconf's), in place of pool + concurrency.
        self.options = options or ["--pool", self.pool, "--concurrency", str(self.concurrency)]
        self.child: Child | None = None
        self.process: subprocess.Popen | None = None
        self.output: list[str] = []
        self._ready = threading.Event()

    def start(self, timeout: float = 30, wait: bool = True) -> WorkerProcess:
        command = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "taskpilots",
            "worker",
            "-Q",
            self.listen,
            "-n",
            f"{self.name}@%h",
            *self.options,
            "-l",
            "INFO",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ]
        self.child = Child(self.name, command, cwd=ROOT, env=self.env, on_line=self._line)
        self.process = self.child.process
        if wait and not self._ready.wait(timeout):
            self.kill()
            raise RuntimeError(f"worker {self.name} did not start:\n" + "".join(self.output[-40:]))
        return self

    def _line(self, line: str) -> None:
        if len(self.output) < 5000:
            self.output.append(line)
        if READY_LINE in line:  # printed at any log level (taskpilots/celery.py)
            self._ready.set()

    @property
    def alive(self) -> bool:
        return self.child is not None and self.child.alive

    def kill(self) -> None:
        """SIGKILL the whole process group: no warm shutdown, no ack, mid-call if it is busy."""
        if self.alive:
            self.child.kill()

    def stop(self) -> None:
        """A warm shutdown of the whole group (SIGTERM), SIGKILL after 20 s."""
        if self.alive:
            self.child.stop(20, group=True)


class Workers:
    """Start workers on demand; `close()` kills every one of them."""

    def __init__(self, queue: str | None = None, extra_env: dict[str, str] | None = None):
        self.queue = queue or f"tp-{uuid.uuid4().hex[:10]}"
        self.extra_env = extra_env or {}
        self.started: list[WorkerProcess] = []

    def env(self, **overrides: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
        env.update(
            DATABASE_URL=database_url(),
            # The same broker, and for the filesystem broker the same folders under var/.
            CELERY_BROKER_URL=settings.CELERY_BROKER_URL,
            TASKPILOTS_VAR_DIR=str(settings.VAR_DIR),
            TASKPILOTS_TESTING="1",
            TASKPILOTS_QUEUE=self.queue,
            TASKPILOTS_DISPATCH="celery",
            TASKPILOTS_SANDBOX_URL=settings.TASKPILOTS["SANDBOX_URL"],
            TASKPILOTS_LEASE_SECONDS="30",
            TASKPILOTS_TOOL_TIMEOUT_SECONDS="10",
        )
        env.update(self.extra_env)
        env.update(overrides)
        return env

    def start(
        self,
        name: str | None = None,
        concurrency: int = 1,
        pool: str | None = None,
        wait: bool = True,
        options: list[str] | None = None,
        listen: str | None = None,
        **env: str,
    ) -> WorkerProcess:
        worker = WorkerProcess(
            name or f"w{len(self.started) + 1}-{uuid.uuid4().hex[:6]}",
            self.queue,
            self.env(**env),
            concurrency,
            pool,
            options,
            listen,
        )
        self.started.append(worker)
        return worker.start(wait=wait)

    def release(self, workers: list[WorkerProcess], timeout: float = 10) -> None:
        """Workers started on another queue (`listen`) start consuming this one, at once: a
        benchmark's hints all wait in the broker before the clock starts."""
        import socket

        from taskpilots.celery import app as celery_app

        host = socket.gethostname()
        names = [f"{w.name}@{host}" for w in workers]
        replies = celery_app.control.add_consumer(
            self.queue, destination=names, reply=True, timeout=timeout
        )
        if len(replies) < len(names):
            raise RuntimeError(f"only {len(replies)} of {len(names)} workers joined {self.queue}")

    def start_beat(self, **env: str) -> None:
        """Celery beat on this queue, as `make run` runs it: the sweeper every few seconds."""
        schedule = Path(tempfile.mkdtemp(prefix="tp-beat-")) / "celerybeat-schedule"
        command = [sys.executable, "-m", "celery", "-A", "taskpilots", "beat", "-l", "WARNING"]
        self.beat = subprocess.Popen(
            [*command, "--schedule", str(schedule)],
            cwd=ROOT,
            env=self.env(**env),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    @property
    def alive(self) -> list[WorkerProcess]:
        return [w for w in self.started if w.alive]

    def close(self) -> None:
        for worker in self.started:
            worker.kill()
        beat = getattr(self, "beat", None)
        if beat is not None and beat.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(beat.pid, signal.SIGKILL)
            beat.wait(10)

    def delete_queue(self) -> None:
        from taskpilots.celery import app as celery_app

        try:
            with celery_app.connection_for_write() as conn:
                conn.default_channel.queue_delete(self.queue)
        except Exception:  # a broker without queue deletion (filesystem) keeps an empty folder
            pass


def wait_for(
    predicate: Callable[[], object],
    *,
    timeout: float = 30,
    what: str = "condition",
    interval: float = 0.05,
):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def process_groups_cpu_s(process_groups: list[int]) -> float | None:
    """User + system CPU seconds of the live processes in these process groups (each worker is
    started in a group of its own), from /proc: Linux only, None elsewhere. A prefork child
    replaced meanwhile takes its seconds with it."""
    wanted = set(process_groups)
    return _proc_cpu_s(lambda pid, group: group in wanted)


def backend_cpu_s(database: str, *, own: bool = False) -> float | None:
    """CPU seconds PostgreSQL's server processes have spent for the connections to `database`
    that are open now (pg_stat_activity, then /proc): what the statements cost the server. The
    connection asking is left out unless `own` (a process measuring its own statements). None
    when the server is not on this machine or its processes cannot be read."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity"
            " WHERE datname = %s AND (%s OR pid <> pg_backend_pid())",
            [database, own],
        )
        pids = {pid for (pid,) in cursor.fetchall()}
    host = connection.settings_dict.get("HOST") or ""
    if host not in ("", "localhost", "127.0.0.1", "::1") and not host.startswith("/"):
        return None
    if not pids or not all(Path(f"/proc/{pid}/stat").exists() for pid in pids):
        return None
    return _proc_cpu_s(lambda pid, group: pid in pids)


def _proc_cpu_s(wanted) -> float | None:
    try:
        ticks = os.sysconf("SC_CLK_TCK")
        total = 0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                # Fields after the parenthesised command: state is [0], pgrp [2], utime [11].
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if wanted(int(stat.parent.name), int(fields[2])):
                total += int(fields[11]) + int(fields[12])
        return total / ticks
    except (OSError, ValueError):
        return None

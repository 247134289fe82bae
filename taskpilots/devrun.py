"""`make run`: TaskPilots on this machine, in the foreground, with nothing to install or configure.

Steps, in order:

1. Local defaults: TASKPILOTS_DEV=1 and DEBUG=1 (unless set), so there is a dev secret key and
   plain-HTTP cookies work.
2. Without DATABASE_URL, start (or reuse) the embedded PostgreSQL under var/ and hand its URL to
   every child (``devenv.prepare``); create the filesystem broker's folders.
3. ``manage.py migrate``, ``collectstatic --noinput``, ``demo_setup``.
4. Children, each in its own process group with its output prefixed by its name: ``sandbox`` (the
   simulated external systems, when the command exists), ``web`` (gunicorn, 2 workers, static files
   from WhiteNoise), ``worker`` (Celery: its processes, pool and concurrency from
   ``taskpilots.workerconf``, one child per process: ``worker1``, ``worker2`` …)
   and ``beat`` (Celery beat, schedule under var/). Then ``seed_demo`` (real demo runs, executed by
   that worker against that sandbox; once).
5. Wait. Ctrl-C or SIGTERM stops web and beat, then the worker (warm shutdown, up to 20 s, then
   SIGKILL), then the sandbox, then the embedded database — only if this launcher started it.
   A child that dies on its own stops everything, naming it, with exit status 1.

Children get their own process groups so Ctrl-C reaches only this launcher, which then stops them
in that order; a second Ctrl-C kills what is left at once. If this launcher is killed with SIGKILL
the children keep running (stop them by pid); the embedded database is reused by the next run.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from urllib.parse import urlsplit

import httpx2

from taskpilots import devenv
from taskpilots.env import var_dir
from taskpilots.processes import Child
from taskpilots.workerconf import worker_config

BASE_DIR = Path(__file__).resolve().parent.parent

# Seconds each stage may take after SIGTERM before SIGKILL. The worker's warm shutdown lets running
# tasks finish; anything cut off is recovered by the sweeper (docs/architecture.md, invariant 1).
_STOP_STAGES: list[tuple[tuple[str, ...], float]] = [
    (("web", "beat"), 10.0),
    (("worker",), 20.0),
    (("sandbox",), 5.0),
]
# Reentrant: the signal handler prints from the main thread, possibly while it holds the lock.
_print_lock = threading.RLock()


def say(message: str) -> None:
    _emit("make run", message)


def _emit(name: str, line: str) -> None:
    with _print_lock:
        sys.stdout.write(f"{name:<10}| {line}\n")
        sys.stdout.flush()


class Launcher:
    def __init__(self) -> None:
        self.children: list[Child] = []
        self.stop_requests = 0
        self.started_database = False
        self.embedded_database = False
        self.var_dir = var_dir()

    # --- signals

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGTERM, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.stop_requests += 1
        if self.stop_requests == 1:
            say(f"{signal.Signals(signum).name} received: stopping (again to force)")
        else:
            say("stopping now: killing what is left")
            for child in self.children:
                if child.process.poll() is None:
                    child.signal(signal.SIGKILL)

    # --- children

    def spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> Child:
        child = Child(
            name,
            args,
            cwd=BASE_DIR,
            env={**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"},
            on_line=lambda line: _emit(name, line.rstrip("\n")),
        )
        self.children.append(child)
        return child

    def run_step(self, name: str, args: list[str]) -> bool:
        """Run a setup command to completion; False when it failed or we were asked to stop."""
        child = self.spawn(name, args)
        while child.process.poll() is None:
            if self.stop_requests:
                child.signal(signal.SIGTERM)
                if not child.wait(10.0):
                    child.signal(signal.SIGKILL)
                    child.wait(5.0)
                break
            time.sleep(0.1)
        child.reader.join(timeout=2)
        self.children.remove(child)
        if self.stop_requests:
            return False
        if child.process.returncode != 0:
            say(f"`{' '.join(args[1:])}` failed with exit status {child.process.returncode}")
            return False
        return True

    def stop_children(self) -> None:
        for names, timeout in _STOP_STAGES:
            stage = [
                c
                for c in self.children
                if c.name.rstrip("0123456789") in names and c.process.poll() is None
            ]
            for child in stage:
                child.signal(signal.SIGTERM)
            deadline = time.monotonic() + timeout
            for child in stage:
                if not child.wait(max(0.0, deadline - time.monotonic())):
                    say(f"{child.name} did not stop within {timeout:.0f} s: killing it")
                    child.signal(signal.SIGKILL)
                    child.wait(5.0)
        for child in self.children:
            # A child that died on its own may have left its own children (gunicorn workers, the
            # Celery pool) behind in its process group.
            child.signal(signal.SIGKILL)
            child.reader.join(timeout=2)

    # --- the whole run

    def run(self) -> int:
        os.environ.setdefault("TASKPILOTS_DEV", "1")
        os.environ.setdefault("DEBUG", "1")
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "taskpilots.settings")
        port = _port_from_environment()
        if port is None:
            return 2
        self.install_signal_handlers()
        from django.core.exceptions import ImproperlyConfigured

        try:
            return self._run(port)
        except ImproperlyConfigured as exc:
            # Configuration and embedded-database errors already say what to do next.
            say(f"error: {exc}")
            return 1
        finally:
            self.stop_children()
            self._stop_database()

    def _run(self, port: int) -> int:
        from taskpilots import embedded

        self.embedded_database = not os.environ.get("DATABASE_URL")
        if self.embedded_database:
            say(f"embedded PostgreSQL in {embedded.pgdata_dir(self.var_dir)}")
        # Starts (or reuses) the embedded database and sets DATABASE_URL for every child.
        self.started_database = devenv.prepare()
        if self.embedded_database:
            info = embedded.status(self.var_dir)
            state = "started" if self.started_database else "already running, reusing it"
            say(f"embedded PostgreSQL {state} (pid {info.pid if info else '?'})")
            say(f"its log: {embedded.log_file(self.var_dir)}")

        import django
        from django.conf import settings
        from django.core.management import get_commands

        django.setup()
        commands = get_commands()

        manage = [sys.executable, str(BASE_DIR / "manage.py")]
        steps = [
            ("migrate", [*manage, "migrate", "--noinput"]),
            ("static", [*manage, "collectstatic", "--noinput", "-v", "0"]),
            ("demo", [*manage, "demo_setup"]),
        ]
        for name, args in steps:
            if not self.run_step(name, args):
                return 0 if self.stop_requests else 1

        if "sandbox" in commands:
            sandbox_port = urlsplit(settings.TASKPILOTS["SANDBOX_URL"]).port or 8765
            self.spawn("sandbox", [*manage, "sandbox", "--port", str(sandbox_port)])
        else:
            say("no `sandbox` command yet: simulated external systems not started")
        celery = [sys.executable, "-m", "celery", "-A", "taskpilots"]
        self.spawn(
            "web",
            [
                *[sys.executable, "-m", "gunicorn", "taskpilots.wsgi"],
                # Errors gunicorn answers itself in the API's JSON shape.
                *["--config", "python:taskpilots.gunicorn_conf"],
                *["--bind", f"127.0.0.1:{port}", "--workers", "2"],
                *["--graceful-timeout", "5", "--access-logfile", "-"],
                # Its default control socket is one per user (~/.gunicorn/); a second instance
                # (tests, a second checkout) would fight over it, and make run does not need it.
                "--no-control-socket",
            ],
        )
        worker = worker_config()
        for n in range(1, worker.processes + 1):
            self.spawn(
                f"worker{n}" if worker.processes > 1 else "worker",
                [*celery, "worker", "-l", "info", *worker.options(), "-n", f"worker{n}@%h"],
                env=worker.env,
            )
        self.spawn(
            "beat",
            [
                *celery,
                "beat",
                "-l",
                "info",
                "--schedule",
                str(self.var_dir / "celerybeat-schedule"),
            ],
        )
        if "seed_demo" in commands:
            # Demo runs are real runs: they need the sandbox and the worker up.
            _wait_for_url(settings.TASKPILOTS["SANDBOX_URL"] + "/_admin/health", timeout=20)
            if not self.run_step("seed", [*manage, "seed_demo"]):
                say("seeding the demo data failed; the console still works without it")
        return self._supervise(port)

    def _supervise(self, port: int) -> int:
        announced = False
        next_database_check = 0.0
        while not self.stop_requests:
            for child in self.children:
                code = child.process.poll()
                if code is not None:
                    say(f"{child.name} exited unexpectedly ({_describe(code)}): stopping the rest")
                    return 1
            if not announced and _listening(port):
                _announce(port)
                announced = True
            if self.embedded_database and time.monotonic() >= next_database_check:
                next_database_check = time.monotonic() + 2.0
                if not self._database_alive():
                    return 1
            time.sleep(0.2)
        return 0

    # --- the embedded database

    def _database_alive(self) -> bool:
        from taskpilots import embedded

        try:
            alive = embedded.status(self.var_dir) is not None
        except embedded.EmbeddedPostgresError as exc:
            say(str(exc))
            return False
        if not alive:
            say(
                "the embedded PostgreSQL stopped unexpectedly: stopping the rest; see "
                f"{embedded.log_file(self.var_dir)}"
            )
        return alive

    def _stop_database(self) -> None:
        if not self.started_database:
            return
        from taskpilots import embedded

        try:
            embedded.stop(self.var_dir)
            say("embedded PostgreSQL stopped")
        except embedded.EmbeddedPostgresError as exc:
            say(str(exc))


def _wait_for_url(url: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx2.get(url, timeout=1, trust_env=False).status_code == 200:
                return True
        except httpx2.TransportError:
            pass
        time.sleep(0.2)
    return False


def _describe(returncode: int) -> str:
    if returncode < 0:
        return f"killed by {signal.Signals(-returncode).name}"
    return f"exit status {returncode}"


def _port_from_environment() -> int | None:
    raw = os.environ.get("PORT", "8000")
    try:
        port = int(raw)
    except ValueError:
        port = 0
    if not 0 < port < 65536:
        say(f"PORT={raw!r} is not a TCP port number")
        return None
    return port


def _listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(0.2)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _announce(port: int) -> None:
    if os.environ.get("TASKPILOTS_DEMO_PASSWORD") or os.environ.get(
        "TASKPILOTS_DEMO_PASSWORD_FILE"
    ):
        password = "the password in TASKPILOTS_DEMO_PASSWORD"
    else:
        password = "password taskpilots-demo"
    say("")
    say(f"TaskPilots is running: http://127.0.0.1:{port}/")
    say(f"Log in as support, auditor or admin with {password}.")
    say("Ctrl-C stops everything.")
    say("")


def main() -> int:
    return Launcher().run()


if __name__ == "__main__":
    sys.exit(main())

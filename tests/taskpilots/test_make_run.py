"""`make run` (python -m taskpilots.devrun) end to end: it serves, and Ctrl-C stops all of it.

It runs with its own var dir, a free port and no DATABASE_URL/CELERY_BROKER_URL, so it uses the
embedded PostgreSQL and the filesystem broker whatever the surrounding test run is configured with.
"""

from __future__ import annotations

import contextlib
import http.cookiejar
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from django.core.management import CommandError, call_command

from taskpilots import embedded

BASE_DIR = Path(__file__).resolve().parents[2]
# Variables of the surrounding test run that must not leak into the launched app.
_NOT_INHERITED = {
    "DATABASE_URL",
    "CELERY_BROKER_URL",
    "TASKPILOTS_TESTING",
    "DEBUG",
    "TASKPILOTS_DEV",
    "PORT",
    "DJANGO_SETTINGS_MODULE",
}


DEMO_PASSWORD = "make-run-test-password"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def processes_of(var: Path) -> list[psutil.Process]:
    """Processes started for this var dir: the launcher passes TASKPILOTS_VAR_DIR to all of them."""
    found = []
    for process in psutil.process_iter():
        if process.pid == os.getpid():
            continue
        try:
            if process.environ().get("TASKPILOTS_VAR_DIR") == str(var):
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


class Launch:
    def __init__(self, tmp_path: Path) -> None:
        # Not under tmp_path, which pytest keeps closed to other users (see test_embedded.py).
        self.root = Path(tempfile.mkdtemp(prefix="taskpilots-test-"))
        self.var = self.root / "var"
        self.port = free_port()
        self.log_path = tmp_path / "devrun.log"
        env = {key: value for key, value in os.environ.items() if key not in _NOT_INHERITED}
        env.update(
            TASKPILOTS_VAR_DIR=str(self.var),
            PORT=str(self.port),
            # The sandbox's default port may be taken by a developer's own make run.
            TASKPILOTS_SANDBOX_URL=f"http://127.0.0.1:{free_port()}",
            # The demo users' password the test logs in with, whatever the shell exported for
            # its own make run (the README invites setting it).
            TASKPILOTS_DEMO_PASSWORD=DEMO_PASSWORD,
        )
        with self.log_path.open("w") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "taskpilots.devrun"],
                cwd=BASE_DIR,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]

    def get(self, path: str) -> tuple[int, bytes]:
        url = f"http://127.0.0.1:{self.port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()

    def log_in(self, username: str, password: str) -> str:
        """Log in through the real form (CSRF cookie and all); return where it redirects."""
        cookies = http.cookiejar.CookieJar()
        opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(cookies), _NoRedirect()
        )
        login_url = f"http://127.0.0.1:{self.port}/accounts/login/"
        opener.open(login_url, timeout=5).read()
        csrf_token = next(cookie.value for cookie in cookies if cookie.name == "csrftoken")
        form = urllib.parse.urlencode(
            {"username": username, "password": password, "csrfmiddlewaretoken": csrf_token}
        ).encode()
        request = urllib.request.Request(login_url, data=form, headers={"Referer": login_url})
        try:
            opener.open(request, timeout=5)
        except urllib.error.HTTPError as error:
            if error.code == 302:
                return error.headers["Location"]
            raise
        return "(no redirect: the login failed)"

    def clean_up(self) -> None:
        """Whatever happened, leave no launcher, child or database running."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=40)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        try:
            embedded.stop(self.var)
        finally:
            for process in processes_of(self.var):
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.kill()
            shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Launch]:
    launched = Launch(tmp_path)
    yield launched
    launched.clean_up()


def wait_until_healthy(launch: Launch, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    while time.monotonic() < deadline:
        if launch.process.poll() is not None:
            pytest.fail(f"devrun exited with {launch.process.returncode}:\n{launch.output()}")
        try:
            status, body = launch.get("/healthz")
            last = f"{status} {body[:300]!r}"
            if status == 200:
                return json.loads(body)
        except OSError as error:
            last = repr(error)
        time.sleep(0.5)
    pytest.fail(f"/healthz not 200 within {timeout:.0f} s (last: {last}):\n{launch.output()}")


@pytest.mark.timeout(150)
def test_make_run_serves_the_app_and_ctrl_c_stops_everything_with_status_0(
    launch: Launch,
) -> None:
    health = wait_until_healthy(launch, timeout=60)
    assert health["database"] == "ok", health
    assert health["broker"] == "ok", health
    status, _ = launch.get("/accounts/login/")
    assert status == 200, launch.output()
    assert launch.log_in("support", DEMO_PASSWORD) == "/console/", launch.output()
    postmaster = embedded.status(launch.var)
    assert postmaster is not None, "devrun did not use the embedded PostgreSQL in its var dir"

    launch.process.send_signal(signal.SIGINT)
    try:
        returncode = launch.process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"devrun did not exit within 30 s of SIGINT:\n{launch.output()}")

    assert returncode == 0, launch.output()
    # It started the database, so it must have stopped it — and every child with it.
    assert embedded.status(launch.var) is None, launch.output()
    assert not psutil.pid_exists(postmaster.pid) or (
        psutil.Process(postmaster.pid).status() == psutil.STATUS_ZOMBIE
    )
    leftovers = [(p.pid, p.name()) for p in processes_of(launch.var)]
    assert leftovers == [], f"still running after devrun exited: {leftovers}\n{launch.output()}"


def test_demo_setup_refuses_to_run_outside_local_development(
    monkeypatch: pytest.MonkeyPatch, settings: object
) -> None:
    # It creates users with a known password: never in production.
    settings.DEBUG = False
    monkeypatch.delenv("TASKPILOTS_DEV", raising=False)

    with pytest.raises(CommandError, match="TASKPILOTS_DEV=1"):
        call_command("demo_setup")

"""Drive the sandbox from tests, drills and tool adapters: an HTTP client and a process handle.

No Django (httpx2 and the standard library), so it works in any process.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from urllib.parse import urlencode

import httpx2

from taskpilots.httpclient import SharedClient

PROJECT_ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_SECONDS = 10.0

_http_client = SharedClient(trust_env=False)


class SandboxError(Exception):
    """An admin call to the sandbox answered with an error status."""

    def __init__(self, status: int, payload: dict[str, Any]) -> None:
        super().__init__(f"sandbox answered {status}: {payload}")
        self.status = status
        self.payload = payload


@dataclass
class SandboxResponse:
    status: int
    headers: dict[str, str]
    json: dict[str, Any] = field(default_factory=dict)

    @property
    def replayed(self) -> bool:
        return self.headers.get("idempotent-replayed") == "true"


class SandboxClient:
    def __init__(self, base_url: str, timeout: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout

    def request(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> SandboxResponse:
        """Send one request; every HTTP status comes back as a SandboxResponse.

        Transport failures are raised as OSError (ConnectionRefusedError when nothing was sent,
        TimeoutError, ConnectionResetError when the server hung up after the request went out,
        ...), because callers classify them: refused means "not sent", a timeout or reset after
        sending means "outcome unknown".
        """
        all_headers = {}
        data = None if body is None else json.dumps(body).encode()
        if data is not None:
            all_headers["Content-Type"] = "application/json"
        all_headers.update(headers or {})
        try:
            response = _http_client().request(
                method,
                self.base_url + path,
                content=data,
                headers=all_headers,
                timeout=timeout or self.timeout,
            )
        except httpx2.TransportError as error:
            raise _as_os_error(error) from error
        return _to_response(response.status_code, response.headers, response.content)

    def write(
        self,
        system: str,
        action: str,
        body: dict[str, Any],
        *,
        key: str | None,
        run: str | None = None,
        step: str | None = None,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> SandboxResponse:
        all_headers = dict(headers or {})
        if key is not None:
            all_headers["Idempotency-Key"] = key
        if run is not None:
            all_headers["X-TaskPilots-Run"] = run
        if step is not None:
            all_headers["X-TaskPilots-Step"] = step
        return self.request("POST", f"/{system}/{action}", body, all_headers, timeout)

    def read(
        self,
        system: str,
        action: str,
        params: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> SandboxResponse:
        query = f"?{urlencode(params)}" if params else ""
        return self.request("GET", f"/{system}/{action}{query}", None, headers, timeout)

    def lookup(self, system: str, key: str, timeout: float | None = None) -> SandboxResponse:
        return self.read(system, "by-key", {"key": key}, timeout=timeout)

    # admin

    def _admin(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict:
        response = self.request(method, "/_admin/" + path, body)
        if response.status >= 400:
            raise SandboxError(response.status, response.json)
        return response.json

    def health(self) -> bool:
        return self._admin("GET", "health").get("status") == "ok"

    def reset(self, config: bool = False) -> None:
        self._admin("POST", "reset", {"config": config})

    def ledger(
        self, system: str | None = None, run: str | None = None, key: str | None = None
    ) -> list[dict[str, Any]]:
        filters = {"system": system, "run": run, "key": key}
        query = urlencode({name: value for name, value in filters.items() if value is not None})
        return self._admin("GET", f"ledger?{query}")["entries"]

    def alter(
        self, system: str, key: str, *, response: dict[str, Any] | None = None, delete=False
    ) -> int:
        """Change (`response`) or remove (`delete`) what the system holds under `key`."""
        body = {"system": system, "key": key, "response": response, "delete": delete}
        return self._admin("POST", "alter", body)["altered"]

    def config(self) -> dict[str, dict[str, bool]]:
        return self._admin("GET", "config")["config"]

    def configure(
        self, system: str, dedupes: bool | None = None, lookup: bool | None = None
    ) -> dict[str, Any]:
        return self._admin(
            "POST", "config", {"system": system, "dedupes": dedupes, "lookup": lookup}
        )

    def inject(
        self, system: str, mode: str, action: str | None = None, count: int = 1, **kw: Any
    ) -> dict[str, Any]:
        """Inject a fault; kw takes latency_ms and seconds."""
        body = {"system": system, "mode": mode, "action": action, "count": count, **kw}
        return self._admin("POST", "faults", body)["fault"]

    def faults(self) -> list[dict[str, Any]]:
        return self._admin("GET", "faults")["faults"]

    def clear_faults(self) -> None:
        self._admin("DELETE", "faults")


def _as_os_error(error: httpx2.TransportError) -> OSError:
    """The OSError under httpx2's error (refused, reset...), or the one it stands for."""
    if isinstance(error, httpx2.TimeoutException):
        return TimeoutError(str(error))
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, OSError):
            return type(cause)(*cause.args)
        cause = cause.__cause__ or cause.__context__
    # The server closed the connection without answering (what http.client calls
    # RemoteDisconnected, a ConnectionResetError).
    return ConnectionResetError(str(error))


def _to_response(status: int, headers: Any, raw: bytes) -> SandboxResponse:
    try:
        payload = json.loads(raw) if raw else {}
    except json.JSONDecodeError:
        payload = {"raw": raw.decode(errors="replace")}
    return SandboxResponse(
        status, {name.lower(): value for name, value in headers.items()}, payload
    )


class SandboxProcess:
    """A sandbox server running as a child process; stop, kill and restart it like a dependency."""

    def __init__(self, port: int = 0, db_path: str | os.PathLike[str] | None = None) -> None:
        self._tmp_dir: str | None = None
        if db_path is None:
            self._tmp_dir = tempfile.mkdtemp(prefix="taskpilots-sandbox-")
            db_path = os.path.join(self._tmp_dir, "sandbox.sqlite3")
        self.db_path = str(db_path)
        self.port = port
        self.process: subprocess.Popen[bytes] | None = None
        self._stderr: Any = None
        self.url = ""

    @property
    def client(self) -> SandboxClient:
        return SandboxClient(self.url)

    def start(self) -> Self:
        # stderr goes to a file, not a pipe: nobody drains a pipe while the server runs, and a
        # full pipe would block it. The file lives as long as the process, hence no `with`.
        if self._stderr is not None:
            self._stderr.close()
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH", "")) if p
        )
        env["PYTHONUNBUFFERED"] = "1"
        command = [sys.executable, "-m", "taskpilots.sandbox.server"]
        command += ["--port", str(self.port), "--db", self.db_path]
        self.process = subprocess.Popen(
            command,
            cwd=PROJECT_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
        )
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        self.url = self._read_ready_line(deadline)
        self.port = int(self.url.rsplit(":", 1)[1])
        self._wait_healthy(deadline)
        return self

    def _read_ready_line(self, deadline: float) -> str:
        assert self.process is not None and self.process.stdout is not None
        buffer = b""
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            while b"\n" not in buffer:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self._fail("did not announce its address")
                if selector.select(timeout=min(remaining, 0.1)):
                    chunk = os.read(self.process.stdout.fileno(), 4096)
                    if not chunk:
                        self._fail("exited before it was ready")
                    buffer += chunk
        line = buffer.split(b"\n", 1)[0].decode()
        return line.rsplit(" ", 1)[1]

    def _wait_healthy(self, deadline: float) -> None:
        client = SandboxClient(self.url, timeout=1.0)
        while time.monotonic() < deadline:
            try:
                if client.health():
                    return
            except (OSError, SandboxError):
                pass
            if self.process is not None and self.process.poll() is not None:
                self._fail("exited before it was healthy")
            time.sleep(0.05)
        self._fail(f"was not healthy within {START_TIMEOUT_SECONDS:.0f} s")

    def _fail(self, reason: str) -> None:
        self.kill()
        stderr = ""
        if self._stderr is not None:
            self._stderr.seek(0)
            stderr = self._stderr.read().decode(errors="replace")
        raise RuntimeError(f"sandbox {reason}; stderr:\n{stderr}")

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM, then SIGKILL if it has not exited within `timeout`."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._forget_process()

    def kill(self) -> None:
        """SIGKILL: the crash case, with no chance to finish anything."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._forget_process()

    def _forget_process(self) -> None:
        if self.process is not None and self.process.stdout is not None:
            self.process.stdout.close()
        self.process = None

    def restart(self) -> Self:
        """Stop (if running) and start again on the same port with the same database."""
        self.stop()
        return self.start()

    def close(self) -> None:
        self.stop()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
        if self._tmp_dir is not None:
            shutil.rmtree(self._tmp_dir, ignore_errors=True)
            self._tmp_dir = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def start_sandbox(port: int = 0, db_path: str | os.PathLike[str] | None = None) -> SandboxProcess:
    """Spawn `python -m taskpilots.sandbox.server` and wait until it answers /_admin/health."""
    sandbox = SandboxProcess(port=port, db_path=db_path)
    try:
        return sandbox.start()
    except BaseException:
        sandbox.close()
        raise

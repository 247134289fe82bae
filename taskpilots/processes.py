"""A child process in its own process group, its output read line by line: the one process
supervisor under `make run` (taskpilots/devrun.py: web, workers, beat, sandbox) and the evidence
tooling's real workers (taskpilots/evidence/workers.py: tests, drills, benchmarks).

Its own session (process group), so a Ctrl-C at the terminal reaches only the supervisor, and a
signal to the group reaches the child's own children too (gunicorn's workers, a Celery pool).

A module of our own rather than honcho: `make run` stops its children in stages (web and beat,
then the worker's warm shutdown, then the sandbox, then the database it started), and the
drills and crash tests SIGKILL, SIGSTOP and SIGCONT one worker's whole group mid-call while
reading its output for the moment to do it; both need the child, not a Procfile runner.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path


class Child:
    """A started child; `on_line(line)` gets each line of its output (stdout and stderr)."""

    def __init__(
        self,
        name: str,
        args: list[str],
        *,
        cwd: Path,
        env: dict[str, str],
        on_line: Callable[[str], None],
    ) -> None:
        self.name = name
        self.process = subprocess.Popen(
            args,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            bufsize=1,
            start_new_session=True,
            env=env,
        )
        self._on_line = on_line
        self.reader = threading.Thread(target=self._pump, name=f"output-{name}", daemon=True)
        self.reader.start()

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._on_line(line)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def signal(self, signum: int, *, group: bool = False) -> None:
        """SIGKILL goes to the whole group (no one may survive it); any other signal to the
        child, which stops its own children as it does (or, `group`, to all of them)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if group or signum == signal.SIGKILL:
                os.killpg(self.process.pid, signum)
            else:
                self.process.send_signal(signum)

    def wait(self, timeout: float) -> bool:
        """Whether the child exited within `timeout` seconds."""
        try:
            self.process.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            return False

    def kill(self) -> None:
        """SIGKILL the whole group and reap the child: no warm shutdown."""
        self.signal(signal.SIGKILL)
        self.wait(10)

    def stop(self, timeout: float, *, group: bool = False) -> bool:
        """SIGTERM (a warm shutdown; to the whole group with `group`), then SIGKILL to the
        group after `timeout` seconds; whether it stopped by itself."""
        if not self.alive:
            return True
        self.signal(signal.SIGTERM, group=group)
        if self.wait(timeout):
            return True
        self.kill()
        return False

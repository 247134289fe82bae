"""Benchmark artifacts: raw samples and the environment they were measured in, as JSON Lines.

`manage.py bench <which> --record FILE` appends to FILE:

    {"kind": "environment", "benchmark": ..., "at": ..., "commit": ..., "postgres": {...}, ...}
    {"kind": "sample", "benchmark": ..., ...}          one per raw measurement
    {"kind": "result", "benchmark": ..., ...}          the JSON line the command printed

The figures quoted in docs/benchmarks.md come from the files committed under docs/results/,
regenerated with `manage.py bench_report` (taskpilots/evidence/report.py), so every number in the
docs can be traced to the samples and the machine that produced it.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# The server settings that move a benchmark's figures.
POSTGRES_SETTINGS = (
    "server_version",
    "shared_buffers",
    "synchronous_commit",
    "fsync",
    "wal_sync_method",
    "wal_level",
    "commit_delay",
    "max_connections",
    "max_wal_size",
    "checkpoint_timeout",
)


def environment() -> dict:
    """Where and on what a benchmark ran: the commit, the CPU and its load, PostgreSQL's
    settings, the broker. Each field is None when it cannot be read (not an error)."""
    return {
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": _git("rev-parse", "HEAD"),
        # Changes to tracked files other than the result files themselves (which the recording
        # of one benchmark changes for the next).
        "dirty": bool(
            _git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!docs/results")
        ),
        "python": platform.python_version(),
        "cpu_model": _cpu_model(),
        "cpus": os.cpu_count(),
        "load_avg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "memory_gib": _memory_gib(),
        "postgres": _postgres_settings(),
        "broker": _broker(),
    }


def write(
    path: str | os.PathLike,
    benchmark: str,
    result: dict,
    samples: list[dict],
    env: dict | None = None,
) -> None:
    """Append one benchmark's environment (`env`, taken as it started; now if not given), raw
    samples and result to `path` (JSON Lines). The load average as it ended is added."""
    env = dict(env or environment())
    env["load_avg_at_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    lines = [{"kind": "environment", "benchmark": benchmark, **env}]
    lines += [{"kind": "sample", "benchmark": benchmark, **sample} for sample in samples]
    lines.append({"kind": "result", "benchmark": benchmark, **result})
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as out:
        for line in lines:
            out.write(json.dumps(line, sort_keys=True, default=str) + "\n")


def read(path: str | os.PathLike) -> list[dict]:
    with Path(path).open(encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _memory_gib() -> float | None:
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
    return round(pages * size / 2**30, 1)


def _postgres_settings() -> dict | None:
    from django.db import connection

    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT name, setting, unit FROM pg_settings WHERE name = ANY(%s)",
                [list(POSTGRES_SETTINGS)],
            )
            return {name: f"{value}{unit or ''}" for name, value, unit in cursor.fetchall()}
    except Exception:  # a figure that cannot be read is reported missing, never fatal
        return None


def _broker() -> str | None:
    try:
        from taskpilots.evidence.bench import broker_name

        return broker_name()
    except Exception:
        return None

"""How a Celery worker runs: its pool, its concurrency, and the environment that goes with them.

One place, read by `make run` (taskpilots/devrun.py) and by `manage.py bench io`, so the benchmark
measures workers configured exactly as `make run` starts them. Change the values here, not in
either caller.

The production pool (docs/deploy.md): threads. A worker waits most of the time — a model turn
takes seconds, a tool call hundreds of milliseconds — and no transaction and no database
connection is held while it waits, so one process runs many calls at once on a few pooled
connections (TASKPILOTS_DB_POOL_SIZE); the worker refuses to start when its connections could
exhaust PostgreSQL (taskpilots/dbpool.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

POOL = "threads"
# Calls in flight per worker process.
CONCURRENCY = 200
# Worker processes per host: Python runs one thread at a time per process, so the work between
# calls (claims, snapshots, receipts) needs a process per core.
PROCESSES = max(1, min(os.cpu_count() or 1, 4))


@dataclass(frozen=True)
class WorkerConfig:
    pool: str
    concurrency: int
    processes: int = 1
    # Environment the worker needs for this pool (merged over the caller's own).
    env: dict[str, str] = field(default_factory=dict)

    def options(self) -> list[str]:
        """The `celery worker` options that choose the pool."""
        return ["--pool", self.pool, "--concurrency", str(self.concurrency)]


def worker_config(
    pool: str | None = None, concurrency: int | None = None, processes: int | None = None
) -> WorkerConfig:
    """`make run`'s worker configuration; `pool`, `concurrency` and `processes` try another one
    the same way (e.g. `manage.py bench io --pool threads --concurrency 50`)."""
    if (concurrency is not None and concurrency < 1) or (processes is not None and processes < 1):
        raise ValueError("concurrency and processes must be at least 1")
    return WorkerConfig(
        pool=pool or POOL,
        concurrency=concurrency or CONCURRENCY,
        processes=processes or PROCESSES,
    )

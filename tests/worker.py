"""Real Celery workers for tests (see runs/processes.py)."""

from runs.processes import WorkerProcess, Workers, wait_for

__all__ = ["WorkerProcess", "Workers", "wait_for"]

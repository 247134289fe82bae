"""Real Celery workers for tests (see taskpilots/evidence/workers.py)."""

from taskpilots.evidence.workers import WorkerProcess, Workers, wait_for

__all__ = ["WorkerProcess", "Workers", "wait_for"]

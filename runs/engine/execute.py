"""Advancing a run: claim, execute, record — one step after another within a time budget."""

from __future__ import annotations

import time

from django.db import transaction

from runs.engine.claim import Claim, claim_next
from runs.engine.dispatch import conf, enqueue
from runs.engine.record import record_outcome
from runs.engine.steps import execute
from runs.models import Run


def invoke_step(claim: Claim) -> bool:
    """The one path every step kind takes: execute the claimed step (outside any transaction),
    then record what it produced (one transaction). Replays stop here too: a side effect whose
    key is already committed returns its receipt instead of calling again (runs.engine.ledger),
    and a finished step is never claimed. Returns True when the run may go on inline."""
    return record_outcome(claim, execute(claim))


def advance(run_id, *, worker: str | None = None, budget: float | None = None) -> int:
    """Execute the run's steps until it parks, finishes, or the time budget is spent.

    Returns the number of steps executed. Consecutive steps that need no wait run in this one
    invocation, so a run costs database commits rather than broker round trips; past the budget
    the run is handed back to the broker.
    """
    budget = conf("INLINE_BUDGET_SECONDS") if budget is None else budget
    deadline = time.monotonic() + budget
    executed = 0
    while True:
        claim = claim_next(run_id, worker=worker)
        if claim is None:
            return executed
        go_on = invoke_step(claim)
        executed += 1
        if not go_on:
            return executed
        if time.monotonic() >= deadline:
            with transaction.atomic():
                enqueue(run_id)
            return executed


def run_until_quiet(run_id, *, max_steps: int = 1000) -> Run:
    """Advance a run in this process until it has nothing runnable (tests, drills, the shell)."""
    total = 0
    while total < max_steps:
        executed = advance(run_id, budget=3600)
        total += executed
        if executed == 0:
            break
    return Run.objects.get(pk=run_id)

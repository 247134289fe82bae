"""Advancing a run: claim, execute, record — one step after another within a time budget."""

from __future__ import annotations

import logging
import time

from django.db import transaction

from runs.engine import inline
from runs.engine.claim import Claim, claim_next
from runs.engine.dispatch import conf, enqueue, hint_many, worker_id
from runs.engine.liveness import ClaimLost
from runs.engine.record import record_outcome
from runs.engine.steps import execute
from runs.models import Run, TimelineEvent
from runs.tools import on_first_wait
from runs.verbs import Verb

logger = logging.getLogger("taskpilots.engine")


# What invoke_step leaves to its caller besides a next Claim: the run stops here for now (it
# waits, parked, or its step was handed back), or it goes on with the next claim to be made.
STOP = "stop"
CLAIM_NEXT = "claim next"


def invoke_step(claim: Claim, *, deadline: float | None = None):
    """The one path every step kind takes, in production (`advance`) as in tests: execute the
    claimed step (outside any transaction), then record what it produced — with the next
    step's claim while the `deadline` (time.monotonic) is not past — in one statement when the
    common case allows (runs.engine.inline), else through the model verbs in one transaction
    (record_outcome).
    Replays stop here too: a side effect whose key is already committed returns its receipt
    instead of calling again (runs.engine.ledger), and a finished step is never claimed.

    Returns the next Claim; inline.DONE (the run succeeded); inline.RECORDED (recorded, the
    run goes on later); CLAIM_NEXT (recorded, the run may go on now); or STOP. Raises ClaimLost
    when the claim was taken back while the step executed (nothing was recorded)."""
    outcome = execute(claim)
    go_on = deadline is not None and time.monotonic() < deadline
    following = inline.record_and_continue(claim, outcome, go_on=go_on)
    if following is not None:
        return following
    if not record_outcome(claim, outcome):
        return STOP
    return CLAIM_NEXT if go_on else inline.RECORDED


def advance(run_id, *, worker: str | None = None, budget: float | None = None) -> int:
    """Execute the run's steps until it parks, finishes, or the time budget is spent.

    Returns the number of steps executed. Consecutive steps that need no wait run in this one
    invocation, so a run costs database commits rather than broker round trips. The common case
    of each protocol step takes one round trip (runs.engine.inline: a fresh run's first claim, a
    success recorded with the next step's claim); anything else goes through the model verbs
    (claim_next, record_outcome); every step goes through invoke_step. Past the budget the run
    is handed back to the broker.
    """
    worker = worker or worker_id()
    budget = conf("INLINE_BUDGET_SECONDS") if budget is None else budget
    deadline = time.monotonic() + budget
    executed = 0
    claim = inline.claim_fresh(run_id, worker)
    if claim is inline.ORDINARY:
        claim = claim_next(run_id, worker=worker)
    while claim is not None:
        try:
            following = invoke_step(claim, deadline=deadline)
        except ClaimLost as exc:
            stand_down(claim, str(exc))
            return executed
        executed += 1
        if following is CLAIM_NEXT:
            claim = claim_next(run_id, worker=worker)
            continue
        if following is STOP or following is inline.DONE:
            return executed
        if following is inline.RECORDED:
            with transaction.atomic():
                enqueue(run_id)
            return executed
        claim = following
    return executed


# How long a batch's task goes on to its next run before it hands the rest on to other workers.
BATCH_TURN_SECONDS = 0.5


def advance_each(run_ids: list[str]) -> int:
    """Advance the runs of one message (runs.engine.dispatch.hint_soon), one after another, as
    long as each is quick: the moment one waits on the outside world (a request sent, a call
    that did not return at once), or after BATCH_TURN_SECONDS, the runs not begun yet leave as
    a message of their own for any worker — no run of a batch waits behind another's call.
    Steps executed; as safe twice as `advance` (a redelivered batch finds its runs claimed or
    done)."""
    rest = [str(run_id) for run_id in run_ids]
    rest.reverse()  # popped from the end: the message's order

    def hand_on() -> None:
        if rest:
            handed = rest[::-1]
            rest.clear()
            hint_many(handed)

    turn_ends = time.monotonic() + BATCH_TURN_SECONDS
    executed = 0
    try:
        with on_first_wait(hand_on):
            while rest:
                executed += advance(rest.pop())
                if rest and time.monotonic() > turn_ends:
                    hand_on()
    finally:
        hand_on()  # what an error left undone goes on elsewhere
    return executed


def stand_down(claim: Claim, why: str) -> None:
    """This worker was away (paused, cut off) and its claim was taken back: it records nothing
    of the step and sent nothing; the timeline says so, for whoever reads what happened."""
    logger.warning("standing down from run %s: %s", claim.run.pk, why)
    with transaction.atomic():
        TimelineEvent.append(
            claim.run.pk,
            Verb.STEP_OUTCOME_DISCARDED,
            {
                "step": claim.step.name,
                "worker": claim.worker,
                "attempt": claim.step.attempts,
                "why": "the claim was taken back while this worker was away; nothing was sent",
            },
        )


def run_until_quiet(run_id, *, max_steps: int = 1000) -> Run:
    """Advance a run in this process until it has nothing runnable (tests, drills, the shell)."""
    total = 0
    while total < max_steps:
        executed = advance(run_id, budget=3600)
        total += executed
        if executed == 0:
            break
    return Run.objects.get(pk=run_id)

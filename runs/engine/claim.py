"""Claiming: a short transaction picks the run's next step and leases it to this worker."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from runs import workflows as workflow_registry
from runs.engine.compensation import finish_compensation
from runs.engine.context import build_context
from runs.engine.dispatch import conf, worker_id
from runs.models import (
    FailureClass,
    Lease,
    RecoveryCause,
    Run,
    SideEffect,
    Step,
    Wait,
    Worker,
    new_row,
    to_json_value,
)
from runs.people import Pause
from runs.workflows import Context, DynamicStep, StepDef, Workflow

# Where runs that cannot go on by themselves wait for a person (no rule is asked: nothing
# failed, something is missing).
OPS_QUEUE = "ops"
UNCHECKED = object()


@dataclass
class Claim:
    """A leased step: the worker that holds it and what it needs to execute it."""

    run: Run
    step: Step
    workflow: Workflow
    definition: StepDef
    ctx: Context
    worker: str
    reclaimed: bool = False
    # The run's steps as this worker knows them (the one claimed included), and whether this
    # claim created the step: what the inline path needs to go on without reading them again.
    steps: list[Step] = field(default_factory=list)
    fresh: bool = False
    # The open pause of the step's tool, read in the claim's own round trip (runs.engine.inline)
    # so the call needs no second one; UNCHECKED when the claim did not read it.
    pause: Pause | None | object = UNCHECKED
    # The side effect's snapshot and intent when they were written with the claim, and the
    # parameters they were written for (runs.engine.inline).
    intent: tuple[SideEffect, dict] | None = None
    # Every open pause as of the claim's round trip ({tool: Pause}), when it read them: what a
    # read executed ahead of its own claim goes by (runs.engine.inline).
    paused: dict | None = None
    # The outcome of the step when it was executed before the claim committed (a read that
    # failed ahead of its claim, runs.engine.inline): recorded as this attempt's.
    ahead: Any = None
    # When this worker made the claim (monotonic): runs.engine.liveness.fence checks the lease
    # itself only once the claim is no longer young.
    claimed_at: float = field(default_factory=time.monotonic)

    @property
    def lease(self) -> Lease:
        """What this worker holds: recording anything for the step is conditional on it."""
        return Lease(self.worker, self.step.attempts)


def lease_until(now: datetime) -> datetime:
    return now + timedelta(seconds=conf("LEASE_SECONDS"))


def claim_next(run_id, *, worker: str | None = None, now: datetime | None = None) -> Claim | None:
    """Claim the run's next step, or return None when there is nothing to do right now.

    1. Lock the run row (short transaction; serialises claimers of one run).
    2. Leave runs that are not runnable (waiting, parked, finished) alone.
    3. Pick the first unfinished step; when none is left, decide the next one from the workflow
       (recorded as a new row) or finish the run.
    4. Claim it with a compare-and-set to `running` and a lease; a running step whose lease
       expired is taken back (its worker died).
    """
    worker = worker or worker_id()
    with transaction.atomic():
        run = Run.objects.select_for_update().filter(pk=run_id).first()
        # After the lock: a claimer that waited for it must not get a lease that began before.
        now = now or timezone.now()
        if run is None or run.status not in Run.RUNNABLE:
            return None
        try:
            workflow = workflow_registry.get(run.workflow, run.workflow_version)
        except workflow_registry.UnknownWorkflow:
            run.ask_human(
                f"Workflow {run.workflow} version {run.workflow_version} is no longer "
                "registered in this deployment; the run cannot resume automatically. Deploy "
                "that version again, or finish the run by hand.",
                queue=OPS_QUEUE,
                cause=RecoveryCause.WORKFLOW_NOT_REGISTERED,
            )
            return None
        steps = list(run.steps.order_by("position"))
        current = next((s for s in steps if s.status in Step.UNFINISHED), None)
        if run.status == Run.Status.PENDING:
            run.start()
        ctx = build_context(run, steps)
        if current is None:
            return _open_next_step(run, workflow, steps, ctx, worker, now)
        return _claim_existing(run, workflow, current, ctx, worker, now, steps)


def _next_choice(run: Run, workflow: Workflow, steps: list[Step], ctx: Context):
    """The workflow's next step after the recorded ones: a StepDef/DynamicStep, None when the
    run is done, or False when choosing failed (the run went to a person)."""
    if not steps:
        return workflow.steps[0]
    last = steps[-1]
    try:
        return workflow.following(ctx, last.name, last.spec)
    except Exception as exc:  # a next() function failed: a person looks at the data
        run.ask_human(
            f"Choosing the step after {last.name!r} failed: {type(exc).__name__}: {exc}",
            queue=OPS_QUEUE,
            failure_class=FailureClass.INVALID_INPUT,
        )
        return False


def _open_next_step(run, workflow, steps, ctx, worker, now) -> Claim | None:
    if run.status == Run.Status.COMPENSATING:
        finish_compensation(run)
        return None
    choice: StepDef | DynamicStep | None | bool = _next_choice(run, workflow, steps, ctx)
    if choice is False:
        return None
    if choice is None:
        run.succeed(ctx.results.get(steps[-1].name) if steps else None)
        return None
    step, definition = new_step(run, workflow, steps, choice, worker, now)
    # Created already running (one INSERT instead of INSERT + claim), with its event, in this
    # same transaction.
    return open_claimed(claim_of(run, step, workflow, definition, ctx, worker, steps))


def open_claimed(claim: Claim, *, into=None) -> Claim:
    """Write the step `claim` created (running and leased to its worker, new_step) with its
    `step.started`, entering its stage: in the caller's transaction (claim_next), or `into` a
    batch (the hot path, runs.engine.inline, which adds the reads and the intent its one
    statement also carries)."""
    stage = claim.definition.stage
    if stage and claim.run.stage != stage:
        claim.run.enter_stage(stage, into=into)
    claim.step.open(into=into)
    return claim


def new_step(run, workflow, steps, choice, worker, now) -> tuple[Step, StepDef]:
    """The row (unsaved, already running and leased to `worker`) of the step the workflow
    chose after `steps`, and its definition."""
    spec = choice.spec()
    name = choice.name
    if isinstance(choice, DynamicStep) and steps:
        previous = steps[-1]
        after = previous.spec.get("after", "") if previous.spec.get("dynamic") else previous.name
        spec.setdefault("after", after)
    definition = workflow.definition_of(name, spec) if spec else choice
    step = new_row(
        Step,
        cache={"run": run},
        run_id=run.id,
        name=name,
        iteration=sum(1 for s in steps if s.name == name),
        position=(steps[-1].position + 1) if steps else 0,
        kind=definition.kind,
        stage=definition.stage,
        tool=definition.tool,
        spec=to_json_value(spec) if spec else {},
        status=Step.Status.RUNNING,
        attempts=1,
        lease_owner=worker,
        lease_expires_at=lease_until(now),
        started_at=now,
        created_at=now,
    )
    return step, definition


def claim_of(run, step, workflow, definition, ctx, worker, steps) -> Claim:
    """The claim of a step this worker just created (and leased)."""
    ctx.iteration = step.iteration
    ctx.spec = step.spec
    return Claim(run, step, workflow, definition, ctx, worker, steps=[*steps, step], fresh=True)


def _not_claimable(run: Run, step: Step, now: datetime) -> tuple[bool, bool]:
    """(skip, reclaimed): whether the step cannot be claimed now, and whether it is a running
    step taken back after its lease ran out. Parks the run for a person where that is what the
    step's state says."""
    S = Step.Status
    if step.status == S.RUNNING:
        if step.lease_expires_at and step.lease_expires_at > now:
            return True, False  # someone is on it
        return False, True
    if step.status == S.RETRY_SCHEDULED:
        return bool(step.next_attempt_at and step.next_attempt_at > now), False
    if step.status == S.WAITING:
        # A waiting step under a runnable run can only be a tool-recovery wait whose probe the
        # sweeper found due (event, timer and approval waits settle the step before resuming
        # the run). The sweeper's decision stands, whatever this host's clock says.
        if Wait.objects.filter(
            step=step, kind=Wait.Kind.TOOL_RECOVERY, status=Wait.Status.PENDING
        ).exists():
            return False, False
        run.ask_human(
            f"Step {step.name!r} is waiting with nothing to wait for.",
            queue=OPS_QUEUE,
            cause=RecoveryCause.NOTHING_TO_WAIT_FOR,
        )
        return True, False
    if step.status != S.PENDING:
        # needs_human / unknown_outcome under a runnable run: park the run for a person.
        run.ask_human(
            f"Step {step.name!r} is {step.get_status_display().lower()} and needs a person.",
            queue="support",
            failure_class=step.error_class,
        )
        return True, False
    return False, False


def _why_reclaimed(step: Step) -> str:
    """Why the previous holder lost the step: its heartbeat stopped (runs.engine.liveness), or
    only its lease ran out."""
    dead = (
        Worker.objects.filter(pk=step.lease_owner, dead_at__isnull=False)
        .values_list("dead_at", "found_dead_by")
        .first()
    )
    if dead is None:
        return "the lease ran out"
    at, by = dead
    return f"the worker stopped beating (found dead at {at.isoformat()} by {by})"


def _claim_existing(run, workflow, step, ctx, worker, now, steps) -> Claim | None:
    skip, reclaimed = _not_claimable(run, step, now)
    if skip:
        return None
    try:
        definition = workflow.definition_of(step.name, step.spec)
    except workflow_registry.WorkflowError as exc:
        run.ask_human(str(exc), queue=OPS_QUEUE, cause=RecoveryCause.STEP_NOT_IN_WORKFLOW)
        return None
    attempt = step.attempts + 1
    if reclaimed:
        # The previous holder's lease ran out: it crashed or hung. Take the step back.
        why = _why_reclaimed(step)
        if not step.reclaim(worker=worker, lease_until=lease_until(now), attempt=attempt, why=why):
            return None
        run.count_failure()  # the attempt that held the lease failed with its worker
    else:
        step.start(
            worker=worker,
            lease_until=lease_until(now),
            attempt=attempt,
            started_at=step.started_at or now,
        )
    ctx.iteration = step.iteration
    ctx.spec = step.spec
    return Claim(run, step, workflow, definition, ctx, worker, reclaimed=reclaimed, steps=steps)

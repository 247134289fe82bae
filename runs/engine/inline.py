"""The hot path: the common case of each protocol step as one round trip (runs.batch).

- `claim_fresh`: a run that was just started — its start and its first step's claim, after
  one read.
- `record_and_continue`: a step that succeeded (a side effect with its receipt) and the run's
  next step claimed, or the run's success.
- `write_intent`: a fresh side-effect step's snapshot and `intended` ledger row.

A claim made here also reads the open pause of the claimed step's tool in the same round trip,
so the call needs no query of its own. Only the common case goes this way: a running run, a step
that succeeded on its first attempt, a next step the workflow chooses from what this worker
already holds, an idempotency key used for the first time. Anything else — and any guard that
fails because a row moved (a lease taken back, a run cancelled or taken over, a key used before,
a chain head another process moved) — takes the ordinary path through the model verbs, which
write the same records one statement at a time and know what to do in every case. Both paths
write the same rows and the same timeline events (tests/runs/test_inline.py compares them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from types import SimpleNamespace

from django.db import connection, models
from django.utils import timezone

from runs import hooks, statements
from runs import tools as tool_registry
from runs import workflows as workflow_registry
from runs.batch import STEP_IDS, Batch, Refused, execute_one
from runs.engine import gate
from runs.engine.calls import build_params, check_scope
from runs.engine.claim import Claim, claim_of, new_step, open_claimed
from runs.engine.context import build_context
from runs.engine.dispatch import conf
from runs.engine.ledger import (
    batch_intent,
    idempotency_key_for,
    intent_written,
    needs_baseline,
    prepare_intent,
    snapshot_fields,
)
from runs.engine.liveness import ClaimLost
from runs.engine.outcomes import Failed, Outcome, Succeeded
from runs.engine.steps import execute
from runs.models import (
    Run,
    SideEffect,
    Step,
    StepKind,
    chain_heads,
    digest,
    json_loads,
    to_json_value,
)
from runs.people import Pause, people
from runs.tools import ToolError
from runs.workflows import DynamicStep, StepDef

# What recording found besides the next claim: the run ended with this step, or the step is
# recorded and the run has more to do later (the time budget is spent).
DONE = "done"
RECORDED = "recorded"
# claim_fresh: the run is not a fresh one; claim it through the ordinary path.
ORDINARY = "ordinary"

_RUN_FIELDS = Run._meta.concrete_fields
_RUN_COLUMNS = tuple(f.column for f in _RUN_FIELDS)
_RUN_ATTNAMES = [f.attname for f in _RUN_FIELDS]


def _converter(field):
    """How a column's value from the row becomes the field's: a JSONField's text (jsonb comes
    as text through Django's connection) by runs.models.json_loads, as JSONField.from_db_value
    would with Python's decoder; any other field's from_db_value; None when there is none."""
    if isinstance(field, models.JSONField) and field.decoder is None:
        return _json_column
    if hasattr(field, "from_db_value"):
        return lambda value: field.from_db_value(value, None, connection)
    return None


def _json_column(value):
    if value is None:
        return None
    try:
        return json_loads(value)
    except json.JSONDecodeError:  # as JSONField.from_db_value: the text as it is
        return value


_RUN_CONVERTERS = [_converter(f) for f in _RUN_FIELDS]


def _run_from_row(row) -> Run:
    values = [
        value if convert is None else convert(value)
        for convert, value in zip(_RUN_CONVERTERS, row, strict=True)
    ]
    return Run.from_db("default", _RUN_ATTNAMES, values)


# --------------------------------------------------------------------------------------------
# Claiming a fresh run


def claim_fresh(run_id, worker: str) -> Claim | str | None:
    """Start a run that was just created and claim its first step, in one round trip after one
    read (of the run and of the open pauses). Returns the Claim, None when the run has nothing
    to do (gone or not runnable), or ORDINARY when it is not a fresh run (the ordinary claim
    decides)."""
    if not conf("HOT_PATH"):
        return ORDINARY
    pauses, rules = _pauses_sql(), people().rules_statement()
    select = statements.select_fresh_run(_RUN_COLUMNS, pauses, rules)
    row = execute_one(select, [run_id], writes=False)
    if row is None:
        return None
    fields = len(_RUN_FIELDS)
    run, has_steps = _run_from_row(row[:fields]), row[fields]
    paused = _paused_from(row[fields + 1]) if pauses else {}
    if rules:  # the approval rules as of this read: the gate clears the first call by them
        people().rules_seen(row[-1])
    if run.status not in Run.RUNNABLE:
        return None
    if run.status != Run.Status.PENDING or has_steps:
        return ORDINARY
    try:
        workflow = workflow_registry.get(run.workflow, run.workflow_version)
    except workflow_registry.UnknownWorkflow:
        return ORDINARY  # the ordinary claim hands it to a person
    batch = Batch(run.id, (run.event_seq, run.event_hash), expect_status=Run.Status.PENDING)
    run.start(into=batch)
    following = _plan_ahead(
        batch, run, workflow, [], workflow.steps[0], worker, timezone.now(), paused=paused
    )
    if following is None:
        return ORDINARY
    try:
        values = batch.commit()
    except Refused:
        return ORDINARY
    run.status, run.lock_version = Run.Status.RUNNING, run.lock_version + 1
    if following is DONE:
        run.status = Run.Status.SUCCEEDED
        chain_heads.forget(run.id)
        return None
    return _claimed(following, values)


# How many steps in a row one statement may record, executed ahead of their claim.
AHEAD = 8


def _plan_ahead(
    batch, run, workflow, steps, choice, worker, now, result=None, *, paused, reads=True
):
    """The run's next move after `steps`, as parts of `batch`.

    1. A step that changes nothing is executed here, ahead of any claim, and recorded done with
       its start: a pure compute step (no tool, not a model turn) and, when `reads` (nothing in
       this batch needs committing before a call may wait: no receipt), a read whose tool was
       not paused when this worker last looked (`paused`, as of its previous statement; the
       batch checks again). Had nothing committed, it would simply run again. Then the step
       after it is chosen, up to AHEAD of them.
    2. The first step that calls out (or waits, or needs a person) is claimed (_claim_new); so
       is a read that failed ahead, its claim carrying the outcome (recorded as its attempt's).
    3. When nothing is left, the run succeeds with the last result.
    Returns the next step's claim (_Pending until the batch commits), DONE, or None when the
    ordinary path must decide (a next() that fails: it asks a person, with the error).
    """
    for _ in range(AHEAD):
        if choice is None:
            run.succeed(result, now=now, into=batch)
            return DONE
        step, definition = new_step(run, workflow, steps, choice, worker, now)
        ctx = build_context(run, steps)
        done = _ahead(run, step, workflow, definition, ctx, steps, worker, paused, reads)
        if isinstance(done, Failed):  # a read that failed ahead: claimed with its outcome
            pending = _claim_new(batch, run, workflow, step, definition, ctx, steps, worker)
            pending.claim.ahead = done
            return pending
        if done is _NOT_AHEAD:
            return _claim_new(batch, run, workflow, step, definition, ctx, steps, worker)
        step.id = STEP_IDS.next()
        run.enter_stage(definition.stage, into=batch)
        if isinstance(done, Succeeded):  # a read
            step.open_done(done.result, now, read_record=done.read, into=batch)
            pauses = _pauses_sql()
            if pauses is not None:  # a pause that came meanwhile: the ordinary path decides
                batch.check(
                    f"NOT (({batch.shared(pauses)})::jsonb ? %s)", [step.tool], "tool paused"
                )
            done = done.result
        else:
            step.open_done(done, now, into=batch)
        steps, result = [*steps, step], done
        try:
            choice = workflow.following(build_context(run, steps), step.name, step.spec)
        except Exception:
            return None
    step, definition = new_step(run, workflow, steps, choice, worker, now)
    return _claim_new(
        batch, run, workflow, step, definition, build_context(run, steps), steps, worker
    )


_NOT_AHEAD = object()


def _ahead(run, step, workflow, definition: StepDef, ctx, steps, worker, paused, reads):
    """What executing the step ahead of its claim gave: a pure compute step's result; a read's
    Succeeded (with its read record), or its other Outcome when it failed or degraded; or
    _NOT_AHEAD (a step that is neither, a read that may not go ahead, a compute step that
    failed: the ordinary execution records the failure, with its class)."""
    if definition.kind == StepKind.READ:
        if not reads or not _reads_ahead(definition, paused):
            return _NOT_AHEAD
        claim = claim_of(run, step, workflow, definition, ctx, worker, steps)
        claim.pause = None  # not paused as of the worker's last statement (checked again)
        try:
            outcome = execute(claim)
        except ClaimLost:
            return _NOT_AHEAD
        if isinstance(outcome, Succeeded) and outcome.degraded is None and not outcome.events:
            return outcome
        return outcome if isinstance(outcome, Failed) else _NOT_AHEAD
    if definition.kind != StepKind.COMPUTE or definition.fn is None or definition.waits:
        return _NOT_AHEAD
    ctx.iteration, ctx.spec = step.iteration, step.spec
    if hooks.tracers:
        claim = claim_of(run, step, workflow, definition, ctx, worker, steps)
        done = hooks.traced("step", claim, lambda: _computed_ahead(definition, ctx))
        return _NOT_AHEAD if done is None else done.result
    try:
        return to_json_value(definition.fn(ctx))
    except Exception:
        return _NOT_AHEAD


def _computed_ahead(definition: StepDef, ctx) -> Succeeded | None:
    """A pure compute step executed ahead, as tracers see it (runs.hooks): its result, or None
    when it failed (executed again by the ordinary path, which records the failure)."""
    try:
        return Succeeded(to_json_value(definition.fn(ctx)))
    except Exception:
        return None


def _reads_ahead(definition: StepDef, paused: dict | None) -> bool:
    """A read may go ahead of its claim when the worker knows its tool's pauses (`paused`, as of
    its last statement) and its tool is a registered read that is not paused."""
    if paused is None or not definition.tool or definition.tool in paused:
        return False
    try:
        return not tool_registry.get(definition.tool).side_effect
    except tool_registry.UnknownTool:
        return False


@dataclass
class _Pending:
    """A claim made in a batch that has not committed yet, with what it needs once it has:
    where the open pauses and the approval rules are among the batch's values, and the intent
    (and its parameters) written with it."""

    claim: Claim
    pause_index: int | None = None
    rules_index: int | None = None
    intent: tuple | None = None


def _claim_new(batch, run, workflow, step, definition, ctx, steps, worker) -> _Pending:
    """The claim of a new step (built by runs.engine.claim.new_step) as parts of `batch`: the
    run's stage, the open pause of the step's tool read back, the step created running and
    leased and, for a side effect, its first call's snapshot and intent (the parameters are
    pure: built once, here). Complete once the batch has committed (_claimed)."""
    step.id = STEP_IDS.next()
    claim = claim_of(run, step, workflow, definition, ctx, worker, steps)
    pending = _Pending(claim)
    pauses, rules = _pauses_sql(), people().rules_statement()
    pending.pause_index = None if pauses is None else batch.value(batch.shared(pauses), [])
    # The approval rules as of this statement, for the gate's next hot-path clearance.
    pending.rules_index = None if rules is None else batch.value(batch.shared(rules), [])
    call = _prepare_call(claim) if definition.kind == StepKind.SIDE_EFFECT else None
    if call is not None:
        step.idempotency_key = call[1].idempotency_key
    open_claimed(claim, into=batch)
    if call is not None:
        batch_intent(batch, claim, call[0], call[1], call[3], new_step=True)
        if pauses is not None:  # never an intent for a paused tool
            batch.check(f"NOT (({batch.shared(pauses)})::jsonb ? %s)", [step.tool], "tool paused")
        pending.intent = (call[1], call[2])
    return pending


def _prepare_call(claim: Claim):
    """(snapshot, intent, parameters, the gate's clearance) of the claimed side effect's first
    call, unless building them needs the ordinary path: a parameter or scope error, a missing
    snapshot field (it says which), a tool that is not a side effect, a call the approval rules
    as this process knows them may put behind a person (runs.engine.gate decides it there)."""
    try:
        tool = tool_registry.get(claim.definition.tool)
        if not tool.side_effect or needs_baseline(tool):
            return None  # a verification baseline is read before the intent: the ordinary path
        params = build_params(claim, tool)
        check_scope(claim, tool)
    except (ToolError, tool_registry.UnknownTool):
        return None
    cleared = gate.cleared_by_cached_rules(claim, tool, params)
    if cleared is None:
        return None
    key = idempotency_key_for(claim.step)
    fields = snapshot_fields(claim, tool, params, key)
    prepared = prepare_intent(claim, tool, fields, digest(params), key)
    return None if prepared is None else (*prepared, params, cleared)


def _claimed(pending: _Pending, values: list) -> Claim:
    """The claim once its batch committed (the steps it created too: the steps done ahead)."""
    claim = pending.claim
    for step in claim.steps:
        if isinstance(step, Step):
            step._state.adding = False
    claim.run.stage = claim.step.stage or claim.run.stage
    if pending.rules_index is not None:
        people().rules_seen(values[pending.rules_index])
    if pending.pause_index is not None:
        claim.paused = _paused_from(values[pending.pause_index])
        if claim.step.kind in (StepKind.READ, StepKind.SIDE_EFFECT) and claim.step.tool:
            claim.pause = claim.paused.get(claim.step.tool)
    if pending.intent is not None:
        effect, params = pending.intent
        claim.intent = (intent_written(effect), params)
    return claim


def _pauses_sql() -> str | None:
    """The read of every open pause (runs.people), None when no tool can be paused."""
    return people().pauses_statement()


def _paused_from(value) -> dict[str, Pause]:
    """{tool: Pause} from the pauses read (a JSON object {tool: [id, reason]})."""
    return {tool: Pause(pk, reason) for tool, (pk, reason) in (value or {}).items()}


# --------------------------------------------------------------------------------------------
# Recording a success and claiming the next step


def record_and_continue(claim: Claim, outcome: Outcome, *, go_on: bool) -> Claim | str | None:
    """Record a succeeded step and, when `go_on`, claim the run's next step, in one round trip.

    Returns the next Claim, DONE when the run succeeded with this step, RECORDED when `go_on`
    is false (the step is recorded, nothing claimed), or None when this outcome must take the
    ordinary path (nothing was written).
    """
    if not _inline(claim, outcome):
        return None
    run, step = claim.run, claim.step
    head = chain_heads.get(run.id)
    if head is None:
        return None
    batch = Batch(run.id, head, expect_status=Run.Status.RUNNING)
    now = timezone.now()
    result = outcome.result
    if outcome.committed is not None:
        effect, receipt = outcome.committed
        effect.commit(receipt, confirmed_by="tool", data={"step": step.name}, now=now, into=batch)
    step.succeed_attempt(result, held_by=claim.lease, read_record=outcome.read, now=now, into=batch)
    following = _plan_next(batch, claim, outcome, now) if go_on else None
    if following is None and go_on:
        return None
    try:
        values = batch.commit()
    except Refused:
        return None
    _remember_success(claim, outcome, result, now)
    if following is None:
        return RECORDED
    if following is DONE:
        run.status = Run.Status.SUCCEEDED
        run.lock_version += 1
        chain_heads.forget(run.id)
        return DONE
    # The claim's steps, with this worker's own row (now done) instead of its stand-in.
    following.claim.steps = [step if s.id == step.id else s for s in following.claim.steps]
    return _claimed(following, values)


def _inline(claim: Claim, outcome: Outcome) -> bool:
    return (
        conf("HOT_PATH")
        and isinstance(outcome, Succeeded)
        and outcome.degraded is None
        and not outcome.events
        and claim.run.status == Run.Status.RUNNING
        and not claim.step.spec.get("compensates")
        and not claim.step.error_class
        and claim.step.attempts == 1
    )


def _plan_next(batch: Batch, claim: Claim, outcome: Succeeded, now):
    """Add the next step's claim (or the run's success) to the batch; None when choosing it
    needs the ordinary path (an unfinished step after this one, or a next() that fails).
    Returns DONE, or the next step's claim (_Pending until the batch has committed)."""
    result = outcome.result
    run, step, workflow = claim.run, claim.step, claim.workflow
    if any(s.status in Step.UNFINISHED for s in claim.steps if s.id != step.id):
        return None
    # The claim's own step changes only once the batch has committed: the context sees it done.
    done = SimpleNamespace(
        name=step.name,
        iteration=step.iteration,
        status=Step.Status.SUCCEEDED,
        result=result,
        kind=step.kind,
        tool=step.tool,
        position=step.position,
        spec=step.spec,
        pk=step.id,
        id=step.id,
    )
    steps = [done if s.id == step.id else s for s in claim.steps]
    ctx = build_context(run, steps)
    try:
        choice: StepDef | DynamicStep | None = workflow.following(ctx, step.name, step.spec)
    except Exception:
        return None  # the ordinary claim asks a person, with the error
    # A receipt is committed before any call that may wait: no read goes ahead of it.
    reads = outcome.committed is None
    worker, paused = claim.worker, claim.paused
    return _plan_ahead(
        batch, run, workflow, steps, choice, worker, now, result, paused=paused, reads=reads
    )


def _remember_success(claim: Claim, outcome: Succeeded, result, now) -> None:
    step = claim.step
    step.status, step.result, step.finished_at = Step.Status.SUCCEEDED, result, now
    step.lease_owner, step.lease_expires_at = "", None
    if outcome.read:
        step.read_record = outcome.read
    if outcome.committed is not None:
        effect = outcome.committed[0]
        effect.status, effect.committed_at = SideEffect.Status.COMMITTED, now

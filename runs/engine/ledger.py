"""The side-effect protocol: snapshot and intent before the call, the keyed call, the receipt
after it, and reconciliation of an outcome nobody saw.

1. Build the parameters (pure) and commit, in one transaction, an immutable Snapshot and the
   SideEffect ledger row `intended` under a deterministic idempotency key. A key already
   `committed` is reused and nothing is called (the idempotency check); the same key with other
   parameters is an error, never a second call.
2. Call the tool with the key and a hard timeout.
3. The receipt commits with the step's outcome (runs.engine.record); a failure is classified.
4. An unknown outcome is reconciled: asked by key, verified with a read (runs.tools.Verification:
   the effect is there, or it is not and the call is made again), resent where the tool dedupes
   by key, or handed to a person — never guessed.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from enum import StrEnum

from django.db import transaction
from django.utils import timezone

from runs import tools as tool_registry
from runs.batch import SIDE_EFFECT_IDS, SNAPSHOT_IDS, Batch, Refused
from runs.conditions import broken, describe
from runs.engine import gate
from runs.engine.calls import (
    build_params,
    call_context,
    check_scope,
    invoke,
    lookup,
    read_for_verification,
)
from runs.engine.claim import Claim
from runs.engine.context import prior_results_summary
from runs.engine.dispatch import conf
from runs.engine.liveness import ClaimLost, fence
from runs.engine.outcomes import (
    AskApproval,
    Failed,
    Outcome,
    Recheck,
    Succeeded,
    UnknownOutcome,
)
from runs.models import (
    FailureClass,
    Receipt,
    Run,
    SideEffect,
    Snapshot,
    Step,
    TimelineEvent,
    TransitionError,
    chain_heads,
    digest,
    shown,
    to_json_value,
)
from runs.tools import LookupResult, Tool, ToolError
from runs.verbs import Verb

# How many times an unanswered lookup is asked again before a person is.
RECHECK_ATTEMPTS = 8


class IdempotencyKeyConflict(Exception):
    pass


class Verdict(StrEnum):
    """What reconciling an unknown outcome found."""

    COMMITTED = "committed"  # it landed: the receipt is recorded
    RESEND = "resend"  # safe to call again with the same key
    RECHECK = "recheck"  # no record yet, but the request may still be in flight: ask later
    UNKNOWN = "unknown"  # nothing can tell: a person decides
    CHANGED = "changed"  # found by key, but not as recorded or expected: a person confirms


def idempotency_key_for(step: Step) -> str:
    if step.idempotency_key:
        return step.idempotency_key
    suffix = f"-{step.iteration}" if step.iteration else ""
    return f"tp-{step.run_id}-{step.name}{suffix}"


def execute_side_effect(claim: Claim, tool: Tool) -> Outcome:
    """The protocol for one attempt of a side-effect step (see the module docstring)."""
    if not tool.side_effect:
        raise ToolError(FailureClass.INVALID_INPUT, f"{tool.name} is not a side-effect tool")
    if claim.intent is not None:  # written with the claim (runs.engine.inline)
        effect, params = claim.intent
        return _call(claim, tool, effect, params, effect.idempotency_key)
    params = build_params(claim, tool)
    check_scope(claim, tool)
    key = idempotency_key_for(claim.step)
    if not claim.fresh:  # a step this claim created has no earlier attempt
        switched = _switched_to_fallback(claim, key)
        if switched is not None:  # an earlier attempt degraded: its fallback call is the one
            return _degrade_with(claim, tool, switched, params, key)
    return _keyed_call(claim, tool, params, key)


def _keyed_call(claim: Claim, tool: Tool, params: dict, key: str, *, fallback_of: str = ""):
    """Snapshot and intent under `key`, then the call (steps 1-3 of the module docstring).
    `fallback_of`: the tool this one stands in for (its key is not the step's own)."""
    try:
        effect, done = write_intent(
            claim, tool, params, key, remember=not fallback_of, fallback_of=fallback_of
        )
    except IdempotencyKeyConflict as exc:
        conflict = (Verb.SIDE_EFFECT_KEY_CONFLICT, {"key": key, "step": claim.step.name})
        return Failed(FailureClass.INVALID_INPUT, str(exc), events=[conflict])
    if done is not None:
        return done
    return _call(claim, tool, effect, params, key, fallback_of=fallback_of)


def _call(claim: Claim, tool: Tool, effect: SideEffect, params: dict, key: str, fallback_of=""):
    if effect.status == SideEffect.Status.UNKNOWN:
        settled = _settle_previous_attempt(claim, tool, effect)
        if settled is not None:
            return settled
        if effect.status == SideEffect.Status.NOT_COMMITTED:
            effect, done = write_intent(
                claim, tool, params, key, remember=not fallback_of, fallback_of=fallback_of
            )
            if done is not None:
                return done
    refused = _check_conditions(claim, tool, params, effect)
    if refused is not None:
        return refused
    try:
        result = invoke(claim, tool, params, key)
    except ToolError as exc:
        if not fallback_of and exc.failure_class != FailureClass.UNKNOWN_OUTCOME:
            degraded = _degrade_if_ruled(claim, tool, effect, params, key, exc)
            if degraded is not None:
                return degraded
        return _after_failed_call(claim, tool, effect, exc)
    receipt = Receipt(result.external_id, to_json_value(result.response))
    if tool.expect_fields and tool.unexpected(params, receipt.response):
        # Not what was asked for (a deduping system replaying another record under this key):
        # taken neither as done nor as not done — a person confirms.
        return _answered_otherwise(claim, effect, tool, receipt)
    return Succeeded(receipt.response, committed=(effect, receipt))


# -- Degrading a side effect to its tool's fallback
#
# Only a call the ledger knows did not land may be replaced by another tool's call: the tool
# answered with a class other than unknown_outcome (refused, outage, not sent). An unknown
# outcome never degrades (both effects could land): it is reconciled or goes to a person. The
# fallback call is a side effect of its own: its own snapshot and `intended` row under the key
# `<step key>:fallback:<tool>`, written before the call, then the same receipt or
# reconciliation. The original row is marked not_committed first, and a later attempt that finds
# the fallback's row settles that call instead of calling the original again.


def fallback_key_for(key: str, fallback_tool: str) -> str:
    return f"{key}:fallback:{fallback_tool}"


def _degrade_if_ruled(claim, tool, effect, params, key, exc: ToolError) -> Outcome | None:
    """The original call was refused: when routing says degrade, switch to the fallback (or
    fail saying exactly why that cannot be done). None: the rule says something else."""
    from runs.engine.routing import degrade_route

    route = degrade_route(claim, tool, exc.failure_class)
    if route is None:
        return None
    failed = f"{tool.name} failed ({exc.failure_class}: {exc.message})"
    if route.fallback is None:
        return Failed(exc.failure_class, f"{failed}; {route.why_not}", not_committed=effect)
    _settle(effect, effect.mark_not_committed)  # before anything else is sent
    why = {
        "rule": route.rule.describe(),
        "failure_class": exc.failure_class,
        "error": exc.message[:500],
        "original_tool": tool.name,
        "original_key": key,
    }
    return _degrade_with(claim, tool, route.fallback, params, key, why=why)


def _switched_to_fallback(claim: Claim, key: str) -> Tool | None:
    """The fallback tool, when an earlier attempt of this step switched to it and its call may
    have landed (intended, unknown, committed): that call is settled, never the original sent
    again — even if the tool's fallback was changed since. A fallback call known not to have
    landed leaves the step to start afresh with the original."""
    row = (
        SideEffect.objects.filter(
            step_id=claim.step.pk, idempotency_key__startswith=f"{key}:fallback:"
        )
        .exclude(status=SideEffect.Status.NOT_COMMITTED)
        .values_list("tool", flat=True)
        .first()
    )
    return None if row is None else tool_registry.get(row)


def _degrade_with(claim, tool, fallback, params, key, *, why=None) -> Outcome:
    fallback_key = fallback_key_for(key, fallback.name)
    why = why or {"original_tool": tool.name, "original_key": key, "resumed": True}
    outcome = _keyed_call(claim, fallback, params, fallback_key, fallback_of=tool.name)
    if isinstance(outcome, Succeeded):
        details = {**why, "fallback_tool": fallback.name, "fallback_key": fallback_key}
        return replace(
            outcome,
            degraded=(why.get("failure_class", ""), why.get("error", "")),
            degraded_details=details,
        )
    if isinstance(outcome, Failed):
        # Routed as the original failure, so its degrade rule hands it to a person with this.
        if "failure_class" in why:
            error = f"{tool.name} failed ({why['failure_class']}: {why['error']}); its fallback"
        else:
            error = f"an earlier attempt switched {tool.name} to its fallback"
        return replace(
            outcome,
            failure_class=why.get("failure_class", outcome.failure_class),
            error=f"{error} {fallback.name} (key {fallback_key}) failed: {outcome.error}",
        )
    return outcome  # a recheck or an unknown outcome of the fallback's own call


def _answered_otherwise(claim: Claim, effect: SideEffect, tool: Tool, receipt: Receipt):
    fence(claim)
    _settle(effect, lambda: effect.mark_unknown("the answer is not what the snapshot asked for"))
    changes = changed_result(tool, effect, receipt)
    if changes is not None and effect.status == SideEffect.Status.UNKNOWN:
        _settle(effect, lambda: effect.note_result_changed(receipt, changes))
    if effect.changed_result:
        return changed_outcome(effect)
    return unknown_outcome(tool, effect, "the answer is not what the snapshot asked for")


def _settle_previous_attempt(claim: Claim, tool: Tool, effect: SideEffect) -> Outcome | None:
    """An earlier attempt never reported back: find out what it did before calling again.
    None means the call may be made (again) under the same key."""
    verdict = reconcile(claim, tool, effect)
    if verdict == Verdict.COMMITTED:
        return Succeeded(effect.receipt.get("response"))
    if verdict == Verdict.CHANGED:
        return changed_outcome(effect)
    if verdict == Verdict.UNKNOWN:
        return unknown_outcome(tool, effect, "a previous attempt did not report back")
    if verdict == Verdict.RECHECK:
        return recheck(claim, tool, effect)
    return None


def _after_failed_call(claim: Claim, tool: Tool, effect: SideEffect, exc: ToolError) -> Outcome:
    if exc.failure_class != FailureClass.UNKNOWN_OUTCOME:
        return Failed(exc.failure_class, exc.message, not_committed=effect)
    # A worker that was away during its call and lost the claim settles nothing: the row is
    # the new owner's to reconcile (and maybe already in its next attempt).
    fence(claim)
    if effect.status == SideEffect.Status.INTENDED:
        _settle(effect, lambda: effect.mark_unknown(exc.message))
    claim.run.count_failure()  # the call failed, whatever reconciling it finds
    verdict = reconcile(claim, tool, effect, answered=exc.answered)
    if verdict == Verdict.COMMITTED:
        return Succeeded(effect.receipt.get("response"))
    if verdict == Verdict.CHANGED:
        return changed_outcome(effect)
    if verdict == Verdict.RESEND and exc.answered and effect.confirmed_by == "verification":
        # The system answered with an error and a read shows it did nothing: it refused the
        # call. Sending it again would only be refused again; the rules route the refusal.
        return Failed(
            FailureClass.INVALID_INPUT,
            f"{exc.message} (the system answered with an error and the verification read shows "
            "nothing was done: refused)",
        )
    if verdict == Verdict.RESEND:
        # Known not committed, or safe to resend: an ordinary retry with the same key.
        return Failed(FailureClass.TRANSIENT, f"{exc.message} (reconciled: safe to retry)")
    if verdict == Verdict.RECHECK:
        return recheck(claim, tool, effect)
    return unknown_outcome(tool, effect, exc.message)


def snapshot_fields(claim: Claim, tool: Tool, params: dict, key: str) -> dict:
    run = claim.run
    return {
        "workflow_version": run.workflow_version,
        "stage": claim.step.stage,
        "tool": tool.name,
        "params": params,
        "target_resource": tool.target_of(params),
        "permissions": {"actor": run.principal, "scopes": list(run.scopes or [])},
        "prior_results_summary": prior_results_summary(claim.ctx.results),
        "session_context_ref": run.session_context_ref,
        "idempotency_key": key,
        "human_decision": _decision_executed(claim, tool),
    }


def _decision_executed(claim: Claim, tool: Tool) -> dict:
    """The person's decision this call carries out: edited parameters on this step, or the
    latest approval of this tool before it (its result names the decision)."""
    if claim.step.spec.get("human_decision"):
        return claim.step.spec["human_decision"]
    found: dict = {}
    for result in claim.ctx.results.values():
        named = result.get("human_decision") if isinstance(result, dict) else None
        if isinstance(named, dict) and named.get("tool") == tool.name:
            found = named
    return found


def _approved_under(claim: Claim, tool: Tool) -> dict:
    """The approval result (its decision and conditions) this call carries out: the latest
    approval of this tool before it, as _decision_executed finds it."""
    found: dict = {}
    for result in claim.ctx.results.values():
        named = result.get("human_decision") if isinstance(result, dict) else None
        if isinstance(named, dict) and named.get("tool") == tool.name:
            found = result
    return found


def _check_conditions(claim: Claim, tool: Tool, params: dict, effect: SideEffect):
    """Right before the call: the parameters it is about to be made with must meet every
    condition the approver set (runs.conditions). Broken, the call is not made, its ledger row
    is marked not committed, and the step goes to a person with the condition named."""
    named = effect.snapshot.human_decision if effect.snapshot_id else {}
    if isinstance(named, dict) and "approval" in named:  # the approval the gate found in force
        approved = {
            "by": ", ".join(named.get("approvers") or ()),
            "conditions": named.get("conditions") or [],
            "human_decision": named,
        }
    else:
        approved = _approved_under(claim, tool)
    conditions = approved.get("conditions") or []
    failed = broken(conditions, params)
    if not failed:
        return None
    by = approved.get("by") or "the approver"
    actual = "; ".join(
        f"{c['param']} is {params.get(c['param'], '(missing)')!r}"
        for c in conditions
        if describe(c) in failed
    )
    error = (
        f"{tool.name} was not called: its parameters break the condition "
        f"{' and '.join(repr(f) for f in failed)} that {by} approved it under ({actual})"
    )
    return Failed(
        FailureClass.INVALID_INPUT,
        error,
        not_committed=effect,
        to_person={
            "rule": "(approval condition)",
            "conditions": failed,
            "human_decision": (approved.get("human_decision") or {}).get("id"),
        },
    )


def write_intent(
    claim: Claim,
    tool: Tool,
    params: dict,
    key: str,
    *,
    remember: bool = True,
    fallback_of: str = "",
) -> tuple[SideEffect | None, Outcome | None]:
    """Commit the Snapshot and the `intended` SideEffect before the call (the idempotency check),
    once the gate (runs.engine.gate) has cleared a new call with these parameters.

    Returns the ledger row and, when no call must be made, the outcome to record instead (the
    receipt of the key's earlier call, or the approval the gate asks for: then no row).
    `remember`: the key is the step's own (a fallback's key is not, `fallback_of` names the
    tool it stands in for).
    """
    run, step = claim.run, claim.step
    checksum = digest(params)
    fields = snapshot_fields(claim, tool, params, key)
    if needs_baseline(tool) and _new_attempt(key):
        fields["verification_baseline"] = _read_baseline(claim, tool, params, key)
    fresh = _write_fresh_intent(claim, tool, fields, checksum, key) if remember else None
    if fresh is not None:
        return fresh, None  # a new key on a first attempt: one round trip
    with transaction.atomic():
        Run.lock(run.pk)  # the lock order: the run before its ledger row
        if not Step.objects.filter(
            pk=step.pk,
            status=Step.Status.RUNNING,
            lease_owner=claim.worker,
            attempts=step.attempts,
            lease_expires_at__gt=timezone.now(),
        ).exists():
            # Taken back while this worker was away: no intent, and so no call.
            raise ClaimLost(f"step {step.name!r} is no longer held by {claim.worker}")
        effect = SideEffect.objects.select_for_update().filter(idempotency_key=key).first()
        if effect is not None:
            settled = _known_key(run, step, effect, checksum)
            if settled is not False:
                return effect, settled
        cleared = gate.check(claim, tool, params, fallback_of=fallback_of)
        if isinstance(cleared, AskApproval):
            return None, cleared  # nothing written, nothing called: a person approves first
        fields["human_decision"] = cleared.decision() or fields["human_decision"]
        snapshot = Snapshot.prepare(step, **fields)
        missing = snapshot.missing_fields
        required_missing = [f for f in tool.required_snapshot_fields if f in missing]
        if required_missing:
            raise ToolError(
                FailureClass.INVALID_INPUT,
                f"the snapshot lacks fields {tool.name} requires: {', '.join(required_missing)}",
            )
        if effect is None:
            snapshot.id = SNAPSHOT_IDS.next()
            effect = SideEffect.intended(snapshot, params_checksum=checksum)
            record_intent(claim, snapshot, effect, remember=remember)
        else:  # not_committed before: a new attempt with the same key
            snapshot.record()
            effect.intend_again(snapshot)
            if remember:
                step.remember_key(key)
    return effect, None


def needs_baseline(tool: Tool) -> bool:
    return tool.verification is not None and tool.verification.baseline is not None


def _new_attempt(key: str) -> bool:
    """Whether write_intent will write a snapshot for this key (a new key, or one known not to
    have landed): only then is a verification baseline read (a question to the outside world)."""
    status = SideEffect.objects.filter(idempotency_key=key).values_list("status", flat=True)
    return status.first() in (None, SideEffect.Status.NOT_COMMITTED)


def _read_baseline(claim: Claim, tool: Tool, params: dict, key: str) -> dict:
    """What the verification read sees before the call, for the snapshot. A failing read stops
    the step before its intent: nothing was sent, the read's class routes it."""
    try:
        value = read_for_verification(claim, tool, params, key, baseline=True)
    except ToolError as exc:
        raise ToolError(
            exc.failure_class, f"reading the verification baseline failed: {exc.message}"
        ) from None
    return {"value": to_json_value(value)}


def prepare_intent(claim: Claim, tool: Tool, fields: dict, checksum: str, key: str):
    """The unsaved Snapshot and `intended` SideEffect of the first call of a freshly claimed
    step (what write_intent writes), or None when the snapshot lacks a field the tool requires
    (write_intent refuses the call and says which)."""
    snapshot = Snapshot.prepare(claim.step, **fields)
    if set(tool.required_snapshot_fields) & set(snapshot.missing_fields):
        return None
    now = timezone.now()
    snapshot.id, snapshot.created_at = SNAPSHOT_IDS.next(), now
    effect = SideEffect.intended(
        snapshot,
        params_checksum=checksum,
        id=SIDE_EFFECT_IDS.next(),
        created_at=now,
        updated_at=now,
        attempted_at=now,
    )
    effect._state.fields_cache["run"] = claim.run
    return snapshot, effect


def record_intent(
    claim: Claim, snapshot: Snapshot, effect: SideEffect, *, remember=True, into=None
):
    """The protocol's step 2, before the call: the prepared snapshot, the `intended` ledger row
    and (`remember`) the step's key — in the caller's transaction under the run's lock
    (write_intent), or `into` a batch (the hot path), where the key is set only while the claim
    holds the step, unexpired; a step created in the same batch carries its key from the start
    (set it before Step.open), and a key used before makes the batch fail on its unique
    constraint."""
    snapshot.record(into=into)
    effect.record_intent(into=into)
    if remember:
        held_by = claim.lease if into is not None else None
        claim.step.remember_key(effect.idempotency_key, held_by=held_by, into=into)


def batch_intent(batch, claim: Claim, snapshot, effect, cleared, *, new_step=False) -> None:
    """The hot path's intent (record_intent into `batch`), while the approval rules that
    `cleared` the call are those in force (runs.engine.gate)."""
    record_intent(claim, snapshot, effect, remember=not new_step, into=batch)
    if cleared.guard is not None:
        read, expected = cleared.guard
        batch.check(f"({batch.shared(read)}) = %s", [expected], "approval rules changed")


def intent_written(effect: SideEffect) -> SideEffect:
    """After the batch committed: the ledger row as saved."""
    effect.snapshot._state.adding = effect._state.adding = False
    effect.step.idempotency_key = effect.idempotency_key
    return effect


def _write_fresh_intent(claim: Claim, tool: Tool, fields: dict, checksum: str, key: str):
    """write_intent's common case in one round trip: a fresh step's first attempt. None when
    the ordinary path must decide (nothing was written)."""
    head = chain_heads.get(claim.run.pk)
    if not conf("HOT_PATH") or not claim.fresh or claim.step.attempts != 1 or head is None:
        return None
    cleared = gate.cleared_by_cached_rules(claim, tool, fields["params"])
    if cleared is None:
        return None  # the gate decides on the ordinary path, under the run's lock
    prepared = prepare_intent(claim, tool, fields, checksum, key)
    if prepared is None:
        return None
    batch = Batch(claim.run.pk, head, expect_status=Run.Status.RUNNING)
    batch_intent(batch, claim, *prepared, cleared)
    try:
        batch.commit()
    except Refused:
        return None
    return intent_written(prepared[1])


def _known_key(run: Run, step: Step, effect: SideEffect, checksum: str):
    """The key was used before. Returns the outcome when it settles the step (committed: reuse
    the receipt), None when the earlier attempt must be reconciled, False to write a new intent
    (the earlier attempt is known not to have landed)."""
    if effect.params_checksum != checksum:
        raise IdempotencyKeyConflict(
            f"idempotency key {effect.idempotency_key} was first used with other parameters "
            f"(checksum {effect.params_checksum[:12]}…, now {checksum[:12]}…); refusing "
            "to call again. A person must check which parameters are right."
        )
    if effect.status in (SideEffect.Status.COMMITTED, SideEffect.Status.COMPENSATED):
        TimelineEvent.append(
            run.pk,
            Verb.SIDE_EFFECT_REUSED,
            {"step": step.name, "key": effect.idempotency_key, "external_id": effect.external_id},
        )
        return Succeeded(effect.receipt.get("response"))
    if effect.status == SideEffect.Status.INTENDED:
        # Left behind by an attempt that never reported back (worker died mid-call).
        effect.mark_unknown("a previous attempt did not report back")
        return None
    if effect.status == SideEffect.Status.UNKNOWN:
        return None
    return False


def settle_window(claim: Claim, tool: Tool) -> timedelta:
    if tool.settle_seconds is not None:
        return timedelta(seconds=tool.settle_seconds)
    timeout = call_context(claim, tool).timeout or 0
    return timedelta(seconds=2 * timeout + 1)


def reconcile(claim: Claim, tool: Tool, effect: SideEffect, *, answered: bool = False) -> Verdict:
    """Settle an unknown outcome without guessing (see Verdict). `answered`: the system
    answered the call (with an error), so nothing of it can still be in flight."""
    if tool.lookup is not None:
        verdict = _reconcile_by_lookup(claim, tool, effect)
        if verdict is not None:
            return verdict
    elif tool.verification is not None:
        verdict = _reconcile_by_verification(claim, tool, effect, answered)
        if verdict is not None:
            return verdict
    if tool.dedupes_by_key:
        TimelineEvent.append(
            claim.run.pk,
            Verb.SIDE_EFFECT_RESEND_WITH_SAME_KEY,
            {"key": effect.idempotency_key, "why": f"{tool.name} dedupes by idempotency key"},
        )
        return Verdict.RESEND
    return Verdict.UNKNOWN


def _reconcile_by_lookup(claim: Claim, tool: Tool, effect: SideEffect) -> Verdict | None:
    key = effect.idempotency_key
    try:
        found: LookupResult | None = lookup(claim, tool, key)
    except ToolError as exc:
        return _not_answered(claim, Verb.SIDE_EFFECT_LOOKUP_FAILED, key, exc)
    if found.found:
        receipt = Receipt(found.external_id, to_json_value(found.response))
        changes = changed_result(tool, effect, receipt)
        if changes is not None:
            _settle(effect, lambda: effect.note_result_changed(receipt, changes))
            return Verdict.CHANGED if effect.changed_result else Verdict.UNKNOWN
        return _found(effect, receipt, "reconcile")
    return _not_found(claim, tool, effect, "reconcile")


def changed_result(
    tool: Tool, effect: SideEffect, observed: Receipt, *, against_receipt: bool = True
) -> dict | None:
    """What an answer found by key contradicts, or None when it contradicts nothing:

    - the receipt recorded earlier for the key (its response digest), where there is one;
    - the fields the tool expects to equal the snapshot's parameters (`Tool.expect_fields`).

    Returns {"expected": {...}, "fields": {field: {"now", "snapshot"}}, "receipt": {...}}.
    Used by reconciliation (a person confirms) and by the consistency check."""
    recorded = effect.receipt if isinstance(effect.receipt, dict) and against_receipt else {}
    earlier = recorded.get("response_digest", "")
    now = digest(observed.response)
    params = {} if effect.snapshot.pruned else (effect.snapshot.params or {})
    fields = tool.unexpected(params, observed.response)
    if not fields and (not earlier or earlier == now):
        return None
    expected: dict = {"params_digest": effect.params_checksum}
    if tool.expect_fields and params:
        wanted = {name: params[name] for name in tool.expect_fields if name in params}
        expected["shown"] = shown(wanted)
    changes: dict = {"expected": expected, "fields": fields}
    if earlier and earlier != now:
        expected["receipt_digest"] = earlier
        expected["external_id"] = recorded.get("external_id", "")
        changes["receipt"] = {"earlier": earlier, "now": now}
    return changes


def changed_outcome(effect: SideEffect) -> UnknownOutcome:
    """The person's question when a tool's answer by key is not what was asked for."""
    kept = effect.changed_result or {}
    changes = kept.get("changes", {})
    key = effect.idempotency_key
    observed = kept.get("observed", {})
    if changes.get("fields"):
        said = "; ".join(
            f"{name} {shown(values['now'], 80)} (the snapshot said {shown(values['snapshot'], 80)})"
            for name, values in changes["fields"].items()
        )
        what = f"{effect.tool} now reports {said} for key {key}"
    else:
        what = (
            f"{effect.tool} now reports a different result for key {key} than the receipt "
            f"recorded earlier (digest {observed.get('response_digest', '')[:12]}…, recorded "
            f"{changes.get('receipt', {}).get('earlier', '')[:12]}…)"
        )
    return UnknownOutcome(
        f"{what}. The effect is there, but not as this call asked for it: a person confirms "
        "before the run goes on (accept the new result, treat it as not done, or take over)."
    )


def _reconcile_by_verification(
    claim: Claim, tool: Tool, effect: SideEffect, answered: bool = False
) -> Verdict | None:
    """Read what the call would have changed and recognise its effect there (or its absence).
    None: the read cannot tell (or cannot be made): the next way, or a person."""
    key, snapshot = effect.idempotency_key, effect.snapshot
    if snapshot.pruned:
        return None
    verification = tool.verification
    baseline = (snapshot.verification_baseline or {}).get("value")
    try:
        observed = to_json_value(
            read_for_verification(claim, tool, snapshot.params, key, baseline=False)
        )
    except ToolError as exc:
        return _not_answered(claim, Verb.SIDE_EFFECT_VERIFY_FAILED, key, exc)
    try:
        found = verification.recognise(snapshot.params, observed, baseline)
        external_id = (
            str(verification.external_id(snapshot.params, observed, baseline) or "")
            if found is True and verification.external_id is not None
            else ""
        )
    except Exception as exc:  # the tool author's code: a bug there decides nothing
        found, external_id = None, ""
        problem = f"recognising the effect failed: {type(exc).__name__}: {exc}"
    else:
        problem = ""
    TimelineEvent.append(
        claim.run.pk,
        Verb.SIDE_EFFECT_VERIFIED,
        {
            "key": key,
            "found": found,
            "by": verification.description or f"a read for {tool.name}",
            "observed_digest": digest(observed),
            **({"external_id": external_id[:255]} if external_id else {}),
            **({"problem": problem} if problem else {}),
        },
    )
    if found is True:
        proof = {"verified_by": verification.description or "read", "observed": observed}
        return _found(effect, Receipt(external_id, proof), "verification")
    if found is False:
        return _not_found(claim, tool, effect, "verification", in_flight=not answered)
    return None


def _not_answered(claim: Claim, verb: str, key: str, exc: ToolError) -> Verdict | None:
    """The system could not be asked (a lookup or a verification read failed): no evidence
    either way. Asked again later, a bounded number of times, before a person is."""
    TimelineEvent.append(claim.run.pk, verb, {"key": key, "error": exc.message})
    if exc.failure_class in (FailureClass.TRANSIENT, FailureClass.OUTAGE) and (
        claim.step.attempts < RECHECK_ATTEMPTS
    ):
        return Verdict.RECHECK
    return None


def _found(effect: SideEffect, receipt: Receipt, by: str) -> Verdict:
    """The system shows the effect: the receipt is recorded, confirmed `by` the way it was
    asked."""
    _settle(effect, lambda: effect.commit(receipt, confirmed_by=by))
    if effect.status in (SideEffect.Status.COMMITTED, SideEffect.Status.COMPENSATED):
        return Verdict.COMMITTED
    return Verdict.UNKNOWN  # the ledger and the system disagree: a person decides


def _not_found(claim: Claim, tool: Tool, effect: SideEffect, by: str, *, in_flight=True):
    """The system shows no effect. While the request may still be in flight (inside the settle
    window, unless the system answered it) that is not yet proof: asked again later."""
    if in_flight and timezone.now() < effect.attempted_at + settle_window(claim, tool):
        return Verdict.RECHECK
    _settle(effect, lambda: effect.mark_not_committed(confirmed_by=by))
    if effect.status == SideEffect.Status.COMMITTED:  # its receipt came in meanwhile
        return Verdict.COMMITTED
    return Verdict.RESEND


def _settle(effect: SideEffect, change) -> None:
    """A change of the ledger row that someone else may have made first (a woken worker's
    receipt racing this reconciliation): then the row is read again and stands as it is."""
    try:
        change()
    except TransitionError:
        effect.refresh_from_db()


def recheck(claim: Claim, tool: Tool, effect: SideEffect) -> Recheck:
    """Nothing found by key yet, inside the settle window, or the system could not be asked:
    never resend now (the first request may still land); ask again later — once the window has
    passed, and with a growing pause while the system does not answer."""
    backoff = timedelta(seconds=min(60, 2 ** max(claim.step.attempts - 1, 0)))
    at = max(effect.attempted_at + settle_window(claim, tool), timezone.now() + backoff)
    return Recheck(
        at,
        f"{tool.name} has no record of key {effect.idempotency_key} yet; the request may still "
        f"be in flight, so it is asked again at {at:%H:%M:%S} before anything is resent.",
    )


def unknown_outcome(tool: Tool, effect: SideEffect, error: str) -> UnknownOutcome:
    if tool.verification is not None:
        why = "its verification read could not tell whether it did, and it does not dedupe"
    else:
        why = "it cannot be asked by key, has no verification read and does not dedupe"
    return UnknownOutcome(
        f"{error}. {tool.name} may or may not have done this; {why}, so a person must check "
        f"(idempotency key {effect.idempotency_key})."
    )

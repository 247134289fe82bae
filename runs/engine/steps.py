"""Executing one claimed step, outside any transaction (a tool call never holds a lock): one
executor per step kind, each returning an Outcome for runs.engine.record."""

from __future__ import annotations

from contextlib import nullcontext
from datetime import timedelta

from django.utils import timezone

from runs import hooks
from runs import tools as tool_registry
from runs.engine.calls import build_params, check_scope, connection_released, invoke
from runs.engine.claim import UNCHECKED, Claim
from runs.engine.ledger import execute_side_effect
from runs.engine.outcomes import (
    AskApproval,
    Failed,
    HeldByPause,
    Outcome,
    Park,
    Succeeded,
)
from runs.engine.pauses import end_pause_hold
from runs.engine.routing import degrade_route
from runs.models import FailureClass, StepKind, Wait, read_record, to_json_value
from runs.people import Approval, people
from runs.tools import Tool, ToolError


def execute(claim: Claim) -> Outcome:
    """Run the claimed step and say what it produced; a tool error is a classified failure.
    Tracers (runs.hooks) see each execution as a "step"."""
    if claim.ahead is not None:  # it ran before its claim committed (runs.engine.inline)
        return claim.ahead
    if hooks.tracers:
        return hooks.traced("step", claim, lambda: _execute(claim))
    return _execute(claim)


def _execute(claim: Claim) -> Outcome:
    kind = claim.step.kind
    try:
        if kind in (StepKind.READ, StepKind.SIDE_EFFECT):
            tool = tool_registry.get(claim.definition.tool)
            held = held_by_pause(claim, tool.name)
            if held is not None:
                return held
            if kind == StepKind.READ:
                return execute_read(claim, tool)
            return execute_side_effect(claim, tool)
        executor = EXECUTORS.get(kind)
        if executor is None:
            return Failed(FailureClass.INVALID_INPUT, f"unknown step kind {kind!r}")
        return executor(claim)
    except ToolError as exc:
        return Failed(exc.failure_class, exc.message)
    except tool_registry.UnknownTool as exc:
        return Failed(FailureClass.INVALID_INPUT, str(exc))


def held_by_pause(claim: Claim, tool_name: str) -> HeldByPause | None:
    """Never call a paused tool: the step waits for an admin to resume it.

    One query on the partial unique index of open pauses per tool call, rather than a cache: a
    pause must hold from the moment it commits, in every worker, and the lookup costs far less
    than the call it guards. Checked before the snapshot and intent are written, so a held side
    effect leaves nothing half-done (and no lookup-by-key call is made either).
    """
    pause = claim.pause if claim.pause is not UNCHECKED else people().pause_of(tool_name)
    if pause is None:
        if claim.step.routing.get("paused_tool"):
            end_pause_hold(claim.run, claim.step)
        return None
    return HeldByPause(tool_name, pause.pk, pause.reason[:500])


def execute_compute(claim: Claim) -> Outcome:
    waits = connection_released() if claim.definition.waits else nullcontext()
    try:
        with waits:
            value = claim.definition.fn(claim.ctx)
        return Succeeded(to_json_value(value))
    except ToolError:
        raise
    except Exception as exc:
        return Failed(FailureClass.INVALID_INPUT, f"{type(exc).__name__}: {exc}")


def execute_read(claim: Claim, tool: Tool) -> Outcome:
    if tool.side_effect:  # e.g. an admin decided that this tool changes things after all
        raise ToolError(
            FailureClass.INVALID_INPUT,
            f"{tool.name} is a side-effect tool: a read step cannot call it (no snapshot, no "
            "key); make the step a side effect",
        )
    params = build_params(claim, tool)
    check_scope(claim, tool)
    try:
        result = invoke(claim, tool, params)
        tool.check_read(result.response)  # empty_result / api_drift for an unusable answer
    except ToolError as exc:
        return degrade_or_fail(claim, tool, params, exc)
    response = to_json_value(result.response)
    return Succeeded(response, read=read_record(params, response))


def degrade_or_fail(claim: Claim, tool: Tool, params: dict, exc: ToolError) -> Outcome:
    """A read failed: when routing says degrade, call the fallback right away (the same
    parameters); otherwise the failure is recorded and routed as any other."""
    route = degrade_route(claim, tool, exc.failure_class)
    if route is None:
        return Failed(exc.failure_class, exc.message)
    if route.fallback is None:
        return Failed(exc.failure_class, f"{exc.message}; {route.why_not}")
    fallback, rule = route.fallback, route.rule
    try:
        result = invoke(claim, fallback, params)
    except ToolError as fallback_exc:
        return Failed(
            fallback_exc.failure_class,
            f"{exc.message}; fallback {fallback.name} failed too: {fallback_exc.message}",
        )
    degraded = {"degraded": True, "fallback_tool": fallback.name, "response": result.response}
    details = {
        "rule": rule.describe(),
        "failure_class": exc.failure_class,
        "error": exc.message[:500],
        "original_tool": tool.name,
        "fallback_tool": fallback.name,
    }
    degraded = to_json_value(degraded)
    return Succeeded(
        degraded,
        degraded=(exc.failure_class, exc.message),
        read=read_record(params, degraded),
        degraded_details=details,
    )


def execute_approval(claim: Claim) -> Outcome:
    definition = claim.definition
    params = build_params(claim, None)
    if definition.when is not None and not definition.when(claim.ctx):
        return Succeeded({"decision": "not_required", "params": params})
    reason = definition.reason(claim.ctx) if callable(definition.reason) else definition.reason
    tool = tool_registry.get(definition.tool) if definition.tool else None
    risk = tool.risk if tool is not None else "medium"
    # The rule for this approval (matched on the tool's risk too, so a "high risk" rule can ask
    # for two approvers): its SLA. How many people must approve is the gate's answer for these
    # parameters (runs.engine.gate), which the call meets again with the parameters it sends.
    rule = people().rule_for(
        workflow=claim.run.workflow,
        step=claim.step.name,
        tool=definition.tool,
        failure_class="",
        risk=risk,
    )
    sla = definition.sla or (timedelta(seconds=rule.approval_sla_seconds) if rule else None)
    approvers = rule.approvers_for(params, tool) if rule else 1
    because: tuple = ()
    if tool is not None:
        need = people().requirement(
            workflow=claim.run.workflow,
            step=claim.step.name,
            tool=tool,
            params=params,
            declared=claim.step.name,
        )
        approvers, because = need.approvers, need.rules
    return AskApproval(
        Approval(
            queue=definition.queue,
            reason=reason or f"Approval needed for {claim.step.name}",
            risk=risk,
            tool=definition.tool,
            proposed_params=params,
            due_at=timezone.now() + sla if sla else None,
            approvals_required=max(1, approvers),
            because=because,
        )
    )


def execute_wait_event(claim: Claim) -> Outcome:
    definition = claim.definition
    try:
        correlation = str(definition.correlation(claim.ctx))
    except Exception as exc:
        return Failed(FailureClass.INVALID_INPUT, f"correlation key: {exc}")
    due = timezone.now() + definition.timeout if definition.timeout else None
    return Park(Wait.Kind.EVENT, due, event_type=definition.event_type, correlation_key=correlation)


def execute_wait_timer(claim: Claim) -> Outcome:
    delay = claim.definition.delay
    delay = delay(claim.ctx) if callable(delay) else delay
    return Park(Wait.Kind.TIMER, timezone.now() + delay)


EXECUTORS = {
    StepKind.COMPUTE: execute_compute,
    StepKind.APPROVAL: execute_approval,
    StepKind.WAIT_EVENT: execute_wait_event,
    StepKind.WAIT_TIMER: execute_wait_timer,
}

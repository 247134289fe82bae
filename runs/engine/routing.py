"""Failure routing: the one place that decides what a failure leads to.

Three kinds of failure come here: a step's attempt that failed (`ATTEMPT`), a wait that reached
its deadline undecided (`TIMEOUT`), and a person's SLA that ran out (`SLA`, decided here and
carried out by approvals.sla, which also moves queues). Each is routed by the first matching
escalation rule (read at routing time, so an admin's edit routes the next failure):

- retry: back off with jitter until the rule's attempts are spent, then escalate;
- wait: probe the tool until the rule's wait window closes, then escalate;
- degrade: a failed read or a refused side effect switches to its tool's fallback before it is
  recorded; `degrade_route` decides whether it does (the rule, and whether the fallback may be
  called), and the executors (runs.engine.steps, runs.engine.ledger) only carry that out. A
  degrade that comes to `route_failure` could not apply (no usable fallback, failed too, or an
  unknown outcome): escalate, saying why;
- compensate: undo the run's committed side effects;
- escalate: a person's queue, with the rule's SLA;
- fail: the run fails.

Retry and wait apply to attempts only (a deadline that passed cannot be waited out); an unknown
outcome only ever goes to a person (failing or compensating it would guess). Every decision is
a timeline event naming the rule and its version.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from django.utils import timezone

from runs import tools as tool_registry
from runs.engine.compensation import begin_compensation
from runs.engine.dispatch import enqueue
from runs.engine.outcomes import HeldByPause
from runs.engine.pauses import hold_for_pause
from runs.models import FailureClass, RouteAction, Run, Step, TimelineEvent, Wait
from runs.people import Rule, first_matching, people
from runs.verbs import Verb

A = RouteAction
# Where a failure no rule routes goes: the people who look at runs.
DEFAULT_QUEUE = "support"


class Origin(StrEnum):
    ATTEMPT = "attempt"
    TIMEOUT = "timeout"
    SLA = "sla"


@dataclass(frozen=True)
class Route:
    action: str
    rule: Rule | None
    queue: str
    routing: dict  # what the timeline records: the rule (id, version, name, action) and class

    def person_due(self) -> datetime | None:
        """When a person must have handled what this route hands them (the rule's SLA; none
        when 0): past it, the sweeper escalates the run (approvals.sla)."""
        if self.rule is None or not self.rule.approval_sla_seconds:
            return None
        return timezone.now() + timedelta(seconds=self.rule.approval_sla_seconds)


def tool_risk(tool_name: str) -> str:
    if not tool_name:
        return ""
    try:
        return tool_registry.get(tool_name).risk
    except tool_registry.UnknownTool:
        return ""


def decide(
    rules: Iterable[Rule] | None,
    *,
    workflow: str,
    step: str,
    tool: str,
    failure_class: str,
    risk: str,
    origin=Origin.ATTEMPT,
    has_step: bool = True,
    unknown_outcome: bool = False,
) -> tuple[Rule | None, str]:
    """The matching rule and the action it leads to, narrowed to what applies: the one
    definition of routing. `rules` None reads the rules in force (people().rule_for); a list
    (in routing order, enabled only) tests a rule set that is not saved (approvals.rules_history).
    """
    match = {
        "workflow": workflow,
        "step": step,
        "tool": tool,
        "failure_class": failure_class,
        "risk": risk,
    }
    rule = people().rule_for(**match) if rules is None else first_matching(rules, **match)
    action = rule.action if rule else A.ESCALATE
    if origin != Origin.ATTEMPT and action in (A.RETRY, A.WAIT, A.DEGRADE):
        action = A.ESCALATE
    guessing = failure_class == FailureClass.UNKNOWN_OUTCOME or unknown_outcome
    if guessing or (not has_step and action in (A.FAIL, A.COMPENSATE)):
        action = A.ESCALATE
    return rule, action


def choose(
    run: Run,
    step: Step | None,
    failure_class: str,
    *,
    tool: str = "",
    origin=Origin.ATTEMPT,
    risk: str | None = None,
) -> Route:
    """The route of one failure: the first matching rule's action, narrowed to what applies."""
    tool = tool or (step.tool if step is not None else "")
    rule, action = decide(
        None,
        workflow=run.workflow,
        step=step.name if step is not None else "",
        tool=tool,
        failure_class=failure_class,
        risk=tool_risk(tool) if risk is None else risk,
        origin=origin,
        has_step=step is not None,
        unknown_outcome=step is not None and step.status == Step.Status.UNKNOWN_OUTCOME,
    )
    described = rule.describe() if rule else {"rule": "(no rule matched)"}
    return Route(
        action=action,
        rule=rule,
        queue=(rule.queue if rule else "") or DEFAULT_QUEUE,
        routing={**described, "failure_class": failure_class},
    )


def route_failure(
    run: Run,
    step: Step,
    failure_class: str,
    error: str,
    *,
    held_by: str | None = None,
    tool: str = "",
    origin: Origin = Origin.ATTEMPT,
) -> bool:
    """Apply the route of a failed attempt or a timed-out wait. Returns True when the run has
    work for a worker right away (compensation)."""
    route = choose(run, step, failure_class, tool=tool, origin=origin)
    reason = error
    if route.action == A.RETRY:
        if step.attempts < route.rule.max_attempts:
            _retry(run, step, route, failure_class, error, held_by)
            return False
        reason = f"Gave up after {step.attempts} attempts: {error}"
    elif route.action == A.WAIT:
        reason = _wait_for_tool(run, step, route, failure_class, error, held_by, tool)
        if reason is None:
            return False
    elif route.action == A.DEGRADE:
        reason = f"Could not degrade: {error}"
    elif route.action in (A.COMPENSATE, A.FAIL):
        return end_step(run, step, route, failure_class, error, held_by=held_by, origin=origin)
    if failure_class == FailureClass.API_DRIFT and _pause_drifted_tool(
        run, step, route, reason, held_by, tool or step.tool
    ):
        return False
    _escalate(run, step, route, failure_class, reason, held_by)
    return False


def escalate_to_person(
    run: Run, step: Step, failure_class: str, error: str, *, held_by, tool: str, routing: dict
) -> bool:
    """Hand the step to a person whatever the rules' action (a call the engine refused to make,
    e.g. a broken approval condition); the matching rule still picks the queue and the SLA."""
    route = choose(run, step, failure_class, tool=tool)
    route = Route(A.ESCALATE, route.rule, route.queue, {**routing, "failure_class": failure_class})
    _escalate(run, step, route, failure_class, error, held_by)
    return False


def _retry(run, step, route, failure_class, error, held_by) -> None:
    delay = route.rule.backoff(step.attempts)
    step.schedule_retry(
        timezone.now() + delay,
        held_by=held_by,
        failure_class=failure_class,
        error=error,
        routing=route.routing,
    )
    run.count_failure()
    if delay.total_seconds() <= 5:
        enqueue(run.pk, countdown=delay.total_seconds())


def _wait_for_tool(run, step, route, failure_class, error, held_by, tool) -> str | None:
    """Park the step until the tool recovers (the sweeper probes it). Returns None while the
    wait window is open, or the reason to escalate once it has closed."""
    now = timezone.now()
    window = timedelta(seconds=route.rule.wait_window_seconds)
    wait = Wait.objects.filter(
        step=step, kind=Wait.Kind.TOOL_RECOVERY, status=Wait.Status.PENDING
    ).first() or Wait.open(step, Wait.Kind.TOOL_RECOVERY, event_type=tool, due_at=now + window)
    if now >= wait.due_at:
        wait.expire()
        return (
            f"{tool} was still failing when its wait window of "
            f"{route.rule.wait_window_seconds}s closed: {error}"
        )
    probe_at = min(now + timedelta(seconds=route.rule.probe_interval_seconds), wait.due_at)
    step.wait_for_tool(
        probe_at,
        window_ends=wait.due_at,
        held_by=held_by,
        failure_class=failure_class,
        error=error,
        routing=route.routing,
    )
    run.count_failure()
    run.wait(f"waiting for {tool} to recover")
    return None


def _pause_drifted_tool(run, step, route, error, held_by, tool) -> bool:
    """The tool's API drifted: every call will fail the same way until its adapter is fixed, so
    pause the tool (the steps of every run that call it wait, none calls it) and tell the
    admins, instead of sending each run to a person. Returns False when no tool can be paused
    (the core alone): the failure is escalated as usual.

    1. Open the tool's pause on TaskPilots' behalf, or find the one open.
    2. A new pause writes `tool.paused` on this run's timeline (it notifies the admins:
       approvals.notifications).
    3. The step is held by the pause (`step.tool_paused` names it and the drift); an admin's
       resume wakes it and it calls the tool again.
    """
    if not tool:
        return False
    opened = people().pause_for_drift(tool, f"API drift: {error}"[:2000])
    if opened is None:
        return False
    pause, created = opened
    if created:
        TimelineEvent.append(
            run.pk,
            Verb.TOOL_PAUSED,
            {
                "tool": tool,
                "pause": pause.pk,
                "reason": pause.reason[:500],
                "failure_class": FailureClass.API_DRIFT,
                "step": step.name,
                "queue": route.queue,
                "routing": route.routing,
            },
        )
    run.count_failure()
    failure = {"failure_class": FailureClass.API_DRIFT, "error": error, "routing": route.routing}
    held = HeldByPause(tool, pause.pk, pause.reason[:500])
    hold_for_pause(run, step, held, held_by=held_by, failure=failure)
    return True


def _escalate(run, step, route, failure_class, reason, held_by) -> None:
    if failure_class == FailureClass.UNKNOWN_OUTCOME:
        step.mark_unknown_outcome(held_by=held_by, error=reason, routing=route.routing)
    else:
        step.escalate(
            failure_class=failure_class, error=reason, routing=route.routing, held_by=held_by
        )
    if failure_class != FailureClass.UNKNOWN_OUTCOME:
        # An unknown outcome's failed call was counted where it failed (the ledger, or the
        # claim whose worker died in it): one call, one failure.
        run.count_failure(escalate=True)
    run.ask_human(
        reason[:2000],
        queue=route.queue,
        failure_class=failure_class,
        due_at=route.person_due(),
    )


def end_step(
    run, step, route, failure_class, reason, *, held_by=None, origin=Origin.ATTEMPT
) -> bool:
    """The rule fails the run or undoes its side effects: the step fails first. Returns True
    when compensation has work for a worker."""
    step.fail(failure_class=failure_class, error=reason, routing=route.routing, held_by=held_by)
    run.count_failure()
    attempt = origin == Origin.ATTEMPT
    if route.action == A.FAIL:
        run.fail(f"{step.name}: {reason}" if attempt else reason)
        return False
    rule = route.routing.get("rule")
    begin_compensation(
        run,
        f"{step.name} failed ({failure_class}); rule {rule!r} compensates" if attempt else reason,
    )
    return True


def match_rule(run: Run, step: Step, failure_class: str, tool: str = "") -> Rule | None:
    """The rule that would route this failure."""
    return choose(run, step, failure_class, tool=tool).rule


@dataclass(frozen=True)
class Degrade:
    """A failed call whose rule says degrade: the fallback tool to call instead (the same
    parameters), or, when it may not be called, why not (the step then fails with that)."""

    rule: Rule
    fallback: tool_registry.Tool | None
    why_not: str = ""


def degrade_route(claim, tool: tool_registry.Tool, failure_class: str) -> Degrade | None:
    """Whether a failed call of `tool` degrades, decided before anything is recorded: None when
    its rule says something else (the failure is routed as any other, by `route_failure`). An
    unknown outcome never comes here: it is reconciled or goes to a person (both could land)."""
    rule = match_rule(claim.run, claim.step, failure_class, tool.name)
    if rule is None or rule.action != RouteAction.DEGRADE:
        return None
    fallback, why_not = _usable_fallback(claim, tool)
    return Degrade(rule, fallback, why_not)


def _usable_fallback(claim, tool: tool_registry.Tool) -> tuple[tool_registry.Tool | None, str]:
    """The tool's fallback when this step may call it: registered, of the same kind (a write's
    fallback writes, under its own snapshot and key; a read's only reads), not paused, and
    within the run's scopes."""
    from runs.engine.calls import check_scope

    name = tool.fallback_tool
    if not name:
        return None, f"the rule says degrade, but {tool.name} has no fallback tool"
    try:
        fallback = tool_registry.get(name)
    except tool_registry.UnknownTool:
        return None, f"its fallback tool {name} is not registered"
    if tool.side_effect and not fallback.side_effect:
        return None, f"its fallback {name} is not a side-effect tool, so it cannot do this write"
    if not tool.side_effect and fallback.side_effect:
        return None, f"its fallback {name} is a side-effect tool, which a read may not call"
    if people().pause_of(name) is not None:
        return None, f"its fallback {name} is paused by an admin"
    try:
        check_scope(claim, fallback)
    except tool_registry.ToolError as exc:
        return None, f"its fallback {name} cannot be called: {exc.message}"
    return fallback, ""

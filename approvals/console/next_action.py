"""The sentences on a run's page: the suggested next action (from the failure class and the
rule that routed it), how the run ended, what happens next, what a conflict means.

The code here decides which sentence and with which values; the sentences' text is in
templates/console/sentences/next_action.html, one partial each (`sentence`)."""

from __future__ import annotations

from django.utils.safestring import SafeString

from approvals.console.context import RunContext
from approvals.console.labels import engine_text, sentence, sentences
from approvals.models import (
    ApprovalRequest,
    DecisionVerb,
    HumanDecision,
)
from runs.engine import BY_HAND_QUEUE
from runs.models import (
    FailureClass,
    Run,
    SideEffect,
    Step,
)


def _sentence(name: str, **values) -> SafeString:
    """The partial `name` of templates/console/sentences/next_action.html."""
    return sentence(f"next_action.html#{name}", **values)


# --------------------------------------------------------------------------------------------
# The suggested next action: one sentence from the failure class and the rule that routed it.

# Systems whose words the unknown-outcome sentence uses (the tool's prefix, `mail.send`); any
# other tool gets `unknown-anywhere`.
_UNKNOWN_BY_SYSTEM = {
    "mail": "unknown-mail",
    "crm": "unknown-crm",
    "payments": "unknown-payments",
    "tickets": "unknown-tickets",
}


def suggest_next_action(ctx: RunContext) -> SafeString:
    run = ctx.run
    if run.is_terminal:
        return how_it_ended(ctx)
    if run.status == Run.Status.TAKEN_OVER and run.owner is not None:
        return _taken_over(ctx)
    return _step_suggestion(ctx)


def _taken_over(ctx: RunContext) -> SafeString:
    """A taken-over run stays with its owner until released, whatever they do on it."""
    run, step = ctx.run, ctx.current
    viewer_id = getattr(ctx.viewer, "pk", None)
    if run.owner_id != viewer_id:
        return _sentence("taken-over-by-other", owner=run.owner.get_username())
    if step is not None and step.status in (Step.Status.NEEDS_HUMAN, Step.Status.UNKNOWN_OUTCOME):
        return _sentence("taken-over-waiting", suggestion=_step_suggestion(ctx))
    following = step.name if step is not None else _next_declared(ctx)
    if following:
        return _sentence("taken-over-idle", step=following)
    return _sentence("taken-over-done")


def _stepless_suggestion(ctx: RunContext) -> SafeString:
    """A run with no step left that still waits for a person: its compensation finished, and
    what nothing could undo waits for someone to undo by hand."""
    run = ctx.run
    if run.status != Run.Status.NEEDS_HUMAN:
        return _sentence("no-step")
    if not ctx.by_hand:
        return _sentence("no-step-cancel")
    listed = ", ".join(f"{e.tool} ({e.external_id or e.idempotency_key})" for e in ctx.by_hand)
    return _sentence("undo-by-hand", effects=listed, queue=run.queue or BY_HAND_QUEUE)


def _next_declared(ctx: RunContext) -> str:
    return next((item.name for item in ctx.timeline if item.step is None), "")


def _step_suggestion(ctx: RunContext) -> SafeString:
    run, step = ctx.run, ctx.current
    if run.status == Run.Status.COMPENSATING:
        return _sentence("compensating")
    if run.status in (Run.Status.PENDING, Run.Status.RUNNING):
        return _sentence("moving")
    if step is None:
        return _stepless_suggestion(ctx)
    tool = (ctx.pending.tool if ctx.pending else "") or step.tool or step.name
    if ctx.approval is not None:
        return _approval_suggestion(ctx, tool)
    if (
        step.status == Step.Status.UNKNOWN_OUTCOME
        or ctx.failure_class == FailureClass.UNKNOWN_OUTCOME
    ):
        return _unknown_outcome_suggestion(ctx, step, tool)
    if step.kind in ("wait_event", "wait_timer") and step.status == Step.Status.WAITING:
        return _wait_suggestion(ctx, step)
    if step.status in (Step.Status.WAITING, Step.Status.RETRY_SCHEDULED):
        return _sentence("waiting-for-tool", tool=tool)
    return _failure_suggestion(ctx, step, tool)


def _approval_suggestion(ctx: RunContext, tool: str) -> SafeString:
    approval = ctx.approval
    if approval is not None and approval.approvals_required > 1:
        return _two_person_suggestion(ctx, approval, tool)
    if not ctx.to_compensate:
        return _sentence("approve", tool=tool)
    return _sentence("approve-or-undo", tool=tool, count=len(ctx.to_compensate))


def _two_person_suggestion(ctx: RunContext, approval: ApprovalRequest, tool: str) -> SafeString:
    """What the suggestion says on a two-person request, to the person reading it."""
    if "approve" not in ctx.actions and ctx.can_act:
        viewer = getattr(ctx.viewer, "pk", None)
        if viewer is not None and approval.first_approved_by_id == viewer:
            return _sentence("you-approved", tool=tool)
        return _sentence("needs-two-others", tool=tool)
    if approval.awaits_second:
        return _sentence(
            "second-approval", who=approval.first_approved_by.get_username(), tool=tool
        )
    return _sentence("first-approval", tool=tool)


def _unknown_outcome_suggestion(ctx: RunContext, step: Step, tool: str) -> SafeString:
    """Where to look, in the words of the system the call went to."""
    if ctx.changed:
        return _sentence(
            "changed-record",
            tool=tool,
            key=ctx.changed["key"],
            ref=ctx.changed["external_id"] or "—",
        )
    key = (ctx.pending.idempotency_key if ctx.pending else "") or step.idempotency_key
    target = (ctx.pending.target if ctx.pending else "") or tool
    name = _UNKNOWN_BY_SYSTEM.get(tool.split(".")[0], "unknown-anywhere")
    return _sentence(name, tool=tool, target=target, key=key)


def _wait_suggestion(ctx: RunContext, step: Step) -> SafeString:
    """A timer or an awaited event: the run goes on by itself."""
    due = ctx.wait.due_at if ctx.wait else None
    if step.kind == "wait_timer":
        return _sentence("wait-timer", due=due)
    event = (ctx.wait.event_type if ctx.wait else "") or step.name
    if due:
        return _sentence("wait-event-until", event=event, due=due)
    return _sentence("wait-event", event=event)


# What to do about a step that failed, by its failure class (values: tool, rule).
_FAILURE_ADVICE = {
    FailureClass.OUTAGE: "advice-outage",
    FailureClass.INVALID_INPUT: "advice-invalid-input",
    FailureClass.PERMISSION: "advice-permission",
    FailureClass.EMPTY_RESULT: "advice-empty-result",
    FailureClass.API_DRIFT: "advice-api-drift",
    FailureClass.TIMEOUT: "advice-timeout",
}


def _failure_suggestion(ctx: RunContext, step: Step, tool: str) -> SafeString:
    if ctx.failure_class == FailureClass.TRANSIENT:
        return _sentence("kept-failing", tool=tool, attempts=step.attempts)
    advice = _FAILURE_ADVICE.get(ctx.failure_class)
    if advice is None:
        return _sentence("read-the-error")
    return _sentence(advice, tool=tool, rule=ctx.routing.get("rule") or "")


def how_it_ended(ctx: RunContext) -> SafeString:
    """A finished run: nothing left to do, and how it ended (who ended it, when, and what
    became of its side effects)."""
    run = ctx.run
    ended = run.finished_at or run.updated_at
    if run.status == Run.Status.SUCCEEDED:
        return _ended_succeeded(ctx, ended)
    if run.status == Run.Status.COMPENSATED:
        return _sentence("undone", ended=ended, n=_done_effects(ctx, SideEffect.Status.COMPENSATED))
    if run.status == Run.Status.FAILED:
        if run.attention_reason:
            return _sentence(
                "failed-because", ended=ended, reason=engine_text(run.attention_reason)
            )
        return _sentence("failed", ended=ended)
    return _ended_cancelled(ctx, ended)


def _done_effects(ctx: RunContext, status: str) -> int:
    return sum(1 for effect in ctx.effects if effect.status == status)


def _ended_succeeded(ctx: RunContext, ended) -> SafeString:
    succeeded = _sentence("succeeded", ended=ended)
    committed = _done_effects(ctx, SideEffect.Status.COMMITTED)
    if not committed:
        return succeeded
    return sentences(succeeded, _sentence("receipts", n=committed))


def _ended_cancelled(ctx: RunContext, ended) -> SafeString:
    """Who cancelled it, and what became of the side effects already done (they stay)."""
    committed = _done_effects(ctx, SideEffect.Status.COMMITTED)
    if not committed:
        return sentences(_who_cancelled(ctx, ended), _sentence("nothing-was-done"))
    return sentences(_who_cancelled(ctx, ended), _sentence("stays-done", n=committed))


def _who_cancelled(ctx: RunContext, ended) -> SafeString:
    """A person (a rejection or a cancel), or the API."""
    ended_by = next(
        (d for d in ctx.decisions if d.verb in (DecisionVerb.REJECT, DecisionVerb.CANCEL)), None
    )
    if ended_by is None:
        return _sentence("cancelled", ended=ended, reason=engine_text(ctx.run.attention_reason))
    user, at = ended_by.user.get_username(), ended_by.created_at
    if ended_by.verb == DecisionVerb.REJECT:
        return _sentence("rejected-by", user=user, ended=at)
    return _sentence("cancelled-by", user=user, ended=at, reason=ended_by.comment)


# What the actions panel says when there is nothing to do, by the run's status.
_IDLE = {
    Run.Status.SUCCEEDED: "idle-succeeded",
    Run.Status.FAILED: "idle-failed",
    Run.Status.CANCELLED: "idle-cancelled",
    Run.Status.COMPENSATED: "idle-compensated",
    Run.Status.COMPENSATING: "idle-compensating",
    Run.Status.PENDING: "idle-running",
    Run.Status.RUNNING: "idle-running",
    Run.Status.WAITING: "idle-waiting",
}


def idle_sentence(ctx: RunContext) -> SafeString:
    """What the actions panel says when there is nothing to do: why, for this state."""
    return _sentence(_IDLE.get(ctx.run.status, "idle"))


def what_happens_next(run: Run, user) -> SafeString:
    """After a person's action, what the run does now, read from its state (never assumed):
    a taken-over run stays with its owner; a rejection with nothing done undoes nothing."""
    S = Run.Status
    if run.status == S.TAKEN_OVER:
        if run.owner_id == user.pk:
            return _sentence("next-stays-with-you")
        owner = run.owner.get_username() if run.owner else "?"
        return _sentence("next-stays-with-owner", owner=owner)
    if run.status in (S.PENDING, S.RUNNING):
        return _sentence("next-goes-on")
    if run.status == S.WAITING:
        return _sentence("next-waits")
    if run.status == S.NEEDS_HUMAN:
        return _sentence("next-needs-a-person")
    committed = run.side_effects.filter(status=SideEffect.Status.COMMITTED).count()
    if run.status == S.COMPENSATING:
        return _sentence("next-undoing", n=committed)
    if run.status == S.CANCELLED:
        if committed:
            return _sentence("next-cancelled-stays-done", n=committed)
        return _sentence("next-cancelled")
    return _sentence("next-ended", status=run.status)


def conflict_message(run: Run) -> SafeString:
    """“Already decided by X at T”: the latest human decision, or the run's current state."""
    last = HumanDecision.objects.filter(run=run).select_related("user").order_by("-id").first()
    if last is not None:
        return _sentence(
            "conflict-decided",
            user=last.user.get_username(),
            verb=last.verb,
            decided=last.created_at,
            status=run.status,
        )
    return _sentence("conflict-changed", status=run.status)

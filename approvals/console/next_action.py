"""The sentences on a run's page: the suggested next action (from the failure class and the
rule that routed it), how the run ended, what happens next, what a conflict means."""

from __future__ import annotations

from django.utils.html import escape
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from approvals import viewer_time
from approvals.console.context import RunContext
from approvals.console.labels import (
    RUN_STATUS_LABELS,
    VERB_LABELS,
    engine_text,
    label,
    say,
    sentences,
    shown_when,
)
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

# --------------------------------------------------------------------------------------------
# The suggested next action: one sentence from the failure class and the rule that routed it.

_UNKNOWN_BY_SYSTEM = {
    "mail": gettext_lazy(
        "The mail system may have sent this message. Check the mailbox %(target)s for key "
        "%(key)s; then confirm sent (give the message id) or not sent."
    ),
    "crm": gettext_lazy(
        "The CRM may have created this record. Search %(target)s for key %(key)s; then confirm "
        "it exists (give the record id) or that it does not."
    ),
    "payments": gettext_lazy(
        "The payment system may have moved this money. Look up %(target)s for key %(key)s; then "
        "confirm it happened (give the transaction id) or that it did not."
    ),
    "tickets": gettext_lazy(
        "The helpdesk may have changed this ticket. Open %(target)s and look for key %(key)s; "
        "then confirm it changed or that it did not."
    ),
}


_UNKNOWN_ANYWHERE = gettext_lazy(
    "%(tool)s may or may not have done this. Check %(target)s for key %(key)s; then confirm it "
    "happened (give its reference) or that it did not."
)


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
        return say(
            _(
                "%(owner)s has taken this run over: TaskPilots does not touch it until they (or "
                "an admin) release it."
            ),
            owner=run.owner.get_username(),
        )
    if step is not None and step.status in (Step.Status.NEEDS_HUMAN, Step.Status.UNKNOWN_OUTCOME):
        return say(
            _(
                "%(suggestion)s The run stays with you: TaskPilots goes on only after you "
                "release it."
            ),
            suggestion=_step_suggestion(ctx),
        )
    following = step.name if step is not None else _next_declared(ctx)
    if following:
        return say(
            _(
                "You have taken this run over and nothing is waiting on you: release it and "
                "TaskPilots goes on with %(step)s."
            ),
            step=following,
        )
    return say(
        _("You have taken this run over and nothing is left to do: release it so it can end.")
    )


def _stepless_suggestion(ctx: RunContext) -> SafeString:
    """A run with no step left that still waits for a person: its compensation finished, and
    what nothing could undo waits for someone to undo by hand."""
    run = ctx.run
    if run.status != Run.Status.NEEDS_HUMAN:
        return say(_("No step is waiting; nothing to do."))
    if not ctx.by_hand:
        return say(_("No step is waiting: cancel the run to close it."))
    listed = ", ".join(f"{e.tool} ({e.external_id or e.idempotency_key})" for e in ctx.by_hand)
    return say(
        _(
            "TaskPilots undid what it could, but it cannot undo %(effects)s. The run waits in "
            "the %(queue)s queue for a person: undo them by hand in their systems, then cancel "
            "the run to close it."
        ),
        effects=listed,
        queue=run.queue or BY_HAND_QUEUE,
    )


def _next_declared(ctx: RunContext) -> str:
    return next((item.name for item in ctx.timeline if item.step is None), "")


def _step_suggestion(ctx: RunContext) -> SafeString:
    run, step = ctx.run, ctx.current
    if run.status == Run.Status.COMPENSATING:
        return say(_("TaskPilots is undoing this run's side effects; watch the steps below."))
    if run.status in (Run.Status.PENDING, Run.Status.RUNNING):
        return say(_("The run is moving on its own; nothing to do."))
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
        return say(
            _(
                "TaskPilots is waiting for %(tool)s and will try again by itself; retry now if "
                "you know it is back."
            ),
            tool=tool,
        )
    return _failure_suggestion(ctx, step, tool)


def _approval_suggestion(ctx: RunContext, tool: str) -> SafeString:
    approval = ctx.approval
    if approval is not None and approval.approvals_required > 1:
        return _two_person_suggestion(ctx, approval, tool)
    if not ctx.to_compensate:
        return say(
            _(
                "Check the proposed %(tool)s call below, then approve it, approve it with "
                "corrected parameters, or reject it."
            ),
            tool=tool,
        )
    return say(
        ngettext(
            "Check the proposed %(tool)s call below, then approve it, approve it with "
            "corrected parameters, or reject it (rejecting undoes %(count)s earlier side "
            "effect).",
            "Check the proposed %(tool)s call below, then approve it, approve it with "
            "corrected parameters, or reject it (rejecting undoes %(count)s earlier side "
            "effects).",
            len(ctx.to_compensate),
        ),
        tool=tool,
        count=len(ctx.to_compensate),
    )


def _two_person_suggestion(ctx: RunContext, approval: ApprovalRequest, tool: str) -> SafeString:
    """What the suggestion says on a two-person request, to the person reading it."""
    if "approve" not in ctx.actions and ctx.can_act:
        viewer = getattr(ctx.viewer, "pk", None)
        if viewer is not None and approval.first_approved_by_id == viewer:
            return say(
                _("You approved this %(tool)s call; wait for a second person to approve it."),
                tool=tool,
            )
        return say(
            _(
                "This %(tool)s call needs two people other than you; ask two colleagues to "
                "approve it."
            ),
            tool=tool,
        )
    if approval.awaits_second:
        return say(
            _(
                "%(who)s approved this %(tool)s call. Check it below, then approve it as it is "
                "(the second of two approvals) or reject it."
            ),
            who=approval.first_approved_by.get_username(),
            tool=tool,
        )
    return say(
        _(
            "Check the proposed %(tool)s call below, then approve it (the first of two "
            "approvals), approve it with corrected parameters, or reject it."
        ),
        tool=tool,
    )


def _unknown_outcome_suggestion(ctx: RunContext, step: Step, tool: str) -> SafeString:
    """Where to look, in the words of the system the call went to."""
    if ctx.changed:
        return say(
            _(
                "%(tool)s has a record for key %(key)s, but not the one this call asked for "
                "(compared below). Accept the new result (confirm it happened with reference "
                "%(ref)s), treat it as not done (sent again with the same key), or take the run "
                "over."
            ),
            tool=tool,
            key=ctx.changed["key"],
            ref=ctx.changed["external_id"] or "—",
        )
    key = (ctx.pending.idempotency_key if ctx.pending else "") or step.idempotency_key
    target = (ctx.pending.target if ctx.pending else "") or tool
    template = _UNKNOWN_BY_SYSTEM.get(tool.split(".")[0], _UNKNOWN_ANYWHERE)
    return say(template, tool=tool, target=target, key=key)


def _wait_suggestion(ctx: RunContext, step: Step) -> SafeString:
    """A timer or an awaited event: the run goes on by itself."""
    due = ctx.wait.due_at if ctx.wait else None
    if step.kind == "wait_timer":
        return say(
            _("The run waits until %(due)s and goes on by itself; nothing to do."),
            due=shown_when(due),
        )
    event = (ctx.wait.event_type if ctx.wait else "") or step.name
    if due:
        return say(
            _(
                "The run waits for the event %(event)s (until %(due)s) and goes on by itself "
                "when it comes; nothing to do."
            ),
            event=event,
            due=shown_when(due),
        )
    return say(
        _("The run waits for the event %(event)s and goes on by itself when it comes."),
        event=event,
    )


# What to do about a step that failed, by its failure class (values: tool, rule).
_FAILURE_ADVICE = {
    FailureClass.OUTAGE: gettext_lazy(
        "%(tool)s stayed down longer than rule “%(rule)s” waits. Check that it is back, then "
        "retry the step now; or do the work by hand and mark the step done."
    ),
    FailureClass.INVALID_INPUT: gettext_lazy(
        "%(tool)s rejected the data it was given. Correct the parameters and retry, or skip the "
        "step with a reason."
    ),
    FailureClass.PERMISSION: gettext_lazy(
        "TaskPilots may not use %(tool)s. Ask an admin to grant access, then retry; or do it by "
        "hand and mark the step done."
    ),
    FailureClass.EMPTY_RESULT: gettext_lazy(
        "%(tool)s found nothing where the step needs an answer. Check the data it was asked "
        "about; correct the parameters and retry, or do it by hand and mark the step done."
    ),
    FailureClass.API_DRIFT: gettext_lazy(
        "%(tool)s answers in a way TaskPilots was not written for (its API changed). An admin "
        "fixes the tool, then resumes it on the tools page."
    ),
    FailureClass.TIMEOUT: gettext_lazy(
        "The wait ran out with no answer. Check whether it happened; then mark the step done "
        "with its result, or skip it with a reason."
    ),
}


def _failure_suggestion(ctx: RunContext, step: Step, tool: str) -> SafeString:
    if ctx.failure_class == FailureClass.TRANSIENT:
        return say(
            ngettext(
                "%(tool)s kept failing after %(attempts)s attempt. Retry now, or take the run "
                "over and finish the step by hand.",
                "%(tool)s kept failing after %(attempts)s attempts. Retry now, or take the run "
                "over and finish the step by hand.",
                step.attempts,
            ),
            tool=tool,
            attempts=step.attempts,
        )
    advice = _FAILURE_ADVICE.get(ctx.failure_class)
    if advice is None:
        return say(
            _("Read the error below; retry the step, mark it done by hand, or cancel the run.")
        )
    return say(advice, tool=tool, rule=ctx.routing.get("rule") or "")


def how_it_ended(ctx: RunContext) -> SafeString:
    """A finished run: nothing left to do, and how it ended (who ended it, when, and what
    became of its side effects)."""
    run = ctx.run
    when = shown_when(run.finished_at or run.updated_at)
    if run.status == Run.Status.SUCCEEDED:
        return _ended_succeeded(ctx, when)
    if run.status == Run.Status.COMPENSATED:
        return _ended_undone(ctx, when)
    if run.status == Run.Status.FAILED:
        return _ended_failed(run, when)
    return _ended_cancelled(ctx, when)


def _done_effects(ctx: RunContext, status: str) -> int:
    return sum(1 for effect in ctx.effects if effect.status == status)


def _ended_succeeded(ctx: RunContext, when: SafeString) -> SafeString:
    sentence = say(_("Nothing left to do: the run succeeded at %(when)s."), when=when)
    committed = _done_effects(ctx, SideEffect.Status.COMMITTED)
    if not committed:
        return sentence
    receipts = ngettext(
        "It did %(n)s side effect; its receipt is in the steps below.",
        "It did %(n)s side effects; their receipts are in the steps below.",
        committed,
    )
    return sentences(sentence, say(receipts, n=committed))


def _ended_undone(ctx: RunContext, when: SafeString) -> SafeString:
    undone = _done_effects(ctx, SideEffect.Status.COMPENSATED)
    return say(
        ngettext(
            "Nothing left to do: the run was undone at %(when)s (%(n)s side effect compensated).",
            "Nothing left to do: the run was undone at %(when)s (%(n)s side effects compensated).",
            undone,
        ),
        when=when,
        n=undone,
    )


def _ended_failed(run: Run, when: SafeString) -> SafeString:
    if run.attention_reason:
        return say(
            _(
                "Nothing left to do: the run failed at %(when)s: %(reason)s. Start a new run "
                "if the work still needs doing."
            ),
            when=when,
            reason=engine_text(run.attention_reason),
        )
    return say(
        _(
            "Nothing left to do: the run failed at %(when)s. Start a new run if the work still "
            "needs doing."
        ),
        when=when,
    )


def _ended_cancelled(ctx: RunContext, when: SafeString) -> SafeString:
    """Who cancelled it, and what became of the side effects already done (they stay)."""
    committed = _done_effects(ctx, SideEffect.Status.COMMITTED)
    if not committed:
        undone = say(_("Nothing had been done to other systems, so nothing was undone."))
        return sentences(_who_cancelled(ctx, when), undone)
    stays = ngettext(
        "%(n)s side effect done before it stays done.",
        "%(n)s side effects done before it stay done.",
        committed,
    )
    return sentences(_who_cancelled(ctx, when), say(stays, n=committed))


def _who_cancelled(ctx: RunContext, when: SafeString) -> SafeString:
    """A person (a rejection or a cancel), or the API."""
    ended = (DecisionVerb.REJECT, DecisionVerb.CANCEL)
    ended_by = next((d for d in ctx.decisions if d.verb in ended), None)
    if ended_by is None:
        return say(
            _("Nothing left to do: the run was cancelled at %(when)s (%(reason)s)."),
            when=when,
            reason=engine_text(ctx.run.attention_reason) or "—",
        )
    if ended_by.verb == DecisionVerb.REJECT:
        return say(
            _("Nothing left to do: %(user)s rejected it at %(when)s, so the run was cancelled."),
            user=ended_by.user.get_username(),
            when=shown_when(ended_by.created_at),
        )
    return say(
        _("Nothing left to do: %(user)s cancelled the run at %(when)s (“%(reason)s”)."),
        user=ended_by.user.get_username(),
        when=shown_when(ended_by.created_at),
        reason=ended_by.comment,
    )


def idle_sentence(ctx: RunContext) -> SafeString:
    """What the actions panel says when there is nothing to do: why, for this state."""
    S = Run.Status
    status = ctx.run.status
    if status == S.SUCCEEDED:
        return say(_("Nothing left to do: the run succeeded."))
    if status == S.FAILED:
        return say(_("Nothing left to do: the run failed."))
    if status == S.CANCELLED:
        return say(_("Nothing left to do: the run was cancelled."))
    if status == S.COMPENSATED:
        return say(_("Nothing left to do: the run was undone."))
    if status == S.COMPENSATING:
        return say(
            _("Nothing to do: TaskPilots is undoing the run's side effects, then the run ends.")
        )
    if status in (S.PENDING, S.RUNNING):
        return say(_("Nothing to do: TaskPilots is running this run now."))
    if status == S.WAITING:
        return say(_("Nothing to do: the run waits and goes on by itself."))
    return say(_("Nothing to do on this run right now."))


def what_happens_next(run: Run, user) -> SafeString:
    """After a person's action, what the run does now, read from its state (never assumed):
    a taken-over run stays with its owner; a rejection with nothing done undoes nothing."""
    S = Run.Status
    if run.status == S.TAKEN_OVER:
        if run.owner_id == user.pk:
            return say(
                _(
                    "The run stays taken over by you: TaskPilots does nothing more with it until "
                    "you release it."
                )
            )
        return say(
            _(
                "The run stays taken over by %(owner)s: TaskPilots does nothing more with it "
                "until they (or an admin) release it."
            ),
            owner=run.owner.get_username() if run.owner else "?",
        )
    if run.status in (S.PENDING, S.RUNNING):
        return say(_("The run goes on."))
    if run.status == S.WAITING:
        return say(_("The run waits (for an event, a timer or a tool) and goes on by itself."))
    if run.status == S.NEEDS_HUMAN:
        return say(_("The run still needs a person: it is back in the inbox."))
    committed = run.side_effects.filter(status=SideEffect.Status.COMMITTED).count()
    if run.status == S.COMPENSATING:
        return say(
            ngettext(
                "TaskPilots is undoing the %(n)s side effect already done, then the run ends.",
                "TaskPilots is undoing the %(n)s side effects already done, newest first, then "
                "the run ends.",
                committed,
            ),
            n=committed,
        )
    if run.status == S.CANCELLED:
        if committed:
            return say(
                ngettext(
                    "The run is cancelled; the %(n)s side effect already done stays done.",
                    "The run is cancelled; the %(n)s side effects already done stay done.",
                    committed,
                ),
                n=committed,
            )
        return say(
            _(
                "The run is cancelled. Nothing had been done to other systems, so there is "
                "nothing to undo."
            )
        )
    return say(
        _("The run has ended: %(status)s."),
        status=escape(label(RUN_STATUS_LABELS, run.status).lower()),
    )


def conflict_message(run: Run) -> SafeString:
    """“Already decided by X at T”: the latest human decision, or the run's current state."""
    last = HumanDecision.objects.filter(run=run).select_related("user").order_by("-id").first()
    status = escape(label(RUN_STATUS_LABELS, run.status))
    if last is not None:
        return say(
            _(
                "Someone else acted first: %(user)s %(verb)s at %(time)s. The run's status is "
                "now “%(status)s”; here is where it stands."
            ),
            user=last.user.get_username(),
            verb=escape(label(VERB_LABELS, last.verb)),
            time=escape(_format_time(last.created_at)),
            status=status,
        )
    return say(
        _("This run changed since you opened it; its status is now “%(status)s”."), status=status
    )


def _format_time(value) -> str:
    return viewer_time.format_timestamp(value)

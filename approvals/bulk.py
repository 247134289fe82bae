"""Bulk actions: retry, settle, release, reassign or cancel many runs at once, previewed first.

1. `select_runs` turns the console's filters into a queryset of unfinished runs (bad filters
   raise BulkError, nothing is written).
2. `preview` freezes the set: one BulkActionItem per matched run (at most MAX_RUNS) with the
   run's lock_version as shown and what the action will do to it, or why it is skipped (taken
   over by someone else, action not available, no evidence). For unknown outcomes it asks the
   system by key (where the tool can be asked) and keeps what it said as the item's evidence.
3. `execute` (a Celery task, approvals/tasks.py) carries out the pending items in order, each
   in ONE transaction: the item row locked, the single action from approvals/actions.py called
   with the previewed version (a run that changed since is skipped, never overwritten), its
   HumanDecision naming the bulk action, a `bulk_action.applied` timeline event, and the item
   marked. A worker killed midway leaves no run acted on without its item marked, so the task
   can simply run again (acks_late + reject_on_worker_lost, and `resume_stale` from the sweep).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any

from celery import current_app
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import OuterRef, Q, QuerySet, Subquery
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from approvals import acting, actions, console, incidents, live, viewer_time
from approvals.console import awaits_approval
from approvals.models import HumanDecision, known_queues
from approvals.models.bulk import MAX_RUNS, BulkAction, BulkActionItem, BulkItemStatus, BulkVerb
from approvals.permissions import ActionForbidden, can_act, check_may_act, is_admin
from runs import tools as tool_registry
from runs.engine import undoable
from runs.models import FailureClass, Run, SideEffect, Step, TimelineEvent
from runs.tools import CallContext, ToolError
from runs.verbs import Verb

logger = logging.getLogger("taskpilots.console")

FILTERS = (
    "workflow",
    "step",
    "tool",
    "reason",
    "queue",
    "status",
    "owner",
    "date_from",
    "date_to",
    "runs",  # runs picked one by one in a list: their ids, comma-separated
)
# A running job whose worker has not moved it for this long is enqueued again by the sweep.
STALE_SECONDS = 30


class BulkError(ValueError):
    """The filters or the action's parameters are not valid (the message says why). `code` is
    what the API answers with: `invalid`, `unknown_user` when a named person does not exist, or
    `unknown_queue` when a named queue is none of the configured ones (things the schema cannot
    know: people and queues are data)."""

    def __init__(self, message: str, field: str | None = None, code: str = "invalid"):
        super().__init__(message)
        self.field = field
        self.code = code


# --------------------------------------------------------------------------------------------
# Selecting


def clean_filters(raw: dict[str, Any]) -> dict[str, str]:
    """The filters as strings, checked: unknown names, statuses, reasons and dates refused, and
    names holding a character an identifier may not (runs/invisible.py; NUL included)."""
    from runs import invisible

    unknown = sorted(set(raw) - set(FILTERS))
    if unknown:
        raise BulkError(_("Unknown filter: %(name)s.") % {"name": unknown[0]}, unknown[0])
    cleaned = {k: str(v).strip() for k, v in raw.items() if v not in (None, "")}
    status = cleaned.get("status")
    if status and status != "inbox" and (status not in Run.Status.values or status in Run.TERMINAL):
        raise BulkError(
            _("A bulk action acts on unfinished runs only, not on %(s)s.") % {"s": status}, "status"
        )
    reason = cleaned.get("reason")
    if reason and reason != "approval" and reason not in FailureClass.values:
        raise BulkError(_("Unknown failure class: %(r)s.") % {"r": reason}, "reason")
    if cleaned.get("owner") not in (None, "mine", "unassigned", "unclaimed"):
        raise BulkError(_("owner is mine, unassigned or unclaimed."), "owner")
    for name in ("workflow", "step", "tool", "queue"):
        char = invisible.first_forbidden_in_identifier(cleaned.get(name, ""))
        if char is not None:
            raise BulkError(
                _("%(name)s contains %(character)s, an invisible or control character.")
                % {"name": name, "character": invisible.character_name(char)},
                name,
            )
    if "runs" in cleaned:
        cleaned["runs"] = ",".join(_picked_ids(cleaned["runs"]))
    for name in ("date_from", "date_to"):
        if name in cleaned:
            try:
                viewer_time.parse_day(cleaned[name])
            except viewer_time.DayOutOfRange:
                raise BulkError(
                    _("%(name)s: %(day)s is outside the dates runs can be searched by.")
                    % {"name": name, "day": cleaned[name]},
                    name,
                ) from None
            except ValueError:
                raise BulkError(
                    _("%(name)s is not a date (YYYY-MM-DD).") % {"name": name}, name
                ) from None
    return cleaned


def _picked_ids(raw: str) -> list[str]:
    """Run ids picked in a list, each checked, at most MAX_RUNS (nothing is written first)."""
    ids = [part.strip() for part in raw.replace("\n", ",").split(",") if part.strip()]
    if len(ids) > MAX_RUNS:
        raise BulkError(
            _("At most %(n)s runs can be picked for one bulk action.") % {"n": MAX_RUNS}, "runs"
        )
    checked = []
    for value in ids:
        try:
            checked.append(str(uuid.UUID(value)))
        except ValueError:
            raise BulkError(
                _("%(value)s is not a run id.") % {"value": value[:60]}, "runs"
            ) from None
    return list(dict.fromkeys(checked))


def select_runs(user, filters: dict[str, str]) -> QuerySet[Run]:
    """Unfinished runs matching the filters, oldest first, each with its current step's id.
    Every filter is on the run or its current (first unfinished) step."""
    runs = Run.objects.exclude(status__in=Run.TERMINAL)
    if filters.get("runs"):
        runs = runs.filter(pk__in=filters["runs"].split(","))
    if filters.get("status") == "inbox":  # what the inbox lists: runs waiting for a person
        runs = runs.filter(status__in=Run.HUMAN)
    elif filters.get("status"):
        runs = runs.filter(status=filters["status"])
    for name in ("workflow", "queue"):
        if filters.get(name):
            runs = runs.filter(**{name: filters[name]})
    if filters.get("owner") == "mine":
        runs = runs.filter(owner=user)
    elif filters.get("owner") == "unassigned":
        runs = runs.filter(owner__isnull=True)
    elif filters.get("owner") == "unclaimed":
        runs = runs.filter(console.unclaimed())
    runs = viewer_time.filter_days(
        runs,
        date.fromisoformat(filters["date_from"]) if filters.get("date_from") else None,
        date.fromisoformat(filters["date_to"]) if filters.get("date_to") else None,
    )
    current = Step.objects.filter(run=OuterRef("pk"), status__in=Step.UNFINISHED).order_by(
        "position"
    )
    runs = runs.annotate(current_step_id=Subquery(current.values("pk")[:1]))
    steps = Step.objects.filter(pk=OuterRef("current_step_id"))
    if filters.get("step"):
        steps = steps.filter(name=filters["step"])
    if filters.get("tool"):
        steps = steps.filter(tool=filters["tool"])
    reason = filters.get("reason")
    if reason and filters.get("status") == "inbox":
        # From the inbox: the runs its Reason filter lists, and nothing else.
        runs = runs.filter(console.reason_filter(reason, filters.get("tool", "")))
        reason = ""
    if reason == "approval":
        steps = steps.filter(awaits_approval(), status=Step.Status.NEEDS_HUMAN)
    elif reason:
        steps = steps.filter(error_class=reason).exclude(awaits_approval())
    if filters.get("step") or filters.get("tool") or reason:
        runs = runs.filter(current_step_id__in=Subquery(steps.values("pk")))
    return runs.select_related("owner").order_by("created_at", "id")


# --------------------------------------------------------------------------------------------
# Previewing


def clean_params(user, action: str, params: dict[str, Any]) -> dict[str, Any]:
    """What the action needs, checked before anything is written."""
    if action not in BulkVerb.values:
        raise BulkError(_("Unknown bulk action: %(a)s.") % {"a": action}, "action")
    if not can_act(user):
        raise ActionForbidden("user_not_allowed", _("Your role may not act on runs."))
    if action == BulkVerb.CANCEL and not is_admin(user):
        raise ActionForbidden("admin_only", _("Only admins may cancel runs in bulk."))
    comment = str(params.get("comment") or "").strip()
    cleaned: dict[str, Any] = {"comment": comment}
    if (
        action in (BulkVerb.CONFIRM_HAPPENED, BulkVerb.CONFIRM_NOT_HAPPENED, BulkVerb.CANCEL)
        and not comment
    ):
        raise BulkError(_("Say why (a comment is required for this action)."), "comment")
    if action == BulkVerb.RELEASE:
        needed = params.get("needed_engineer")
        if isinstance(needed, str) and needed in ("yes", "no", "true", "false"):
            needed = needed in ("yes", "true")
        if not isinstance(needed, bool):
            raise BulkError(
                _("Say whether these runs needed an engineer (yes or no)."), "needed_engineer"
            )
        cleaned["needed_engineer"] = needed
    if action == BulkVerb.REASSIGN:
        cleaned.update(_reassign_target(params))
    # A soft claim ("I'll handle it") warns the single action and it acts only when told to act
    # anyway; a bulk action skips claimed runs unless it is told the same, up front.
    despite = params.get("despite_claims")
    if isinstance(despite, str):
        despite = despite in ("1", "yes", "true", "on")
    cleaned["despite_claims"] = bool(despite)
    return cleaned


def _reassign_target(params: dict[str, Any]) -> dict[str, str]:
    """Reassign hands runs to a person (`to`: taken-over runs) or to a queue (`to_queue`: runs
    waiting for a person), exactly one of the two."""
    to, queue = str(params.get("to") or "").strip(), str(params.get("to_queue") or "").strip()
    if bool(to) == bool(queue):
        raise BulkError(_("Reassign to a person or to a queue (one of the two)."), "to")
    if queue:
        known = known_queues()
        if queue not in known:
            raise BulkError(
                _("Unknown queue %(q)s: use one of %(known)s.")
                % {"q": queue, "known": ", ".join(known) or "—"},
                "to_queue",
                code="unknown_queue",
            )
        return {"to_queue": queue}
    target = get_user_model().objects.filter(username=to).first()
    if target is None:
        raise BulkError(
            _("No one is called %(name)s: reassign to a person in the support or admin group.")
            % {"name": to},
            "to",
            code="unknown_user",
        )
    if not can_act(target):
        raise BulkError(_("Reassign to a person in the support or admin group."), "to")
    return {"to": target.get_username()}


def preview(
    user,
    action: str,
    filters: dict[str, Any],
    params: dict[str, Any],
    retry_of: BulkAction | None = None,
) -> BulkAction:
    """Freeze the set and what will happen to each run. Raises BulkError / ActionForbidden
    before writing anything."""
    filters = clean_filters(filters)
    params = clean_params(user, action, params)
    runs = list(select_runs(user, filters)[: MAX_RUNS + 1])
    matched = len(runs) if len(runs) <= MAX_RUNS else select_runs(user, filters).count()
    runs = runs[:MAX_RUNS]
    steps = Step.objects.in_bulk([r.current_step_id for r in runs if r.current_step_id])
    effects = _open_effects(steps.values()) if action.startswith("confirm") else {}
    unreachable: dict[str, str] = {}  # systems whose lookup failed: not asked again
    claims = {} if params["despite_claims"] else live.claims_by_run(r.pk for r in runs)
    health = _check_tools(steps.values()) if action == BulkVerb.RETRY else {}
    with transaction.atomic():
        bulk = BulkAction.objects.create(
            action=action,
            user=user,
            filters=filters,
            params=params,
            matched=matched,
            tool_health=health,
            retry_of=retry_of,
        )
        items = []
        for position, run in enumerate(runs):
            step = steps.get(run.current_step_id)
            effect = effects.get(step.pk) if step else None
            plan = Plan(bulk, user, run, step, effect, unreachable, claims.get(run.pk))
            items.append(plan.item(position))
        BulkActionItem.objects.bulk_create(items, batch_size=500)
    return bulk


# What people read for a job's status (the model's choices are plain English, for the admin).
STATUS_LABELS = {
    BulkAction.Status.PREVIEWED: gettext_lazy("previewed, not started"),
    BulkAction.Status.RUNNING: gettext_lazy("running"),
    BulkAction.Status.PAUSED: gettext_lazy("paused"),
    BulkAction.Status.STOPPED: gettext_lazy("stopped"),
    BulkAction.Status.DONE: gettext_lazy("done"),
}

# The actions as people read them (the model's choices are plain English, for the admin).
ACTION_LABELS = {
    BulkVerb.RETRY: gettext_lazy("Retry now"),
    BulkVerb.CONFIRM_HAPPENED: gettext_lazy("Confirm it happened"),
    BulkVerb.CONFIRM_NOT_HAPPENED: gettext_lazy("Confirm it did not happen"),
    BulkVerb.RELEASE: gettext_lazy("Release"),
    BulkVerb.REASSIGN: gettext_lazy("Reassign"),
    BulkVerb.CANCEL: gettext_lazy("Cancel run"),
}

# What happened to one run of the job.
ITEM_LABELS = {
    BulkItemStatus.PENDING: gettext_lazy("Not handled yet"),
    BulkItemStatus.DONE: gettext_lazy("Action applied"),
    BulkItemStatus.SKIPPED: gettext_lazy("Skipped"),
    BulkItemStatus.FAILED: gettext_lazy("Failed"),
}

# A retry asks at most this many distinct tools whether they answer (each a lookup by key).
MAX_TOOLS_CHECKED = 5


def _check_tools(steps) -> dict[str, dict]:
    """Before offering a retry: is each tool the steps call answering now? Asked outside any
    transaction (a slow tool holds no lock); what it said is kept on the job."""
    tools = sorted({s.tool for s in steps if s.tool})[:MAX_TOOLS_CHECKED]
    recorded = incidents.tool_health(tools)
    found = {}
    for tool in tools:
        checked = incidents.check_tool(tool, recorded.get(tool))
        found[tool] = {"state": checked.state, "detail": checked.detail, "since": checked.since}
    return found


def retry_failed(job: BulkAction, user) -> BulkAction:
    """A new preview of the same action over the runs this job did not get through: its
    failed items, and the runs it acted on that went back to a person (re-parked)."""
    items = job.items.filter(
        Q(status=BulkItemStatus.FAILED) | Q(status=BulkItemStatus.DONE, run__status__in=Run.HUMAN)
    )
    ids = [str(pk) for pk in items.values_list("run_id", flat=True)]
    if not ids:
        raise BulkError(_("No run of this bulk action failed or went back to a person."))
    return preview(user, job.action, {"runs": ",".join(ids)}, dict(job.params), retry_of=job)


def _open_effects(steps) -> dict[int, SideEffect]:
    keys = {s.pk: s.idempotency_key for s in steps if s.status == Step.Status.UNKNOWN_OUTCOME}
    found = SideEffect.objects.filter(step_id__in=keys, idempotency_key__in=keys.values())
    return {e.step_id: e for e in found if keys.get(e.step_id) == e.idempotency_key}


# How check_may_act names each action ("only they or an admin can <phrase> it").
ACTION_PHRASES = {
    BulkVerb.RETRY: "retry a step of",
    BulkVerb.CONFIRM_HAPPENED: "settle an outcome of",
    BulkVerb.CONFIRM_NOT_HAPPENED: "settle an outcome of",
    BulkVerb.RELEASE: "release",
    BulkVerb.REASSIGN: "reassign",
    BulkVerb.CANCEL: "cancel",
}


@dataclass
class Plan:
    """What the bulk action will do to one run as it stands now, or why it will not."""

    bulk: BulkAction
    user: Any
    run: Run
    step: Step | None
    effect: SideEffect | None
    # Systems that did not answer a lookup in this preview, and what they said: a system that
    # is down is asked once, not once per run.
    unreachable: dict[str, str]
    # Someone's active soft claim on the run (approvals.live), unless told to act anyway.
    claim: Any = None

    def item(self, position: int) -> BulkActionItem:
        evidence: dict = {}
        try:
            check_may_act(self.run, self.user, ACTION_PHRASES[self.bulk.action])
            _check_claim(self.claim, self.user)
            plan, evidence = getattr(self, f"_{self.bulk.action}")()
            status, reason = BulkItemStatus.PENDING, ""
        except (ActionForbidden, Skip) as exc:
            plan, status, reason = "", BulkItemStatus.SKIPPED, str(exc)
            evidence = getattr(exc, "evidence", {})
        return BulkActionItem(
            bulk_action=self.bulk,
            position=position,
            run=self.run,
            step=self.step,
            expected_version=self.run.lock_version,
            status=status,
            plan=plan,
            reason=reason,
            evidence=evidence,
        )

    def _step_name(self) -> str:
        step = self.step
        return f"{step.name} ({step.tool})" if step and step.tool else (step.name if step else "")

    def _unfinished(self) -> Step:
        if self.run.status == Run.Status.COMPENSATING:
            raise Skip(_("Action not available: the run is being compensated."))
        if self.step is None:
            raise Skip(_("Action not available: the run has no unfinished step."))
        return self.step

    def _retry(self):
        step, S = self._unfinished(), Step.Status
        if step.status == S.UNKNOWN_OUTCOME:
            raise Skip(_("Action not available: the outcome is unknown; confirm it first."))
        if step.kind == "approval" or step.routing.get("action") == "approve":
            raise Skip(_("Action not available: the step waits for an approval."))
        retryable = step.status == S.NEEDS_HUMAN or (
            step.status in (S.RETRY_SCHEDULED, S.WAITING)
            and step.kind not in ("wait_event", "wait_timer")
        )
        if not retryable:
            raise Skip(
                _("Action not available: step %(s)s is %(st)s.")
                % {"s": step.name, "st": step.get_status_display().lower()}
            )
        return _("Retry %(step)s now (same idempotency key).") % {"step": self._step_name()}, {}

    def _evidence(self) -> dict:
        """What the system says for the call's key: found (with its id), not found, or that it
        cannot be asked."""
        step = self._unfinished()
        if step.status != Step.Status.UNKNOWN_OUTCOME or self.effect is None:
            raise Skip(_("Action not available: the step's outcome is not unknown."))
        try:
            tool = tool_registry.get(step.tool)
        except tool_registry.UnknownTool:
            tool = None
        system = step.tool.split(".")[0]
        evidence = {"system": system, "key": self.effect.idempotency_key, "tool": step.tool}
        if self.effect.status == SideEffect.Status.COMMITTED:
            return {**evidence, "found": True, "id": self.effect.external_id, "source": "receipt"}
        if tool is None or not tool.lookup_by_key:
            return {
                **evidence,
                "found": None,
                "why": _("%(tool)s cannot be asked by key.") % {"tool": step.tool},
            }
        ctx = CallContext(self.effect.idempotency_key, str(self.run.pk), step.name, 0, 5.0)
        if system in self.unreachable:
            return {**evidence, "found": None, "why": self.unreachable[system]}
        try:
            answer = tool.lookup(self.effect.idempotency_key, ctx)
        except ToolError as exc:
            self.unreachable[system] = exc.message[:300]
            return {**evidence, "found": None, "why": exc.message[:300]}
        return {**evidence, "found": answer.found, "id": answer.external_id, "source": "lookup"}

    def _confirm_happened(self):
        evidence = self._evidence()
        if not evidence.get("found") or not evidence.get("id"):
            raise Skip(_no_record(evidence), evidence)
        return _("Confirm it happened: %(system)s has %(id)s for key %(key)s.") % evidence, evidence

    def _confirm_not_happened(self):
        evidence = self._evidence()
        if evidence.get("found") is None:
            raise Skip(_no_record(evidence), evidence)
        if evidence["found"]:
            raise Skip(
                _("%(system)s has %(id)s for key %(key)s: it happened.") % evidence, evidence
            )
        return _(
            "Confirm it did not happen (%(system)s has nothing for key %(key)s) and retry with "
            "the same key."
        ) % evidence, evidence

    def _taken_over(self) -> str:
        if self.run.status != Run.Status.TAKEN_OVER:
            raise Skip(_("Action not available: the run is not taken over."))
        return self.run.owner.get_username()

    def _release(self):
        return _("Release it (taken over by %(who)s) back to the engine or the inbox.") % {
            "who": self._taken_over()
        }, {}

    def _reassign(self):
        queue = self.bulk.params.get("to_queue")
        if queue:
            if self.run.status != Run.Status.NEEDS_HUMAN:
                raise Skip(_("Action not available: the run does not wait for a person."))
            if self.run.queue == queue:
                raise Skip(_("It is in %(queue)s already.") % {"queue": queue})
            return _("Move it from queue %(before)s to %(queue)s.") % {
                "before": self.run.queue or "—",
                "queue": queue,
            }, {}
        owner, to = self._taken_over(), self.bulk.params["to"]
        if owner == to:
            raise Skip(_("%(who)s already has it.") % {"who": to})
        return _("Hand it from %(who)s to %(to)s.") % {"who": owner, "to": to}, {}

    def _cancel(self):
        if self.run.status == Run.Status.COMPENSATING:
            raise Skip(_("Action not available: the run is being compensated."))
        if self.step is not None and self.step.status == Step.Status.UNKNOWN_OUTCOME:
            raise Skip(_("Action not available: the outcome is unknown; confirm it first."))
        return _cancel_plan(self.run), {}


def _cancel_plan(run: Run) -> str:
    """What cancelling does to what the run already did, as the run page says it: undone by
    TaskPilots, or left for a person (approvals/_undo_plan.html)."""
    tools = list(
        SideEffect.objects.filter(run=run, status=SideEffect.Status.COMMITTED).values_list(
            "tool", flat=True
        )
    )
    if not tools:
        return _("Cancel it (nothing was done to other systems yet).")
    undo = sorted({t for t in tools if undoable(t)})
    by_hand = sorted({t for t in tools if not undoable(t)})
    if not by_hand:
        return _("Cancel it and undo what it did (%(undo)s).") % {"undo": ", ".join(undo)}
    if not undo:
        return _(
            "Cancel it; %(by_hand)s cannot be undone by TaskPilots and is left for a person."
        ) % {"by_hand": ", ".join(by_hand)}
    return _(
        "Cancel it and undo %(undo)s; %(by_hand)s cannot be undone by TaskPilots and is left "
        "for a person."
    ) % {"undo": ", ".join(undo), "by_hand": ", ".join(by_hand)}


class Skip(Exception):
    def __init__(self, message: str, evidence: dict | None = None):
        super().__init__(message)
        self.evidence = evidence or {}


def _check_claim(claim, user) -> None:
    """Skip a run someone else said they are handling (their soft claim, still active)."""
    if claim is not None and claim.is_active() and claim.user_id != user.pk:
        who = claim.user.get_username()
        raise Skip(
            _("%(user)s is handling this run (for %(minutes)s more minutes).")
            % {"user": who, "minutes": claim.minutes_left()},
            {"claimed_by": who},
        )


def _no_record(evidence: dict) -> str:
    if evidence.get("found") is None:
        return _("No evidence: %(why)s Settle it on the run's page.") % {
            "why": evidence.get("why", "")
        }
    return _("%(system)s has no record for key %(key)s.") % evidence


# --------------------------------------------------------------------------------------------
# Executing


def start(bulk: BulkAction, user) -> BulkAction:
    """Begin the job (only its owner or an admin; once): the task does the work."""
    if bulk.user_id != user.pk and not is_admin(user):
        raise ActionForbidden(
            "not_yours", _("Only the person who previewed it or an admin may run it.")
        )
    with transaction.atomic():
        if not bulk.begin():
            raise actions.DecisionConflict(_("This bulk action has already been started."))
        transaction.on_commit(lambda: enqueue(bulk.pk))
    bulk.refresh_from_db()
    return bulk


# By name, as the engine and the notifications send theirs: approvals.tasks imports this module.
RUN_TASK = "approvals.tasks.run_bulk_action"


def enqueue(bulk_id: int) -> None:
    """Ask a worker to carry the job out (as the engine dispatches: not at all with
    DISPATCH=none, where tests and drills call `execute` themselves)."""
    if settings.TASKPILOTS["DISPATCH"] != "celery":
        return
    try:
        current_app.send_task(RUN_TASK, (bulk_id,))
    except Exception:  # the broker being down only delays the job: the sweep enqueues it again
        logger.warning("could not enqueue bulk action %s; the sweep will pick it up", bulk_id)


def execute(bulk_id: int) -> int:
    """Carry out every pending item (the task's body; safe to run twice, or two at once: each
    takes the next item nobody holds, and the last one out marks the job done)."""
    bulk = BulkAction.objects.select_related("user").get(pk=bulk_id)
    if bulk.status != BulkAction.Status.RUNNING:
        return 0
    handled = 0
    # Paused or stopped by a person: checked between runs, so the run in hand finishes first.
    while bulk.is_running() and execute_next(bulk):
        handled += 1
        bulk.beat()
    bulk.finish_if_done()
    return handled


def control(bulk: BulkAction, user, move: str) -> BulkAction:
    """Pause, resume or stop a job (its owner or an admin). Resuming hands it to a worker
    again; a move that does not apply any more (the job finished, or someone moved it first)
    is a conflict, not an error."""
    if bulk.user_id != user.pk and not is_admin(user):
        raise ActionForbidden(
            "not_yours", _("Only the person who started it or an admin may pause or stop it.")
        )
    if move not in BulkAction.CONTROLS:
        raise BulkError(_("Unknown move: %(m)s.") % {"m": move[:30]}, "move")
    with transaction.atomic():
        if not bulk.control(move, user):
            raise actions.DecisionConflict(
                _("This bulk action is %(status)s: it cannot be paused, resumed or stopped now.")
                % {"status": STATUS_LABELS[BulkAction.objects.get(pk=bulk.pk).status]}
            )
        if move == "resume":
            transaction.on_commit(lambda: enqueue(bulk.pk))
    return bulk


def execute_next(bulk: BulkAction) -> bool:
    """The next pending item nobody holds, in one transaction: act, record, mark. False when
    there is none."""
    with transaction.atomic():
        item = (
            BulkActionItem.objects.select_for_update(skip_locked=True)
            .filter(bulk_action=bulk, status=BulkItemStatus.PENDING)
            .order_by("position")
            .first()
        )
        if item is None:
            return False
        token = acting.BULK_ACTION.set(bulk.pk)
        try:
            with transaction.atomic():  # a savepoint: whatever fails leaves the item markable
                _act(bulk, item)
        except actions.DecisionConflict as exc:
            _finish(
                item, BulkItemStatus.SKIPPED, _("Changed since the preview: %(why)s") % {"why": exc}
            )
            return True
        except (actions.ActionRefused, ActionForbidden) as exc:
            _finish(
                item, BulkItemStatus.SKIPPED, _("Not available any more: %(why)s") % {"why": exc}
            )
            return True
        except Exception as exc:  # the action's savepoint is rolled back: nothing was done
            logger.exception("bulk action %s: run %s failed", bulk.pk, item.run_id)
            _finish(item, BulkItemStatus.FAILED, f"{type(exc).__name__}: {exc}")
            return True
        finally:
            acting.BULK_ACTION.reset(token)
        decision = (
            HumanDecision.objects.filter(run_id=item.run_id, bulk_action=bulk)
            .order_by("-id")
            .first()
        )
        TimelineEvent.append(
            item.run_id,
            Verb.BULK_ACTION_APPLIED,
            {
                "bulk_action": bulk.pk,
                "action": bulk.action,
                "decision": decision.pk if decision else None,
            },
            actor=f"user:{bulk.user.get_username()}",
        )
        _finish(item, BulkItemStatus.DONE, "", decision)
    return True


def _finish(item: BulkActionItem, status: str, reason: str, decision=None) -> None:
    item.finish(status, reason, decision)


def _act(bulk: BulkAction, item: BulkActionItem) -> None:
    user, params, version = bulk.user, bulk.params, item.expected_version
    if not params.get("despite_claims"):
        try:  # claimed since the preview: skipped as the preview would have
            _check_claim(live.active_claim(item.run_id), user)
        except Skip as exc:
            raise actions.ActionRefused(str(exc)) from None
    comment = params.get("comment") or _("bulk action #%(n)s") % {"n": bulk.pk}
    V = BulkVerb
    if bulk.action == V.RETRY:
        actions.retry_step(item.run_id, user, comment=comment, expected_version=version)
    elif bulk.action in (V.CONFIRM_HAPPENED, V.CONFIRM_NOT_HAPPENED):
        happened = bulk.action == V.CONFIRM_HAPPENED
        proof = item.evidence.get("id", "") if happened else ""
        actions.confirm_outcome(
            item.step_id,
            user,
            happened=happened,
            proof=proof,
            comment=comment,
            expected_version=version,
        )
    elif bulk.action == V.RELEASE:
        actions.release(
            item.run_id,
            user,
            needed_engineer=params["needed_engineer"],
            comment=comment,
            expected_version=version,
        )
    elif bulk.action == V.REASSIGN and params.get("to_queue"):
        actions.move_to_queue(
            item.run_id, user, queue=params["to_queue"], comment=comment, expected_version=version
        )
    elif bulk.action == V.REASSIGN:
        to = get_user_model().objects.get(username=params["to"])
        actions.reassign(item.run_id, user, to=to, comment=comment, expected_version=version)
    elif bulk.action == V.CANCEL:
        actions.cancel_run(item.run_id, user, reason=comment, expected_version=version)


def resume_stale(now=None) -> list[int]:
    """Running jobs nobody has moved for STALE_SECONDS (their worker died and the broker did
    not hand the task on): enqueue them again. Running one twice is harmless."""
    now = now or timezone.now()
    stale = list(
        BulkAction.objects.filter(
            status=BulkAction.Status.RUNNING,
            heartbeat_at__lt=now - timedelta(seconds=STALE_SECONDS),
        ).values_list("pk", flat=True)
    )
    for pk in stale:
        BulkAction(pk=pk).beat(now)
        enqueue(pk)
    return stale

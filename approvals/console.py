"""What the console shows: the inbox and run-list queries, and a run's context for a person
(timeline, pending snapshot, why it stopped, the suggested next action, which actions apply).

Views load rows and call these; nothing here changes state (approvals/actions.py does that).
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db.models import Count, Exists, F, OuterRef, Q, QuerySet, Subquery
from django.db.models.fields.json import KT
from django.db.models.functions import JSONObject
from django.utils import timezone
from django.utils.formats import number_format
from django.utils.html import conditional_escape, escape
from django.utils.safestring import SafeData, SafeString, mark_safe
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from approvals import untrusted, viewer_time
from approvals.models import (
    ApprovalRequest,
    DecisionVerb,
    HumanDecision,
    SoftClaim,
    Takeover,
    known_queues,
)
from approvals.permissions import (
    is_admin,  # noqa: F401  (approvals/metrics_views.py reads it here)
    may_act,
)
from runs import tools as tool_registry
from runs import workflows as workflow_registry
from runs.engine import BY_HAND_QUEUE, build_context, prior_results_summary, undoable
from runs.models import (
    FailureClass,
    Risk,
    Run,
    SideEffect,
    Snapshot,
    Step,
    StepKind,
    Wait,
    shown,
)

logger = logging.getLogger("taskpilots.console")

PAGE_SIZE = 25
# JSON longer than this (characters, pretty-printed) or deeper than this is shown truncated,
# with a link to the raw document.
JSON_PREVIEW_CHARS = 2000
JSON_PREVIEW_DEPTH = 6

# --------------------------------------------------------------------------------------------
# Labels: the one place for what people read. The model choices carry plain English (for the
# Django admin); the console, the audit pages and the forms show these translatable ones, keyed
# by the same choices.

RUN_STATUS_LABELS = {
    Run.Status.PENDING: gettext_lazy("Pending"),
    Run.Status.RUNNING: gettext_lazy("Running"),
    Run.Status.WAITING: gettext_lazy("Waiting"),
    Run.Status.NEEDS_HUMAN: gettext_lazy("Needs a person"),
    Run.Status.TAKEN_OVER: gettext_lazy("Taken over"),
    Run.Status.COMPENSATING: gettext_lazy("Undoing side effects"),
    Run.Status.SUCCEEDED: gettext_lazy("Succeeded"),
    Run.Status.FAILED: gettext_lazy("Failed"),
    Run.Status.CANCELLED: gettext_lazy("Cancelled"),
    Run.Status.COMPENSATED: gettext_lazy("Undone (compensated)"),
}
STEP_STATUS_LABELS = {
    Step.Status.PENDING: gettext_lazy("To do"),
    Step.Status.RUNNING: gettext_lazy("Running"),
    Step.Status.SUCCEEDED: gettext_lazy("Done"),
    Step.Status.DEGRADED: gettext_lazy("Done with fallback"),
    Step.Status.RETRY_SCHEDULED: gettext_lazy("Retry scheduled"),
    Step.Status.WAITING: gettext_lazy("Waiting"),
    Step.Status.NEEDS_HUMAN: gettext_lazy("Needs a person"),
    Step.Status.UNKNOWN_OUTCOME: gettext_lazy("Outcome unknown"),
    Step.Status.FAILED: gettext_lazy("Failed"),
    Step.Status.SKIPPED: gettext_lazy("Skipped"),
    Step.Status.COMPENSATED: gettext_lazy("Undone"),
}
EFFECT_STATUS_LABELS = {
    SideEffect.Status.INTENDED: gettext_lazy("About to be sent"),
    SideEffect.Status.COMMITTED: gettext_lazy("Done"),
    SideEffect.Status.UNKNOWN: gettext_lazy("Outcome unknown"),
    SideEffect.Status.NOT_COMMITTED: gettext_lazy("This call did not go through"),
    SideEffect.Status.COMPENSATED: gettext_lazy("Undone"),
}
# One plain name per failure class, everywhere a person reads one: the inbox filter and badges,
# the bulk form, rule chips, the rule form and tester, metrics and the API docs. (The model
# choices in runs/models/ keep their technical names for the Django admin and migrations.)
FAILURE_LABELS = {
    FailureClass.TRANSIENT: gettext_lazy("Kept failing"),
    FailureClass.OUTAGE: gettext_lazy("System outage"),
    FailureClass.INVALID_INPUT: gettext_lazy("Invalid data"),
    FailureClass.PERMISSION: gettext_lazy("Permission denied"),
    FailureClass.UNKNOWN_OUTCOME: gettext_lazy("Unknown outcome"),
    FailureClass.TIMEOUT: gettext_lazy("Wait timed out"),
    FailureClass.EMPTY_RESULT: gettext_lazy("Nothing found"),
    FailureClass.API_DRIFT: gettext_lazy("API changed"),
}
# A two-person approval one person gave and a second has not (an inbox filter, not a cause).
SECOND_APPROVAL = "second_approval"
REASON_LABELS = {
    "approval": gettext_lazy("Approval"),
    SECOND_APPROVAL: gettext_lazy("Waiting for a second approver"),
    **FAILURE_LABELS,
}


def failure_class_choices() -> list[tuple[str, Any]]:
    """(value, label) for a select of failure classes, in the order the model lists them."""
    return [(value, FAILURE_LABELS[value]) for value in FailureClass.values]


STEP_KIND_LABELS = {
    StepKind.COMPUTE: gettext_lazy("Compute"),
    StepKind.READ: gettext_lazy("Read"),
    StepKind.SIDE_EFFECT: gettext_lazy("Side effect"),
    StepKind.APPROVAL: gettext_lazy("Approval"),
    StepKind.WAIT_EVENT: gettext_lazy("Wait for event"),
    StepKind.WAIT_TIMER: gettext_lazy("Wait for timer"),
}
# What a person did, as the rest of a sentence that starts with their name.
VERB_LABELS = {
    DecisionVerb.APPROVE: gettext_lazy("approved"),
    DecisionVerb.APPROVE_WITH_EDITS: gettext_lazy("approved with edits"),
    DecisionVerb.REJECT: gettext_lazy("rejected"),
    DecisionVerb.TAKE_OVER: gettext_lazy("took over"),
    DecisionVerb.RELEASE: gettext_lazy("released"),
    DecisionVerb.CONFIRM_HAPPENED: gettext_lazy("confirmed it happened"),
    DecisionVerb.CONFIRM_NOT_HAPPENED: gettext_lazy("confirmed it did not happen"),
    DecisionVerb.RETRY: gettext_lazy("retried"),
    DecisionVerb.SKIP: gettext_lazy("skipped the step"),
    DecisionVerb.COMPLETE_BY_HAND: gettext_lazy("marked the step done by hand"),
    DecisionVerb.CANCEL: gettext_lazy("cancelled the run"),
    DecisionVerb.REASSIGN: gettext_lazy("reassigned the run"),
}
# An approval request's decision.
DECISION_LABELS = {
    ApprovalRequest.Decision.APPROVED: gettext_lazy("Approved"),
    ApprovalRequest.Decision.APPROVED_WITH_EDITS: gettext_lazy("Approved with edits"),
    ApprovalRequest.Decision.REJECTED: gettext_lazy("Rejected"),
}

FAILURE_CLASS_LABELS = FAILURE_LABELS
# Translatable in runs/models/ (the tools page and rule chips show them).
RISK_LABELS = dict(Risk.choices)


def label(mapping: dict, value: str) -> str:
    return str(mapping.get(value, value))


# Sentences the engine writes into a run (its attention reason, a step's last error) are stored
# in English, so the record reads the same whoever reads it. The console shows the known ones
# in the reader's language, matched whole (runs/engine/compensation.py, runs/engine/ledger.py;
# tests/approvals/test_engine_sentences.py makes the engine write each one); anything else, such
# as a tool's own error, is shown as it was written.
_NO_DEDUPE = {
    "its verification read could not tell whether it did, and it does not dedupe": gettext_lazy(
        "%(error)s. %(tool)s may or may not have done this; its verification read could not "
        "tell whether it did, and it does not dedupe, so a person must check (idempotency key "
        "%(key)s)."
    ),
    "it cannot be asked by key, has no verification read and does not dedupe": gettext_lazy(
        "%(error)s. %(tool)s may or may not have done this; it cannot be asked by key, has no "
        "verification read and does not dedupe, so a person must check (idempotency key "
        "%(key)s)."
    ),
}
ENGINE_SENTENCES = [
    (
        re.compile(
            r"Compensation finished, but these side effects have no compensating tool and must "
            r"be undone by hand: (?P<listed>.+)",
            re.S,
        ),
        {
            "": gettext_lazy(
                "Compensation finished, but these side effects have no compensating tool and must "
                "be undone by hand: %(listed)s"
            )
        },
    ),
    (
        re.compile(
            r"(?P<error>.+)\. (?P<tool>\S+) may or may not have done this; (?P<why>"
            + "|".join(map(re.escape, _NO_DEDUPE))
            + r"), so a person must check \(idempotency key (?P<key>\S+)\)\.",
            re.S,
        ),
        _NO_DEDUPE,
    ),
]


def engine_text(text: Any) -> Any:
    """An engine-written sentence in the reader's language, as plain text (the template still
    escapes it and shows invisible characters); any other text unchanged."""
    if not isinstance(text, str):
        return text
    for pattern, templates in ENGINE_SENTENCES:
        match = pattern.fullmatch(text)
        if match:
            values = match.groupdict()
            return str(templates[values.pop("why", "")]) % values
    return text


def say(template: Any, **values: Any) -> SafeString:
    """A sentence of ours with values put in: plain strings (agent, tool and user data) are
    isolated and their invisible characters shown (approvals/untrusted.py); SafeStrings (our own
    markup or `escape()`d labels) go in as they are; numbers are escaped."""

    def put(value: Any) -> Any:
        if isinstance(value, SafeData):
            return value
        if isinstance(value, str):
            return untrusted.isolate(value)
        return escape(value)

    return mark_safe(escape(str(template)) % {key: put(v) for key, v in values.items()})


def sentences(*parts: Any) -> SafeString:
    """Sentences side by side, each escaped unless it is already safe (say() made it)."""
    return mark_safe(" ".join(str(conditional_escape(part)) for part in parts if part))


# --------------------------------------------------------------------------------------------
# Inbox and run list


def _current_step_subquery():
    """The run's first unfinished step, as one JSON value (one subquery per page row)."""
    return Subquery(
        Step.objects.filter(run=OuterRef("pk"), status__in=Step.UNFINISHED)
        .order_by("position")
        .values(
            info=JSONObject(
                name="name",
                kind="kind",
                status="status",
                error_class="error_class",
                tool="tool",
                action=KT("routing__action"),
            )
        )[:1]
    )


def reason_of(step_info: dict | None) -> str:
    if not step_info:
        return ""
    if step_info.get("status") == "needs_human" and (
        step_info.get("kind") == "approval" or step_info.get("action") == "approve"
    ):
        return "approval"  # an approval step, or a call the gate stopped for approval
    return step_info.get("error_class") or ""


PARKED_STATUSES = (Step.Status.NEEDS_HUMAN, Step.Status.UNKNOWN_OUTCOME)


def _reason_filter(reason: str) -> Q:
    return reason_filter(reason)


def reason_filter(reason: str, tool: str = "") -> Q:
    """Runs with a step parked for a person for `reason` (a failure class or "approval"), and
    calling `tool` when given: what the inbox's Reason filter, its incident groups
    (approvals/incidents.py) and a bulk action started from the inbox all select by."""
    parked = Step.objects.filter(run=OuterRef("pk"), status__in=PARKED_STATUSES)
    if tool:
        parked = parked.filter(tool=tool)
    if reason == "approval":
        return Q(Exists(parked.filter(awaits_approval())))
    if reason == SECOND_APPROVAL:
        return Q(Exists(_two_person_pending().filter(first_approved_by__isnull=False)))
    return Q(Exists(parked.filter(error_class=reason).exclude(awaits_approval())))


def _two_person_pending() -> QuerySet[ApprovalRequest]:
    return ApprovalRequest.objects.filter(
        run=OuterRef("pk"), status=ApprovalRequest.Status.PENDING, approvals_required__gt=1
    )


def _approvals_given_subquery():
    """A pending two-person approval's progress as one JSON value ({required, first}; NULL
    when the run waits for no such approval): the inbox's "1 of 2 approvals"."""
    return Subquery(
        _two_person_pending().values(
            info=JSONObject(required="approvals_required", first="first_approved_by_id")
        )[:1]
    )


def unclaimed() -> Q:
    """Nobody said “I'll handle it” (approvals/live.py)."""
    claimed = SoftClaim.objects.filter(run=OuterRef("pk"), expires_at__gt=timezone.now())
    return ~Q(Exists(claimed))


def awaits_approval() -> Q:
    """A parked step that waits for people's approval: an approval step, or a side effect
    the gate stopped (runs.engine.gate: its routing's action is `approve`)."""
    # Containment, not a key lookup: a routing without an action is false here, never NULL
    # (which would drop it from an exclude() as well).
    return Q(kind="approval") | Q(routing__contains={"action": "approve"})


def inbox_queryset(user, *, queue="", workflow="", reason="", owner="") -> QuerySet[Run]:
    """Runs waiting for a person, most urgent SLA first (earliest due; no SLA last; then oldest).

    Served by the partial index run_inbox_idx (attention_due_at, created_at) on human statuses.
    """
    runs = Run.objects.filter(status__in=Run.HUMAN)
    if queue:
        runs = runs.filter(queue=queue)
    if workflow:
        runs = runs.filter(workflow=workflow)
    if reason:
        runs = runs.filter(_reason_filter(reason))
    if owner == "mine":
        runs = runs.filter(owner=user)
    elif owner == "unassigned":
        runs = runs.filter(owner__isnull=True)
    elif owner == "unclaimed":
        runs = runs.filter(unclaimed())
    return (
        runs.select_related("owner")
        .annotate(current=_current_step_subquery(), two_person=_approvals_given_subquery())
        .order_by(F("attention_due_at").asc(nulls_last=True), "created_at", "id")
    )


def inbox_counts(user, now=None) -> dict[str, int]:
    now = now or timezone.now()
    return Run.objects.filter(status__in=Run.HUMAN).aggregate(
        total=Count("id"),
        overdue=Count("id", filter=Q(attention_due_at__lt=now)),
        mine=Count("id", filter=Q(owner=user)),
        unassigned=Count("id", filter=Q(owner__isnull=True)),
    )


def filter_choices() -> dict[str, list[str]]:
    """Queues from the escalation rules (plus approval queues in use by workflows), workflows
    from the registry: no scan of the runs table."""
    workflows = {definition.name for definition in workflow_registry.all_workflows()}
    return {"queues": known_queues(), "workflows": sorted(workflows)}


def search_runs(*, q="", workflow="", status="", date_from=None, date_to=None) -> QuerySet[Run]:
    runs = Run.objects.select_related("owner")
    q = q.strip()
    if q:
        try:
            runs = runs.filter(Q(pk=uuid.UUID(q)) | Q(business_key=q))
        except ValueError:
            runs = runs.filter(_short_id(q) | Q(business_key__startswith=q))
    if workflow:
        runs = runs.filter(workflow=workflow)
    if status:
        runs = runs.filter(status=status)
    # Days in the viewer's zone, as ranges of created_at (run_created_idx), not a date cast.
    runs = viewer_time.filter_days(runs, date_from, date_to)
    return runs.order_by("-created_at", "-id")


SHORT_ID = re.compile(r"^[0-9a-f]{8}[0-9a-f-]{0,28}…?$", re.IGNORECASE)


def _short_id(text: str) -> Q:
    """A run id's beginning as lists show it (`0e911daf…`, at least its first 8 hex digits):
    the ids from that prefix up to the next one, a range the primary key's index serves. An
    empty Q matches nothing here: anything else is a business key's beginning."""
    digits = text.rstrip("…").replace("-", "").lower()
    if not SHORT_ID.match(text) or len(digits) > 32:
        return Q(pk__in=[])
    low = uuid.UUID(digits.ljust(32, "0"))
    high = uuid.UUID(digits.ljust(32, "f"))
    return Q(pk__gte=low, pk__lte=high)


# --------------------------------------------------------------------------------------------
# JSON shown to people: pretty, bounded, and always escaped by the template.


def to_pretty_json(value: Any) -> str:
    return json.dumps(value, cls=DjangoJSONEncoder, indent=2, ensure_ascii=False, sort_keys=True)


def _depth(value: Any, limit: int, level: int = 0) -> int:
    if level > limit:
        return level
    if isinstance(value, dict):
        return max([_depth(v, limit, level + 1) for v in value.values()] or [level])
    if isinstance(value, list):
        return max([_depth(v, limit, level + 1) for v in value] or [level])
    return level


def _clip(value: Any, depth: int) -> Any:
    if depth <= 0 and isinstance(value, dict | list):
        return "…" if not value else f"… ({len(value)})"
    if isinstance(value, dict):
        return {k: _clip(v, depth - 1) for k, v in list(value.items())[:50]}
    if isinstance(value, list):
        return [_clip(v, depth - 1) for v in value[:50]]
    if isinstance(value, str) and len(value) > 500:
        return value[:500] + "…"
    return value


@dataclass
class JsonPreview:
    text: str
    truncated: bool


def preview_json(value: Any) -> JsonPreview:
    full = to_pretty_json(value)
    if len(full) <= JSON_PREVIEW_CHARS and _depth(value, JSON_PREVIEW_DEPTH) <= JSON_PREVIEW_DEPTH:
        return JsonPreview(full, False)
    clipped = to_pretty_json(_clip(value, JSON_PREVIEW_DEPTH))
    if len(clipped) > JSON_PREVIEW_CHARS:
        clipped = clipped[:JSON_PREVIEW_CHARS] + "\n…"
    return JsonPreview(clipped, True)


# --------------------------------------------------------------------------------------------
# A run, as a person needs to see it


@dataclass
class TimelineItem:
    name: str
    kind: str
    stage: str
    tool: str
    state: str  # "done", "current", "failed", "skipped", "upcoming"
    step: Step | None = None
    effects: list[SideEffect] = field(default_factory=list)
    # Why a step failed or was skipped, as a person reads it (SafeString; empty when unknown).
    reason: str = ""
    # Set when the step's own status would mislead (a finished run's unfinished step).
    status_label: str = ""


@dataclass
class Pending:
    """What is about to be done: the snapshot of the call, or the approval's proposal."""

    tool: str
    target: str
    params: Any
    permissions: dict
    prior_results: Any
    idempotency_key: str = ""
    snapshot: Snapshot | None = None
    created_at: Any = None

    @property
    def amount(self) -> str:
        return amount_of(self.params)


@dataclass
class RunContext:
    run: Run
    steps: list[Step]
    timeline: list[TimelineItem]
    current: Step | None
    approval: ApprovalRequest | None
    pending: Pending | None
    effects: list[SideEffect]
    decisions: list[HumanDecision]
    routing: dict
    failure_class: str
    reason: str
    suggestion: str
    actions: set[str]
    edit_fields: dict | None
    to_compensate: list[SideEffect]
    wait: Wait | None
    can_act: bool
    viewer: Any = None
    # What is true when there is nothing to do (the actions panel says it).
    idle: str = ""
    # A result found by key that is not what the snapshot expected, side by side (changed_side).
    changed: dict | None = None
    # The committed side effects split by what cancelling or rejecting does to them: undone by
    # their tool's compensating tool, or left for a person to undo by hand (no such tool).
    to_undo: list[SideEffect] = field(default_factory=list)
    by_hand: list[SideEffect] = field(default_factory=list)
    by_hand_queue: str = ""


def _upcoming(run: Run, steps: list[Step]) -> list[dict]:
    """The declared steps after the last recorded one (branches may skip some)."""
    try:
        declared = workflow_registry.get(run.workflow, run.workflow_version).describe()
    except workflow_registry.UnknownWorkflow:
        return []
    names = [d["name"] for d in declared]
    recorded = {s.name for s in steps}
    last_index = -1
    for step in steps:
        if step.name in names:
            last_index = max(last_index, names.index(step.name))
    return [d for d in declared[last_index + 1 :] if d["name"] not in recorded]


def readable_results(summary: Any) -> Any:
    """A snapshot's earlier results ({step: canonical JSON text, cut}) as values to show as
    JSON: each text read back when it is whole JSON, kept as text when it was cut."""
    if not isinstance(summary, dict):
        return summary
    shown = {}
    for name, text in summary.items():
        try:
            shown[name] = json.loads(text) if isinstance(text, str) else text
        except ValueError:
            shown[name] = text
    return shown


def _prior_results(run: Run, steps: list[Step], before: Step | None) -> dict[str, Any]:
    """The earlier results as the engine summarises them in a snapshot (runs/engine/context.py)."""
    earlier = [s for s in steps if before is None or s.position < before.position]
    return readable_results(prior_results_summary(build_context(run, earlier).results))


def build_run_context(run: Run, user) -> RunContext:
    """Everything the detail page shows, in a fixed number of queries."""
    steps = list(run.steps.order_by("position"))
    effects = list(run.side_effects.order_by("created_at", "id"))
    current = _current_step(run, steps)
    approval = _open_approval(current)
    pending = _pending(run, steps, current, approval)
    wait = _open_wait(current)
    decisions = list(
        run.decisions.select_related("user", "step", "approval").order_by("-created_at", "-id")[:50]
    )
    routing = (current.routing if current else {}) or {}
    failure_class = (current.error_class if current else "") or routing.get("failure_class", "")
    acts = may_act(user, run)
    actions = available_actions(run, current, approval, effects) if acts else set()
    actions -= not_yours_to_approve(run, approval, user)
    ctx = RunContext(
        run=run,
        steps=steps,
        timeline=_timeline(run, steps, current, effects, decisions),
        current=current,
        approval=approval,
        pending=pending,
        effects=effects,
        decisions=decisions,
        routing=routing,
        failure_class=failure_class,
        reason="approval" if approval else failure_class,
        suggestion="",
        actions=actions,
        edit_fields=_edit_fields(actions, approval, current, pending),
        to_compensate=[e for e in effects if e.status == SideEffect.Status.COMMITTED],
        wait=wait,
        can_act=acts,
        viewer=user,
    )
    ctx.changed = changed_side(current, effects)
    for effect in ctx.to_compensate:
        (ctx.to_undo if undoable(effect.tool) else ctx.by_hand).append(effect)
    ctx.by_hand_queue = BY_HAND_QUEUE
    ctx.suggestion = suggest_next_action(ctx)
    ctx.idle = idle_sentence(ctx)
    return ctx


def changed_side(current: Step | None, effects: list[SideEffect]) -> dict | None:
    """The current unknown step's result found by key against what its snapshot expected
    (SideEffect.note_result_changed): rows of (field, the snapshot said, the tool reports now),
    short renderings of untrusted values (escaped by the template), and both digests."""
    if current is None or current.status != Step.Status.UNKNOWN_OUTCOME:
        return None
    effect = next((e for e in effects if e.idempotency_key == current.idempotency_key), None)
    kept = effect.changed_result if effect is not None else None
    if not kept:
        return None
    observed, changes = kept["observed"], kept.get("changes", {})
    rows = [
        (name, shown(values.get("snapshot"), 120), shown(values.get("now"), 120))
        for name, values in (changes.get("fields") or {}).items()
    ]
    expected = changes.get("expected", {})
    return {
        "key": effect.idempotency_key,
        "rows": rows,
        "external_id": observed.get("external_id", ""),
        "now_digest": observed.get("response_digest", ""),
        "now_shown": shown(observed.get("response")),
        "expected_digest": expected.get("receipt_digest") or expected.get("params_digest", ""),
        "expected_shown": expected.get("shown", ""),
    }


def _current_step(run: Run, steps: list[Step]) -> Step | None:
    """The first unfinished step. A finished run has none: one it left unfinished (a cancel
    leaves the parked step as it was) is shown as not done, not as waiting for a person."""
    if run.is_terminal:
        return None
    return next((s for s in steps if s.status in Step.UNFINISHED), None)


def _open_approval(current: Step | None) -> ApprovalRequest | None:
    """The current step's pending approval: an approval step's, or the gate's for a call."""
    if current is None or current.status != Step.Status.NEEDS_HUMAN:
        return None
    pending = ApprovalRequest.objects.filter(step=current, status=ApprovalRequest.Status.PENDING)
    return pending.select_related("first_approved_by").order_by("-id").first()


def _open_wait(current: Step | None) -> Wait | None:
    if current is None:
        return None
    return Wait.objects.filter(step=current, status=Wait.Status.PENDING).first()


def _edit_fields(actions, approval, current, pending) -> dict | None:
    """The tool and parameters an edit form starts from, when an edit is offered."""
    if "approve_edits" not in actions and "retry_edits" not in actions:
        return None
    tool_name = approval.tool if approval else (current.tool if current else "")
    return {"tool": tool_name, "params": pending.params if pending else {}}


def _timeline(run, steps, current, effects, decisions) -> list[TimelineItem]:
    """The recorded steps with their side effects (a failed or skipped one says why), then the
    declared steps still to come."""
    by_step: dict[int, list[SideEffect]] = {}
    for effect in effects:
        by_step.setdefault(effect.step_id, []).append(effect)
    timeline = []
    for step in steps:
        state = _step_state(run, step, current)
        item = TimelineItem(
            step.name, step.kind, step.stage, step.tool, state, step, by_step.get(step.pk, [])
        )
        item.reason = _step_reason(item, decisions)
        if run.is_terminal and step.status in Step.UNFINISHED:
            item.status_label = _("Not done")
        timeline.append(item)
    if not run.is_terminal:
        for spec in _upcoming(run, steps):
            timeline.append(
                TimelineItem(spec["name"], spec["kind"], spec["stage"], spec["tool"], "upcoming")
            )
    return timeline


def _step_state(run: Run, step: Step, current: Step | None) -> str:
    if step is current:
        return "current"
    if run.is_terminal and step.status in Step.UNFINISHED:
        return "skipped"
    if step.status == Step.Status.FAILED:
        return "failed"
    if step.status in (Step.Status.SKIPPED, Step.Status.COMPENSATED):
        return "skipped"
    if step.status in Step.DONE:
        return "done"
    return "upcoming"


def _step_reason(item: TimelineItem, decisions: list[HumanDecision]) -> str:
    """A failed step says why (a rejection names who and when, with their comment); a step
    skipped without a reason says the run stopped before it."""
    step = item.step
    if step is not None and item.state == "done":
        return _done_by_hand(step, decisions)
    if step is None or item.state not in ("failed", "skipped"):
        return ""
    if item.state == "failed":
        rejections = (d for d in decisions if d.verb == DecisionVerb.REJECT)
        rejected = next((d for d in rejections if d.step_id == step.pk), None)
        if rejected is not None:
            values = {"user": rejected.user.get_username(), "when": _when(rejected.created_at)}
            if rejected.comment:
                return say(
                    _("Rejected by %(user)s at %(when)s: “%(comment)s”."),
                    comment=rejected.comment,
                    **values,
                )
            return say(_("Rejected by %(user)s at %(when)s."), **values)
        if step.last_error:
            return say(_("Failed: %(error)s"), error=_shorten(step.last_error, 240))
        return ""
    if step.status == Step.Status.SKIPPED and step.last_error:
        return say(_("Skipped: “%(reason)s”"), reason=_shorten(step.last_error, 200))
    return say(_("Not done: the run stopped before this step."))


def _done_by_hand(step: Step, decisions: list[HumanDecision]) -> str:
    """A step a person did outside TaskPilots says who, when, and the result they gave (the
    reference they entered), beside any call of TaskPilots' own that did not go through."""
    done = next(
        (d for d in decisions if d.verb == DecisionVerb.COMPLETE_BY_HAND and d.step_id == step.pk),
        None,
    )
    if done is None:
        return ""
    result = done.after if done.after not in (None, "", {}) else step.result
    shown = _shorten(json.dumps(result, ensure_ascii=False, sort_keys=True, default=str), 240)
    return say(
        _("Done by hand by %(user)s at %(when)s; the result they gave: %(result)s"),
        user=done.user.get_username(),
        when=_when(done.created_at),
        result=shown,
    )


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _when(value) -> SafeString:
    return escape(viewer_time.format_timestamp(value)) if value else escape("—")


def _pending(run, steps, current, approval) -> Pending | None:
    if approval is not None:
        try:
            target = tool_registry.get(approval.tool).target_of(approval.proposed_params)
        except tool_registry.UnknownTool:
            target = ""
        return Pending(
            tool=approval.tool,
            target=target,
            params=approval.proposed_params,
            permissions={"actor": run.principal, "scopes": run.scopes},
            prior_results=_prior_results(run, steps, current),
            created_at=approval.created_at,
        )
    if current is None or current.kind not in ("side_effect", "read"):
        return None
    snapshot = Snapshot.objects.filter(step=current).order_by("-id").first()
    if snapshot is not None:
        return Pending(
            tool=snapshot.tool,
            target=snapshot.target_resource,
            params=snapshot.params,
            permissions=snapshot.permissions,
            prior_results=readable_results(snapshot.prior_results_summary),
            idempotency_key=snapshot.idempotency_key,
            snapshot=snapshot,
            created_at=snapshot.created_at,
        )
    params = current.spec.get("params_override") or current.spec.get("params") or {}
    return Pending(
        tool=current.tool,
        target="",
        params=params,
        permissions={"actor": run.principal, "scopes": run.scopes},
        prior_results=_prior_results(run, steps, current),
        idempotency_key=current.idempotency_key,
    )


# ISO 4217 minor units where they are not 2 (yen and won have no cents; dinars have three).
CURRENCY_DECIMALS = {
    **dict.fromkeys(
        (
            "BIF",
            "CLP",
            "DJF",
            "GNF",
            "ISK",
            "JPY",
            "KMF",
            "KRW",
            "PYG",
            "RWF",
            "UGX",
            "UYI",
            "VND",
            "VUV",
            "XAF",
            "XOF",
            "XPF",
        ),
        0,
    ),
    **dict.fromkeys(("BHD", "IQD", "JOD", "KWD", "LYD", "OMR", "TND"), 3),
}


def amount_of(params: Any) -> str:
    """A money amount in the parameters, with its currency and as many decimals as that
    currency has: `1,250.00 USD`, `1,250 JPY`. Without a currency in the call, it says so (the
    payment system then applies its default); "" when there is no amount. An amount finer than
    its currency allows is shown with all its digits: a person approves what will be sent."""
    if not isinstance(params, dict):
        return ""
    amount = params.get("amount")
    if isinstance(amount, bool) or not isinstance(amount, int | float):
        return ""
    currency = params.get("currency")
    currency = currency.strip() if isinstance(currency, str) else ""
    decimals = CURRENCY_DECIMALS.get(currency.upper(), 2)
    if round(amount, decimals) != amount:
        decimals = len(repr(float(amount)).partition(".")[2].rstrip("0"))
    shown = number_format(amount, decimal_pos=decimals, force_grouping=True)
    if currency:
        return say("%(amount)s %(currency)s", amount=escape(shown), currency=currency)
    return say(
        _("%(amount)s (no currency in the call: the payment system applies its default)"),
        amount=escape(shown),
    )


def not_yours_to_approve(run: Run, approval: ApprovalRequest | None, user) -> set[str]:
    """The approval actions this person may not take on a two-person request, so the page does
    not offer them (approvals.actions.check_may_approve_twoperson refuses them anyway): the
    first approver, the person who started the run and one who took it over approve nothing;
    the second approver approves the first approver's parameters as they are."""
    if approval is None or approval.approvals_required < 2 or user is None:
        return set()
    name = user.get_username()
    if (
        approval.first_approved_by_id == user.pk
        or run.principal == f"user:{name}"
        or Takeover.objects.filter(run=run, user=user).exists()
    ):
        return {"approve", "approve_edits"}
    return {"approve_edits"} if approval.awaits_second else set()


def human_duration(seconds: Any) -> str:
    """A number of seconds as a person reads it: 45 s, 10 min, 1 h 30 min, 4 h, 2 d."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        return "" if seconds is None else str(seconds)
    seconds = int(seconds)
    units = [
        (86400, _("%(n)s d")),
        (3600, _("%(n)s h")),
        (60, _("%(n)s min")),
        (1, _("%(n)s s")),
    ]
    parts = []
    for size, unit in units:
        if seconds >= size or (size == 1 and not parts):
            count, seconds = divmod(seconds, size)
            parts.append(unit % {"n": number_format(count, force_grouping=True)})
        if len(parts) == 2 or (parts and seconds == 0):
            break
    return " ".join(parts)


def available_actions(run, current, approval, effects) -> set[str]:
    """The actions that make sense now (the action functions re-check under the row lock)."""
    if run.is_terminal:
        return set()
    found: set[str] = set()
    S = Step.Status
    if run.status == Run.Status.TAKEN_OVER:
        found |= {"release", "reassign"}
    elif run.status != Run.Status.COMPENSATING:
        found.add("take_over")
    if run.status == Run.Status.NEEDS_HUMAN:
        found.add("reassign")
    if run.status != Run.Status.COMPENSATING and not (
        current is not None and current.status == S.UNKNOWN_OUTCOME
    ):
        found.add("cancel")
    if current is None or run.status == Run.Status.COMPENSATING:
        return found
    if approval is not None:
        found |= {"approve", "reject"}
        if approval.tool:
            found.add("approve_edits")
        return found
    if current.status == S.UNKNOWN_OUTCOME:
        return found | {"confirm_happened", "confirm_not_happened"}
    waits_for_event = current.kind in ("wait_event", "wait_timer")
    if current.status == S.NEEDS_HUMAN or (
        current.status in (S.RETRY_SCHEDULED, S.WAITING) and not waits_for_event
    ):
        found.add("retry")
    if current.status == S.NEEDS_HUMAN and current.kind in ("side_effect", "read"):
        last = next((e for e in reversed(effects) if e.step_id == current.pk), None)
        if last is None or last.status != SideEffect.Status.COMMITTED:
            found.add("retry_edits")
    if current.status in (S.NEEDS_HUMAN, S.RETRY_SCHEDULED, S.WAITING, S.PENDING):
        found |= {"skip", "complete"}
    return found


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
            due=_when(due),
        )
    event = (ctx.wait.event_type if ctx.wait else "") or step.name
    if due:
        return say(
            _(
                "The run waits for the event %(event)s (until %(due)s) and goes on by itself "
                "when it comes; nothing to do."
            ),
            event=event,
            due=_when(due),
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
    when = _when(run.finished_at or run.updated_at)
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
            when=_when(ended_by.created_at),
        )
    return say(
        _("Nothing left to do: %(user)s cancelled the run at %(when)s (“%(reason)s”)."),
        user=ended_by.user.get_username(),
        when=_when(ended_by.created_at),
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

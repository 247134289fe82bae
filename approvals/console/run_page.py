"""A run as a person needs to see it: pretty, bounded JSON; its timeline, the pending call, the
prior results, the amounts and durations shown, which actions apply."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.utils.formats import number_format
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _

from approvals.console.context import Pending, RunContext, TimelineItem
from approvals.console.labels import sentence
from approvals.console.next_action import idle_sentence, suggest_next_action
from approvals.models import (
    ApprovalRequest,
    DecisionVerb,
    HumanDecision,
    Takeover,
)
from approvals.permissions import (
    may_act,
)
from runs import tools as tool_registry
from runs import workflows as workflow_registry
from runs.engine import BY_HAND_QUEUE, build_context, prior_results_summary, undoable
from runs.models import (
    Run,
    SideEffect,
    Snapshot,
    Step,
    Wait,
    shown,
)
from runs.traceids import trace_id_hex

# JSON longer than this (characters, pretty-printed) or deeper than this is shown truncated,
# with a link to the raw document.
JSON_PREVIEW_CHARS = 2000
JSON_PREVIEW_DEPTH = 6

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
    ctx.trace = trace_of(run)
    return ctx


def trace_of(run: Run) -> dict | None:
    """The run's trace id (runs/traceids.py) and its address in the trace viewer
    (TASKPILOTS_TRACE_URL, `{trace_id}` and `{run_id}` replaced), when this deployment traces
    (TASKPILOTS_OTEL=1: docs/deploy.md, "Traces"); None otherwise."""
    if not settings.OTEL:
        return None
    trace_id = trace_id_hex(run.pk)
    url = settings.TRACE_URL.replace("{trace_id}", trace_id).replace("{run_id}", str(run.pk))
    return {"id": trace_id, "url": url}


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
            values = {"user": rejected.user.get_username(), "at": rejected.created_at}
            if rejected.comment:
                return _sentence("rejected-with-comment", comment=rejected.comment, **values)
            return _sentence("rejected", **values)
        if step.last_error:
            return _sentence("failed", error=_shorten(step.last_error, 240))
        return ""
    if step.status == Step.Status.SKIPPED and step.last_error:
        return _sentence("skipped", reason=_shorten(step.last_error, 200))
    return _sentence("not-done")


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
    return _sentence(
        "done-by-hand", user=done.user.get_username(), at=done.created_at, result=shown
    )


def _sentence(name: str, **values: Any) -> SafeString:
    """The partial `name` of templates/console/sentences/run_page.html."""
    return sentence(f"run_page.html#{name}", **values)


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


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

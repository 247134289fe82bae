"""The takeover console: inbox, run list, run detail and every human action.

Views are thin: check the role, load rows, call approvals/console/ to read or
approvals/actions.py to act, and render a page or (for htmx) the partial that changed.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth import get_user_model
from django.core.paginator import Paginator
from django.core.serializers.json import DjangoJSONEncoder
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext as _
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_POST

from approvals import actions, console, incidents, live, paging, untrusted
from approvals.forms import (
    ActionForm,
    ApproveForm,
    CompleteForm,
    ConfirmHappenedForm,
    EditParamsForm,
    InboxFilterForm,
    ReasonForm,
    ReassignForm,
    RejectForm,
    ReleaseForm,
    RunSearchForm,
    StepForm,
)
from approvals.htmx import htmx_partial
from approvals.models import ApprovalRequest
from approvals.permissions import ACT, READ, forbidden, may_act, require_role
from runs.conditions import describe as describe_condition
from runs.models import Run, Snapshot, Step, TimelineEvent, TransitionError
from runs.rehydration import rehydration_document

logger = logging.getLogger("taskpilots.console")


def console_view(*, act: bool = False):
    """Login required, then a console role: any role to read, support or admin to act
    (approvals/permissions.py says who may; approvals/metrics_views.py uses this too)."""
    return require_role(ACT if act else READ)


def _page(request: HttpRequest, queryset, size: int = console.PAGE_SIZE):
    return Paginator(queryset, size).get_page(request.GET.get("page"))


def _querystring(request: HttpRequest, **overrides: Any) -> str:
    """The request's filters (without its page) with `overrides`: what page links start from."""
    params = request.GET.copy()
    for key in (*paging.PAGE_PARAMS, *overrides):
        params.pop(key, None)
    for key, value in overrides.items():
        if value:
            params[key] = value
    return params.urlencode()


# --------------------------------------------------------------------------------------------
# Inbox


@require_GET
@never_cache
@console_view()
def inbox(request: HttpRequest) -> HttpResponse:
    choices = console.filter_choices()
    form = InboxFilterForm(request.GET or None, **choices)
    runs = console.inbox_queryset(request.user, **form.filters())
    page = _page(request, runs)
    for run in page.object_list:
        run.reason = console.reason_of(run.current)
    live.attach_claims(page.object_list)
    context = {
        "form": form,
        "page": page,
        "counts": console.inbox_counts(request.user),
        "now": timezone.now(),
        "query": _querystring(request),
        "bulk_query": urlencode({"status": "inbox", **form.filters()}),
        "incidents": incidents.incident_groups(),
        "health_reasons": incidents.HEALTH_REASONS,
    }
    template = htmx_partial(request, "console/inbox.html", "inbox-live")
    return render(request, template, context)


# --------------------------------------------------------------------------------------------
# All runs


@require_GET
@never_cache
@console_view()
def run_list(request: HttpRequest) -> HttpResponse:
    workflows = console.filter_choices()["workflows"]
    form = RunSearchForm(request.GET or None, workflows=workflows)
    if form.is_bound and not form.is_valid():
        # The page says which field is wrong (a day with no end, …) and lists nothing: listing
        # every run under filters the person did not get would read as an answer.
        runs = Run.objects.none()
    else:
        runs = console.search_runs(**form.filters())
    page, status = keyset_page(request, runs)
    context = {"form": form, "page": page, "query": _querystring(request), "now": timezone.now()}
    template = htmx_partial(request, "console/run_list.html", "run-results")
    return render(request, template, context, status=status)


def keyset_page(request: HttpRequest, runs) -> tuple[paging.KeysetPage | None, int]:
    """The page of `runs` the request's page link asks for (approvals/paging.py), and the
    status to answer with: 400 for a link the console did not give out (the page says so)."""
    try:
        return paging.newest_first(runs, request.GET), 200
    except paging.BadCursor:
        logger.info("console: bad page link %s", request.get_full_path()[:300])
        return None, 400


# --------------------------------------------------------------------------------------------
# Run detail

TABS = ("steps", "rehydration", "events", "decisions")


def _get_run(run_id) -> Run:
    return get_object_or_404(Run.objects.select_related("owner"), pk=run_id)


def _action_forms(
    ctx: console.RunContext, bound: dict | None = None, state: str | None = None
) -> dict[str, Any]:
    version = {"expected_version": ctx.run.lock_version, "expected_state": state or ""}
    approval = {"approval": ctx.approval.pk} if ctx.approval else {}
    step = {"step": ctx.current.pk} if ctx.current else {}
    forms: dict[str, Any] = {}
    for name in ctx.actions:
        spec = ACTIONS[name]
        initial = {**version, **approval, **step}
        if spec.form is EditParamsForm:
            forms[name] = EditParamsForm(
                initial=initial, conditions=name == "approve_edits", **(ctx.edit_fields or {})
            )
        else:
            forms[name] = spec.form(initial=initial)
    forms.update(bound or {})
    return forms


def _detail_context(request: HttpRequest, run: Run, **extra: Any) -> dict[str, Any]:
    ctx = console.build_run_context(run, request.user)
    tab = request.GET.get("tab", "steps")
    tab = tab if tab in TABS else "steps"
    state = live.actionable_state(run.pk)
    context = {
        "ctx": ctx,
        "run": run,
        "forms": _action_forms(ctx, extra.pop("bound", None), state),
        "tab": tab,
        "now": timezone.now(),
        "live": run.status in Run.RUNNABLE,
        "state": state,
    }
    if tab == "rehydration":
        document = rehydration_document(run)
        context["rehydration"] = untrusted.json_html(console.to_pretty_json(document))
    elif tab == "events":
        context["events"] = list(TimelineEvent.objects.filter(run=run).order_by("-seq")[:200])
    context.update(extra)
    return context


@require_GET
@never_cache
@console_view()
def run_detail(request: HttpRequest, run_id) -> HttpResponse:
    run = _get_run(run_id)
    template = htmx_partial(request, "console/run_detail.html", "run-main", "tab-panel")
    return render(request, template, _detail_context(request, run))


@require_GET
@never_cache
@console_view()
def run_raw(request: HttpRequest, run_id, part: str, ident: int | None = None) -> HttpResponse:
    """The full JSON behind a truncated preview, served as application/json (never HTML).

    Invisible and bidi format characters are written as \\uXXXX escapes: the same JSON
    value, but a browser or editor showing the text shows them instead of obeying them."""
    run = _get_run(run_id)
    kind = part
    if kind == "input":
        value = run.input
    elif kind == "result":
        value = run.result
    elif kind == "rehydration":
        value = rehydration_document(run)
    elif kind == "snapshot" and ident:
        value = get_object_or_404(Snapshot, pk=ident, run=run).content()
    elif kind == "step" and ident:
        step = get_object_or_404(Step, pk=ident, run=run)
        value = {"result": step.result, "spec": step.spec, "routing": step.routing}
    elif kind == "approval" and ident:
        approval = get_object_or_404(ApprovalRequest, pk=ident, run=run)
        value = {"proposed_params": approval.proposed_params, "edited": approval.edited_params}
    else:
        raise Http404("unknown part")
    document = json.dumps(value, cls=DjangoJSONEncoder, indent=2, ensure_ascii=False)
    response = HttpResponse(untrusted.escape_json(document), content_type="application/json")
    response["Content-Disposition"] = f'inline; filename="{run.pk}-{kind}.json"'
    return response


# --------------------------------------------------------------------------------------------
# Actions


@dataclass(frozen=True)
class ActionSpec:
    form: type
    # Does it and says what was recorded; _answer adds what the run does now (from its state).
    perform: Callable[[Run, Any, dict, HttpRequest], str]
    says_what_next: bool = True


def _approval_of(run: Run, data: dict) -> ApprovalRequest:
    return get_object_or_404(ApprovalRequest, pk=data["approval"], run=run)


def _step_of(run: Run, data: dict) -> Step:
    return get_object_or_404(Step, pk=data["step"], run=run)


def _as_seen(data: dict) -> dict:
    """What every action form carries: the person's comment and the run version they acted on."""
    return {"comment": data["comment"], "expected_version": data["expected_version"]}


def _approve(run, user, data, request):
    approval = _approval_of(run, data)
    conditions = actions.parse_conditions(data.get("conditions", ""), approval.approved_params)
    approval = actions.decide_approval(
        approval.pk, user, "approved", conditions=conditions, **_as_seen(data)
    )
    if approval.awaits_second:
        return _("Your approval is recorded; the run waits for a second approver (another person).")
    if conditions:
        return _("Approved, only if %(conditions)s.") % {
            "conditions": "; ".join(describe_condition(c) for c in conditions)
        }
    return _("Approved.")


def _approve_edits(run, user, data, request):
    if not data.get("approval"):
        raise actions.ActionRefused(_("There is no approval to decide."))
    approval = _approval_of(run, data)
    conditions = actions.parse_conditions(data.get("conditions", ""), data["params"])
    actions.decide_approval(
        approval.pk,
        user,
        "approved_with_edits",
        edited_params=data["params"],
        conditions=conditions,
        **_as_seen(data),
    )
    if conditions:
        return _("Approved with your edits, only if %(conditions)s.") % {
            "conditions": "; ".join(describe_condition(c) for c in conditions)
        }
    return _("Approved with your edits: the call uses your parameters.")


def _reject(run, user, data, request):
    actions.decide_approval(_approval_of(run, data).pk, user, "rejected", **_as_seen(data))
    return _("Rejected.")


def _confirm_happened(run, user, data, request):
    step = _step_of(run, data)
    actions.confirm_outcome(step.pk, user, happened=True, proof=data["proof"], **_as_seen(data))
    return _("Recorded as done, with your reference as proof.")


def _confirm_not_happened(run, user, data, request):
    actions.confirm_outcome(_step_of(run, data).pk, user, happened=False, **_as_seen(data))
    return _("Recorded as not done: the step will be sent again with the same idempotency key.")


def _retry(run, user, data, request):
    actions.retry_step(run.pk, user, **_as_seen(data))
    return _("The step will be tried again.")


def _retry_edits(run, user, data, request):
    actions.retry_with_edits(run.pk, user, data["params"], **_as_seen(data))
    return _("The step will be tried again with your parameters.")


def _skip(run, user, data, request):
    actions.skip_step(
        run.pk, user, reason=data["comment"], expected_version=data["expected_version"]
    )
    return _("Step skipped.")


def _complete(run, user, data, request):
    actions.complete_by_hand(run.pk, user, result=data["result"], **_as_seen(data))
    return _("Step marked done by hand.")


def _take_over(run, user, data, request):
    actions.take_over(run.pk, user, **_as_seen(data))
    return _("You have taken this run over. Automation will not touch it until you release it.")


def _release(run, user, data, request):
    actions.release(
        run.pk,
        user,
        needed_engineer=data["needed_engineer"],
        engineer_note=data["engineer_note"],
        **_as_seen(data),
    )
    return _("Released.")


def _cancel(run, user, data, request):
    run = actions.cancel_run(
        run.pk, user, reason=data["comment"], expected_version=data["expected_version"]
    )
    # "The run is cancelled. …" follows; while side effects are undone first, say it here.
    return "" if run.status == Run.Status.CANCELLED else _("Cancelled.")


def _reassign(run, user, data, request):
    version, comment = data["expected_version"], data["comment"]
    if data.get("to_queue"):
        actions.move_to_queue(
            run.pk, user, queue=data["to_queue"], comment=comment, expected_version=version
        )
        return _("Moved to the queue %(queue)s.") % {"queue": data["to_queue"]}
    to = get_user_model().objects.filter(username=data["to"].strip()).first()
    if to is None:
        raise actions.ActionRefused(_("There is nobody called %(name)s.") % {"name": data["to"]})
    actions.reassign(run.pk, user, to=to, comment=comment, expected_version=version)
    return _("Handed to %(name)s.") % {"name": to.get_username()}


ACTIONS: dict[str, ActionSpec] = {
    "approve": ActionSpec(ApproveForm, _approve),
    "approve_edits": ActionSpec(EditParamsForm, _approve_edits),
    "reject": ActionSpec(RejectForm, _reject),
    "confirm_happened": ActionSpec(ConfirmHappenedForm, _confirm_happened),
    "confirm_not_happened": ActionSpec(StepForm, _confirm_not_happened),
    "retry": ActionSpec(ActionForm, _retry),
    "retry_edits": ActionSpec(EditParamsForm, _retry_edits),
    "skip": ActionSpec(ReasonForm, _skip),
    "complete": ActionSpec(CompleteForm, _complete),
    "take_over": ActionSpec(ActionForm, _take_over, says_what_next=False),
    "release": ActionSpec(ReleaseForm, _release),
    "cancel": ActionSpec(ReasonForm, _cancel),
    "reassign": ActionSpec(ReassignForm, _reassign),
}


def _bind(spec: ActionSpec, data, run: Run, user):
    if spec.form is not EditParamsForm:
        return spec.form(data)
    ctx = console.build_run_context(run, user)
    fields = ctx.edit_fields or {"tool": "", "params": {}}
    return EditParamsForm(data, conditions=spec.perform is _approve_edits, **fields)


@dataclass
class Acted:
    """What one console action on a run came to: `status` 200 (done, `message` says what was
    recorded and what the run does now), 403 (taken over: `message` says by whom), 409 (the run
    moved on: `message` is the conflict sentence), 422 (refused or the form is wrong: `form`
    carries the errors) or 428 (another person's soft claim: `claim`; acting anyway needs
    `despite_claim`). Nothing is written unless the status is 200."""

    status: int
    message: str = ""
    form: Any = None
    claim: Any = None


def act(run: Run, user, action: str, data, *, despite_claim: bool = False) -> Acted:
    """The console's action `action` on `run` by `user` with its form's `data`: the same checks
    and records wherever the person pressed the button (the run page, a mail link, Slack)."""
    spec = ACTIONS[action]
    if not may_act(user, run):
        owner = run.owner.get_username() if run.owner else "?"
        return Acted(
            403,
            _("%(owner)s has taken this run over; only they or an admin can act on it.")
            % {"owner": owner},
        )
    form = _bind(spec, data, run, user)
    if not form.is_valid():
        return Acted(422, _("Check the form."), form=form)
    _as_still_shown(run, form.cleaned_data)
    held = live.claim_held_by_other(run, user)
    if held and not despite_claim:
        # A soft claim warns, it does not refuse: the forms come back carrying the confirmation.
        return Acted(428, live.claim_warning(held), form=form, claim=held)
    try:
        message = spec.perform(run, user, form.cleaned_data, None)
    except (actions.DecisionConflict, TransitionError):
        return Acted(409, console.conflict_message(_fresh(run)))
    except actions.ActionRefused as exc:
        field = getattr(exc, "field", None)
        if field in form.fields:
            form.add_error(field, str(exc))
        return Acted(422, str(exc), form=form)
    except actions.ActionForbidden as exc:
        # The run was taken over between loading the page and pressing the button.
        return Acted(403, str(exc))
    logger.info("console action %s on run %s by %s", action, run.pk, user.get_username())
    if spec.says_what_next:
        message = console.sentences(message, console.what_happens_next(_fresh(run), user))
    return Acted(200, message)


@require_POST
@console_view(act=True)
def run_action(request: HttpRequest, run_id, action: str) -> HttpResponse:
    if action not in ACTIONS:
        raise Http404("unknown action")
    run = _get_run(run_id)
    despite_claim = request.POST.get("despite_claim") == "1"
    acted = act(run, request.user, action, request.POST, despite_claim=despite_claim)
    if acted.status == 403:
        return forbidden(request, acted.message)
    if acted.status == 200:
        return _answer(request, _fresh(run), status=200, success=acted.message)
    if acted.status == 409:
        return _answer(request, run, status=409, error=acted.message)
    bound, extra = {action: acted.form}, {"despite_claim": True} if acted.claim else {}
    return _answer(request, run, status=422, error=acted.message, bound=bound, **extra)


def _as_still_shown(run: Run, data: dict) -> None:
    """A page whose run moved only in ways a person does not act on (an outage's probes:
    live.actionable_state is as the page showed it) acts on the run as it is now. The action
    still checks the version under the run's lock, so a change after this read is refused."""
    shown = data.get("expected_state")
    if data.get("expected_version") == run.lock_version or not shown:
        return
    if shown == live.actionable_state(run.pk):
        data["expected_version"] = run.lock_version


def _fresh(run: Run) -> Run:
    return Run.objects.select_related("owner").get(pk=run.pk)


def _answer(request, run, *, status, success="", error="", bound=None, **extra) -> HttpResponse:
    """htmx: the refreshed run (header, steps, actions) with the outcome; otherwise the page
    itself (errors) or a redirect to it (success, so a reload does not post again)."""
    if not request.htmx:
        if status == 200:
            messages.success(request, success)
            return redirect(reverse("console:run-detail", args=[run.pk]), permanent=False)
        context = _detail_context(request, _fresh(run), error=error, bound=bound, **extra)
        return render(request, "console/run_detail.html", context, status=status)
    if status == 409:
        run, bound = _fresh(run), None
    context = _detail_context(request, run, success=success, error=error, bound=bound, **extra)
    return render(request, "console/run_detail.html#run-main", context, status=status)

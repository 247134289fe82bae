"""The live console's endpoints (approvals/live.py): the inbox's conditional poll, a run page's
live bar (who else is viewing, the soft claim, the stale-page banner) and “I'll handle it”."""

from __future__ import annotations

from datetime import UTC, datetime

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET, require_POST

from approvals import live, views
from approvals.models import ClaimHeld, SoftClaim
from approvals.permissions import can_act, is_admin
from runs.models import InvalidTransition, Run


@require_GET
@views.console_view()
def inbox_live(request: HttpRequest) -> HttpResponse:
    """The inbox's every-5-seconds poll: 304 after one query when nothing changed, else the
    inbox fragment as views.inbox renders it."""
    etag = live.etag_for(request, live.inbox_stamp())
    if live.not_modified(request, etag):
        return live.answer_not_modified(etag)
    return live.revalidate(views.inbox(request), etag)


@require_GET
@views.console_view()
def run_main_live(request: HttpRequest, run_id) -> HttpResponse:
    """A live run's every-2-seconds refresh of #run-main: 304 after one query while the run
    and its claim are as they were, else views.run_detail's fragment."""
    stamp = live.run_stamp(run_id)
    if stamp is None:
        raise Http404("no such run")
    etag = live.etag_for(request, stamp)
    if live.not_modified(request, etag):
        return live.answer_not_modified(etag)
    return live.revalidate(views.run_detail(request, run_id), etag)


def _int_param(request: HttpRequest, name: str) -> int | None:
    try:
        return int(request.GET.get(name) or request.POST.get(name) or "")
    except ValueError:
        return None


@require_GET
@views.console_view()
def run_live(request: HttpRequest, run_id) -> HttpResponse:
    """A run page's live bar, polled every few seconds. `v` is the run version the page shows,
    `t` when it was rendered (epoch seconds). Registers the viewer (cache), then answers 304 or
    the bar: who else is here, the claim, and whether the page is stale."""
    stamp = live.run_stamp(run_id)
    if stamp is None:
        # Before the viewer is registered: a run that does not exist gets no presence entry.
        raise Http404("no such run")
    others = live.touch_presence(run_id, request.user)
    shown = _int_param(request, "v")
    etag = live.etag_for(request, stamp, [(v.username, v.since) for v in others])
    if live.not_modified(request, etag):
        return live.answer_not_modified(etag)
    return live.revalidate(_render_bar(request, run_id, others, shown), etag)


def _render_bar(request, run_id, others, shown: int | None, *, error: str = "") -> HttpResponse:
    """The bar. The page is stale only when what a person acts on moved (live.actionable_state:
    an outage's probes do not count) because another person acted since it was opened: the
    banner says who did what, and the page's actions wait for a reload. When the run moved on
    by itself, or by this person's own action, the bar asks the page to refresh its main area
    instead (static/js/console.js; not while the person is typing in a form there)."""
    run = get_object_or_404(Run, pk=run_id)
    moved = (
        shown is not None
        and run.lock_version != shown
        and request.GET.get("s", request.POST.get("s")) != live.actionable_state(run.pk)
    )
    opened = _int_param(request, "t")
    opened_at = datetime.fromtimestamp(opened, tz=UTC) if opened else None
    other = live.decided_by_another(run, opened_at, request.user) if moved else None
    claim = live.active_claim(run.pk)
    context = {
        "run": run,
        "others": others,
        "claim": claim,
        "mine": bool(claim and claim.user_id == request.user.pk),
        "may_claim": can_act(request.user) and not run.is_terminal,
        "stale": other is not None,
        "refresh": moved and other is None,
        "changed": live.what_changed(run, other) if other is not None else "",
        "now": timezone.now(),
        "error": error,
    }
    return render(request, "console/_live_bar.html", context)


CLAIM_VERBS = ("claim", "extend", "release")


@require_POST
@views.console_view(act=True)
def run_claim(request: HttpRequest, run_id, verb: str) -> HttpResponse:
    """“I'll handle it” (claim), “more time” (extend: the same, by the holder) and release."""
    if verb not in CLAIM_VERBS:
        raise Http404("unknown claim verb")
    run = get_object_or_404(Run, pk=run_id)
    error = ""
    try:
        if verb == "release":
            if not SoftClaim.release(run, request.user, admin=is_admin(request.user)):
                error = _("There is no claim of yours to release.")
        else:
            SoftClaim.claim(run, request.user, minutes=live.claim_minutes())
    except ClaimHeld as exc:
        error = live.claim_warning_held(exc.claim)
    except InvalidTransition:
        error = _("This run has finished; there is nothing to handle.")
    if not request.htmx:
        if error:
            messages.error(request, error)
        return redirect(reverse("console:run-detail", args=[run.pk]), permanent=False)
    others = live.touch_presence(run.pk, request.user)
    shown = _int_param(request, "v")
    response = _render_bar(request, run.pk, others, shown, error=error)
    response.status_code = 409 if error else 200
    return response

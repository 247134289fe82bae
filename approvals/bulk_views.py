"""Console pages of bulk actions (approvals/bulk.py): choose the action for the filtered runs,
see the preview, start it, watch its progress (a fragment polled while it runs, read from the
database, so a reload shows the same) and read the result per run."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import path
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_POST

from approvals import actions, bulk
from approvals.console import REASON_LABELS
from approvals.forms import BulkPreviewForm, first_error
from approvals.models import known_queues
from approvals.models.bulk import MAX_RUNS, BulkAction, BulkItemStatus, BulkVerb
from approvals.permissions import ACT, ActionForbidden, forbidden, is_admin, require_role
from runs.models import Run

FILTER_LABELS = {
    "workflow": gettext_lazy("Workflow"),
    "step": gettext_lazy("Step"),
    "tool": gettext_lazy("Tool"),
    "reason": gettext_lazy("Failure class"),
    "queue": gettext_lazy("Queue"),
    "status": gettext_lazy("Status"),
    "owner": gettext_lazy("Owner"),
    "date_from": gettext_lazy("Started from"),
    "date_to": gettext_lazy("Started to"),
}
PARAMS = ("comment", "needed_engineer", "to", "to_queue", "despite_claims")
SAMPLE = 20
RESULT_PAGE = 200


def _options() -> dict[str, list[tuple[str, str]]]:
    """The filters with a fixed set of values, as (value, label) for a select ("" = any)."""
    anything = [("", "—")]
    unfinished = [(v, t) for v, t in Run.Status.choices if v not in Run.TERMINAL]
    return {
        "reason": anything + [(v, str(t)) for v, t in REASON_LABELS.items()],
        "status": anything + [("inbox", _("Waiting for a person (the inbox)"))] + unfinished,
        "owner": anything
        + [
            ("mine", _("Taken over by me")),
            ("unassigned", _("Unassigned")),
            ("unclaimed", _("Nobody handling it")),
        ],
    }


def _form_context(request, values: dict, error: str = "", field: str | None = None) -> dict:
    actions_offered = [
        (v, label)
        for v, label in BulkVerb.choices
        if v != BulkVerb.CANCEL or is_admin(request.user)
    ]
    return {
        "values": values,
        "filters": [
            (n, FILTER_LABELS[n], values.get(n, ""), _options().get(n)) for n in bulk.FILTERS
        ],
        "actions": actions_offered,
        "error": error,
        "error_field": field,
        "max_runs": MAX_RUNS,
        "queues": known_queues(),
    }


@require_GET
@never_cache
@require_role(ACT)
def bulk_new(request: HttpRequest) -> HttpResponse:
    values = {k: v for k, v in request.GET.items() if k in (*bulk.FILTERS, "action")}
    return render(request, "console/bulk_new.html", _form_context(request, values))


@require_POST
@require_role(ACT)
def bulk_preview(request: HttpRequest) -> HttpResponse:
    data = request.POST
    values = {k: data.get(k, "") for k in (*bulk.FILTERS, *PARAMS, "action")}
    form = BulkPreviewForm(data)
    if not form.is_valid():  # a NUL, an invisible character in a name, a day with no end…
        error, field = first_error(form)
        context = _form_context(request, values, error, field)
        return render(request, "console/bulk_new.html", context, status=422)
    action = form.cleaned_data["action"]
    try:
        job = bulk.preview(request.user, action, form.filters(), form.params())
    except ActionForbidden as exc:
        return forbidden(request, str(exc))
    except bulk.BulkError as exc:
        context = _form_context(request, values, str(exc), exc.field)
        return render(request, "console/bulk_new.html", context, status=422)
    return redirect("console:bulk-detail", job.pk)


def _job(request, bulk_id) -> BulkAction:
    return get_object_or_404(BulkAction.objects.select_related("user"), pk=bulk_id)


@require_GET
@never_cache
@require_role(ACT)
def bulk_detail(request: HttpRequest, bulk_id: int) -> HttpResponse:
    job = _job(request, bulk_id)
    items = job.items.select_related("run", "run__owner").order_by("position")
    evidence = job.action.startswith("confirm")
    context = {"job": job, "counts": job.counts(), "max_runs": MAX_RUNS, "evidence": evidence}
    if job.status == BulkAction.Status.PREVIEWED:
        context["sample"] = list(items.filter(status=BulkItemStatus.PENDING)[:SAMPLE])
        context["skipped"] = list(items.filter(status=BulkItemStatus.SKIPPED)[:RESULT_PAGE])
    elif job.status == BulkAction.Status.DONE:
        context["results"] = list(items[:RESULT_PAGE])
        context["result_page"] = RESULT_PAGE
    return render(request, "console/bulk_detail.html", context)


@require_GET
@never_cache
@require_role(ACT)
def bulk_progress(request: HttpRequest, bulk_id: int) -> HttpResponse:
    job = _job(request, bulk_id)
    response = render(request, "console/bulk_progress.html", {"job": job, "counts": job.counts()})
    if job.status == BulkAction.Status.DONE and request.htmx:
        response["HX-Refresh"] = "true"  # the result page
    return response


@require_POST
@require_role(ACT)
def bulk_execute(request: HttpRequest, bulk_id: int) -> HttpResponse:
    job = _job(request, bulk_id)
    try:
        bulk.start(job, request.user)
    except ActionForbidden as exc:
        return forbidden(request, str(exc))
    except actions.DecisionConflict:
        pass  # started already (a double submit): its page shows where it stands
    return redirect("console:bulk-detail", job.pk)


urlpatterns = [
    path("bulk/new/", bulk_new, name="bulk-new"),
    path("bulk/preview/", bulk_preview, name="bulk-preview"),
    path("bulk/<int:bulk_id>/", bulk_detail, name="bulk-detail"),
    path("bulk/<int:bulk_id>/progress/", bulk_progress, name="bulk-progress"),
    path("bulk/<int:bulk_id>/execute/", bulk_execute, name="bulk-execute"),
]

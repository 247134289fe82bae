"""Console pages of bulk actions (approvals/bulk.py): choose the action for the filtered runs,
see the preview, start it, watch its progress (a fragment polled while it runs, read from the
database, so a reload shows the same) and read the result per run."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.postgres.aggregates import ArrayAgg
from django.core.paginator import Paginator
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import path, re_path
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_POST

from approvals import actions, bulk, console
from approvals.console import REASON_LABELS, RUN_STATUS_LABELS
from approvals.forms import BulkPreviewForm, first_error
from approvals.models import known_queues
from approvals.models.bulk import MAX_RUNS, BulkAction, BulkActionItem, BulkItemStatus, BulkVerb
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
    "runs": gettext_lazy("Picked runs"),
}
PARAMS = ("comment", "needed_engineer", "to", "to_queue", "despite_claims")
SAMPLE = 20
# Runs named beside each group of skipped runs (the count says how many there are).
SKIPPED_EXAMPLES = 5
RESULT_PAGE = 200


def _options() -> dict[str, list[tuple[str, str]]]:
    """The filters with a fixed set of values, as (value, label) for a select ("" = any)."""
    anything = [("", "—")]
    unfinished = [(v, RUN_STATUS_LABELS[v]) for v in Run.Status.values if v not in Run.TERMINAL]
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
            (n, FILTER_LABELS[n], values.get(n, ""), _options().get(n))
            for n in bulk.FILTERS
            if n != "runs"
        ],
        "picked": len([p for p in values.get("runs", "").split(",") if p.strip()]),
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
    # Runs picked with the list's checkboxes come as one `runs` each.
    picked = [v for v in request.GET.getlist("runs") if v]
    if picked:
        values["runs"] = ",".join(picked)
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
    context = {
        "job": job,
        "counts": job.counts(),
        "max_runs": MAX_RUNS,
        "evidence": evidence,
        "status_label": bulk.STATUS_LABELS[job.status],
        "action_label": bulk.ACTION_LABELS[job.action],
        "tool_health": sorted(job.tool_health.items()),
        "filter_chips": filter_chips(job.filters),
        "may_control": job.user_id == request.user.pk or is_admin(request.user),
    }
    if job.status == BulkAction.Status.PREVIEWED:
        context["sample"] = list(items.filter(status=BulkItemStatus.PENDING)[:SAMPLE])
        context["skipped_groups"] = skipped_by_reason(job)
    else:
        results = list(items[:RESULT_PAGE])
        for item in results:
            item.now = now_status(item.run)
            item.status_label = bulk.ITEM_LABELS[item.status]
        context["results"] = results
        context["result_page"] = RESULT_PAGE
        context["to_retry"] = sum(1 for i in results if i.now[0] in ("failed", "parked"))
    return render(request, "console/bulk_detail.html", context)


def filter_chips(filters: dict) -> list[tuple[str, str]]:
    """The filters a job was selected with, as a person reads them: each filter's label and
    its value's label (a failure class, a status, an owner choice) in the reader's language;
    names and dates as given."""
    fields = BulkPreviewForm.base_fields
    choices = {name: dict(options) for name, options in _options().items()}
    chips = []
    for name, value in filters.items():
        if not value or name == "runs":
            continue
        field = fields.get(name)
        label = str(field.label) if field is not None and field.label else name
        shown = choices.get(name, {}).get(value, value)
        chips.append((label, str(shown)))
    return chips


def skipped_by_reason(job: BulkAction) -> list[dict]:
    """The skipped runs grouped by why (one query): a reason, how many, and a few runs."""
    groups = (
        job.items.filter(status=BulkItemStatus.SKIPPED)
        .values("reason")
        .annotate(n=Count("id"), runs=ArrayAgg("run_id", ordering="position"))
        .order_by("-n", "reason")
    )
    return [{**g, "runs": g["runs"][:SKIPPED_EXAMPLES]} for g in groups]


def now_status(run: Run) -> tuple[str, str]:
    """Where the run stands now, beside what the bulk action did: (kind, label)."""
    if run.status == Run.Status.SUCCEEDED:
        kind = "succeeded"
    elif run.status in Run.HUMAN:
        kind = "parked"
    elif run.status in Run.TERMINAL:
        kind = "failed" if run.status == Run.Status.FAILED else "finished"
    else:
        kind = "running"
    return kind, str(console.label(console.RUN_STATUS_LABELS, run.status))


@require_GET
@never_cache
@require_role(ACT)
def bulk_progress(request: HttpRequest, bulk_id: int) -> HttpResponse:
    job = _job(request, bulk_id)
    context = {"job": job, "counts": job.counts(), "status_label": bulk.STATUS_LABELS[job.status]}
    response = render(request, "console/bulk_progress.html", context)
    if job.status != BulkAction.Status.RUNNING and request.htmx:
        response["HX-Refresh"] = "true"  # the result page (done, paused or stopped)
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


@require_POST
@require_role(ACT)
def bulk_control(request: HttpRequest, bulk_id: int, move: str) -> HttpResponse:
    job = _job(request, bulk_id)
    try:
        bulk.control(job, request.user, move)
    except ActionForbidden as exc:
        return forbidden(request, str(exc))
    except (actions.DecisionConflict, bulk.BulkError) as exc:
        messages.error(request, str(exc))
    return redirect("console:bulk-detail", job.pk)


@require_POST
@require_role(ACT)
def bulk_retry_failed(request: HttpRequest, bulk_id: int) -> HttpResponse:
    job = _job(request, bulk_id)
    if job.status in (BulkAction.Status.PREVIEWED, BulkAction.Status.RUNNING):
        messages.error(request, _("Pause, stop or let it finish first."))
        return redirect("console:bulk-detail", job.pk)
    try:
        retry = bulk.retry_failed(job, request.user)
    except ActionForbidden as exc:
        return forbidden(request, str(exc))
    except bulk.BulkError as exc:
        messages.error(request, str(exc))
        return redirect("console:bulk-detail", job.pk)
    return redirect("console:bulk-detail", retry.pk)


JOBS_PAGE = 50


@require_GET
@never_cache
@require_role(ACT)
def bulk_jobs(request: HttpRequest) -> HttpResponse:
    """Past and running bulk jobs, newest first: who, when, what, how far (three queries)."""
    jobs = BulkAction.objects.select_related("user").order_by("-id")
    page = Paginator(jobs, JOBS_PAGE).get_page(request.GET.get("page"))
    counts: dict[int, dict[str, int]] = {job.pk: {} for job in page.object_list}
    rows = (
        BulkActionItem.objects.filter(bulk_action__in=list(counts))
        .values_list("bulk_action_id", "status")
        .annotate(n=Count("id"))
    )
    for job_id, status, n in rows:
        counts[job_id][status] = n
    for job in page.object_list:
        found = counts[job.pk]
        job.total = sum(found.values())
        job.finished = job.total - found.get(BulkItemStatus.PENDING, 0)
        job.done = found.get(BulkItemStatus.DONE, 0)
        job.failed = found.get(BulkItemStatus.FAILED, 0)
        job.skipped = found.get(BulkItemStatus.SKIPPED, 0)
        job.status_label = bulk.STATUS_LABELS[job.status]
        job.action_label = bulk.ACTION_LABELS[job.action]
    return render(request, "console/bulk_jobs.html", {"page": page})


urlpatterns = [
    path("bulk/", bulk_jobs, name="bulk-jobs"),
    path("bulk/<int:bulk_id>/retry-failed/", bulk_retry_failed, name="bulk-retry-failed"),
    path("bulk/new/", bulk_new, name="bulk-new"),
    path("bulk/preview/", bulk_preview, name="bulk-preview"),
    path("bulk/<int:bulk_id>/", bulk_detail, name="bulk-detail"),
    path("bulk/<int:bulk_id>/progress/", bulk_progress, name="bulk-progress"),
    path("bulk/<int:bulk_id>/execute/", bulk_execute, name="bulk-execute"),
    re_path(
        r"^bulk/(?P<bulk_id>[0-9]+)/(?P<move>pause|resume|stop)/$",
        bulk_control,
        name="bulk-control",
    ),
]

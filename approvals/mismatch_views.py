"""Side effects their systems no longer show as recorded (runs.engine.consistency): the list the
metrics page's "Missing or different externally" figure and its alert lead to.

Read-only, for every console role. Newest first by (found_at, id), a page found from the last
row shown (never OFFSET), one query per page whatever the depth.
"""

from __future__ import annotations

from datetime import datetime

from django.db.models import Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import path
from django.utils.dateparse import parse_datetime
from django.utils.translation import gettext_lazy
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from approvals.permissions import READ, require_role
from runs.models import ExternalMismatch

PAGE_SIZE = 50
STATES = {
    "open": gettext_lazy("Open"),
    "resolved": gettext_lazy("Resolved"),
    "all": gettext_lazy("All"),
}


class BadCursor(ValueError):
    """A page link that is not one this page gave out."""


def _cursor(row: ExternalMismatch) -> str:
    return f"{row.found_at.isoformat()}_{row.pk}"


def _parse_cursor(text: str) -> tuple[datetime, int]:
    at, _, ident = text.rpartition("_")
    found_at = parse_datetime(at) if at else None
    if found_at is None or not ident.isdigit() or len(ident) > 18:
        raise BadCursor(text)
    return found_at, int(ident)


def mismatch_page(state: str, after: str | None) -> tuple[list[ExternalMismatch], str]:
    """One page of mismatches in `state`, newest first, after the cursor `after`; and the
    cursor of the next page ("" on the last). Raises BadCursor."""
    rows = ExternalMismatch.objects.select_related("side_effect", "run")
    if state == "open":
        rows = rows.filter(resolved_at__isnull=True)
    elif state == "resolved":
        rows = rows.filter(resolved_at__isnull=False)
    if after:
        found_at, ident = _parse_cursor(after)
        rows = rows.filter(Q(found_at__lt=found_at) | Q(found_at=found_at, pk__lt=ident))
    found = list(rows.order_by("-found_at", "-pk")[: PAGE_SIZE + 1])
    more = len(found) > PAGE_SIZE
    found = found[:PAGE_SIZE]
    return found, _cursor(found[-1]) if more else ""


@require_GET
@never_cache
@require_role(READ)
def mismatch_list(request: HttpRequest) -> HttpResponse:
    state = request.GET.get("state", "open")
    state = state if state in STATES else "open"
    try:
        rows, older = mismatch_page(state, request.GET.get("after"))
        status = 200
    except BadCursor:
        rows, older, status = None, "", 400
    context = {"rows": rows, "older": older, "state": state, "states": STATES}
    return render(request, "console/mismatches.html", context, status=status)


urlpatterns = [path("mismatches/", mismatch_list, name="mismatches")]

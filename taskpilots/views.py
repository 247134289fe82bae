from __future__ import annotations

import time

from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect
from django.templatetags.static import static
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from taskpilots.celery import app as celery_app


def _check_database() -> str:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except Exception as exc:  # any failure means "not answering"; the message says which
        return f"error: {type(exc).__name__}: {exc}"[:300]
    return "ok"


def _check_broker() -> str:
    try:
        with celery_app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
    except Exception as exc:
        return f"error: {type(exc).__name__}: {exc}"[:300]
    return "ok"


@require_GET
@never_cache
def healthz(request: HttpRequest) -> JsonResponse:
    """200 only when both the database and the broker answer; 503 otherwise, naming which."""
    started = time.monotonic()
    body = {"database": _check_database(), "broker": _check_broker()}
    body["ok"] = body["database"] == "ok" and body["broker"] == "ok"
    body["elapsed_ms"] = round((time.monotonic() - started) * 1000, 1)
    return JsonResponse(body, status=200 if body["ok"] else 503)


@require_GET
def favicon(request: HttpRequest) -> HttpResponse:
    """Browsers ask for /favicon.ico whatever a page's <link rel="icon"> says: the icon it names."""
    return redirect(static("favicon.svg"), permanent=True)

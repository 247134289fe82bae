"""Every response under /api/v1/ is the documented error JSON, also those django-ninja never sees.

Django answers unknown paths (under DEBUG, with a page listing every URL of the project), ninja
answers a method an endpoint does not have (405), and Django itself refuses a bad Host header or
fails outside any view: all in HTML. This middleware (first in settings.MIDDLEWARE, so it sees
the final response) replaces such an answer with `{"error": {"code", "message", "field"}}` and
keeps the headers that matter (`Allow` on a 405). It also refuses oversized request headers
(431) before any other code reads them. Errors the HTTP server answers itself, before Django
runs, come from taskpilots/gunicorn_conf.py in the same shape.
"""

from __future__ import annotations

import json

from django.http import HttpRequest, HttpResponse

from taskpilots.env import env_int

API_PREFIX = "/api/v1/"
MAX_HEADER_BYTES = env_int("TASKPILOTS_API_MAX_HEADER_BYTES", 16 * 1024, minimum=1024)

CODES = {
    400: "bad_request",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    411: "length_required",
    413: "body_too_large",
    414: "uri_too_long",
    415: "unsupported_media_type",
    431: "headers_too_large",
    500: "server_error",
}


def error_response(status: int, message: str, *, code: str = "") -> HttpResponse:
    body = {
        "error": {
            "code": code or CODES.get(status, "http_error"),
            "message": message,
            "field": None,
        }
    }
    return HttpResponse(json.dumps(body), status=status, content_type="application/json")


def _header_bytes(request: HttpRequest) -> int:
    return sum(
        len(name) + len(str(value))
        for name, value in request.META.items()
        if name.startswith("HTTP_") or name in ("CONTENT_TYPE", "CONTENT_LENGTH")
    )


def _message(request: HttpRequest, response: HttpResponse) -> str:
    status = response.status_code
    if status == 404:
        return f"There is no API endpoint at {request.path}; see /api/v1/openapi.json."
    if status == 405:
        return f"{request.method} is not allowed here; allowed: {response.get('Allow', '')}."
    if status >= 500:
        return "Internal error; logged."
    return response.reason_phrase


class ApiErrorShapeMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not request.path.startswith(API_PREFIX):
            return self.get_response(request)
        if _header_bytes(request) > MAX_HEADER_BYTES:
            return error_response(
                431, f"The request headers are larger than {MAX_HEADER_BYTES} bytes."
            )
        response = self.get_response(request)
        media_type = response.get("Content-Type", "").split(";")[0].strip().lower()
        if response.status_code < 400 or media_type == "application/json":
            return response
        shaped = error_response(response.status_code, _message(request, response))
        for header in ("Allow", "WWW-Authenticate", "Retry-After"):
            if header in response:
                shaped[header] = response[header]
        return shaped

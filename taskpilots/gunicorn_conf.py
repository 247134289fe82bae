"""gunicorn configuration (`gunicorn -c python:taskpilots.gunicorn_conf taskpilots.wsgi`).

gunicorn refuses some requests before Django runs — request headers or a request line over its
limits, malformed requests — with an HTML page of its own. The API documents one error shape
for every response, so these workers write the same JSON as runs/api/middleware.py instead
(for the console too: the request was never parsed, so its path is not known).
"""

from __future__ import annotations

import json

from gunicorn import util
from gunicorn.http import errors
from gunicorn.workers.gthread import ThreadWorker
from gunicorn.workers.sync import SyncWorker

worker_class = "taskpilots.gunicorn_conf.JsonErrorSyncWorker"

# (status, reason, code) for the client errors gunicorn detects while reading a request.
_CLIENT_ERRORS = (
    (errors.LimitRequestHeaders, 431, "Request Header Fields Too Large", "headers_too_large"),
    (errors.LimitRequestLine, 414, "URI Too Long", "uri_too_long"),
    (errors.ExpectationFailed, 417, "Expectation Failed", "expectation_failed"),
    (errors.UnsupportedTransferCoding, 501, "Not Implemented", "unsupported_transfer_coding"),
    (
        (
            errors.InvalidRequestLine,
            errors.InvalidRequestMethod,
            errors.InvalidHTTPVersion,
            errors.InvalidHeader,
            errors.InvalidHeaderName,
            errors.ObsoleteFolding,
            errors.InvalidChunkSize,
            errors.ChunkMissingTerminator,
            errors.InvalidSchemeHeaders,
        ),
        400,
        "Bad Request",
        "bad_request",
    ),
)


class JsonErrorsMixin:
    def handle_error(self, req, client, addr, exc):
        match = next((entry for entry in _CLIENT_ERRORS if isinstance(exc, entry[0])), None)
        if match is None:
            return super().handle_error(req, client, addr, exc)
        _kinds, status, reason, code = match
        self.log.warning("Invalid request from ip=%s: %s", (addr or ("",))[0], exc)
        message = f"{reason}: {exc}"[:500]
        body = json.dumps({"error": {"code": code, "message": message, "field": None}}).encode()
        head = (
            f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode("latin-1")
        try:
            util.write_nonblock(client, head + body)
        except Exception:
            self.log.debug("Failed to send error message.")


class JsonErrorSyncWorker(JsonErrorsMixin, SyncWorker):
    pass


class JsonErrorThreadWorker(JsonErrorsMixin, ThreadWorker):
    pass

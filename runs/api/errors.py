"""The API's one error format and its guard against hostile bodies.

Every error answers `{"error": {"code": "...", "message": "...", "field": "input.customer"}}`
(`field` is null when no single field is at fault). Bodies are checked before anything reads them
as data: size (413, also for chunked bodies) and media type (415) before authentication and
parsing (`guard_json_body`), then UTF-8, JSON syntax, NUL bytes and unpaired surrogates
(PostgreSQL cannot store either), nesting depth and string lengths (400), so a rejected request
never reaches the database.
"""

from __future__ import annotations

import io
import json
import logging
import math
from typing import Any

from django.http import Http404, HttpRequest, HttpResponse
from django.http.request import RawPostDataException
from django.utils.http import parse_header_parameters
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.parser import Parser
from pydantic_core import PydanticCustomError

from runs import invisible
from taskpilots.env import env_int

logger = logging.getLogger("taskpilots.api")

MAX_BODY_BYTES = env_int("TASKPILOTS_API_MAX_BODY_BYTES", 256 * 1024, minimum=1024)
MAX_JSON_DEPTH = env_int("TASKPILOTS_API_MAX_JSON_DEPTH", 20, minimum=2)
MAX_STRING_CHARS = env_int("TASKPILOTS_API_MAX_STRING_CHARS", 32 * 1024, minimum=64)
MAX_KEY_CHARS = 200


class ApiError(Exception):
    def __init__(
        self, status: int, code: str, message: str, *, field: str | None = None, **extra: Any
    ):
        super().__init__(message)
        self.status, self.code, self.message, self.field = status, code, message, field
        self.extra = extra

    def body(self) -> dict:
        return {
            "error": {"code": self.code, "message": self.message, "field": self.field, **self.extra}
        }


def field_path(parts) -> str | None:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or None


# --------------------------------------------------------------------------------------------
# Body guard

JSON_MEDIA_TYPE = "application/json"
_READ_CHUNK = 64 * 1024


def guard_json_body(request: HttpRequest) -> None:
    """Refuse a body that is too large or not JSON before anything reads or parses it.

    1. A declared Content-Length over the limit: 413 without reading a byte.
    2. Any media type but application/json (a `charset` other than UTF-8 included): 415.
    3. Read the body with the limit, so an undeclared (chunked) length cannot grow past it: 413.
       Django reads a chunked body under WSGI as empty (it trusts Content-Length only), so the
       server's de-chunked stream is read here when the server says it ends
       (`wsgi.input_terminated`, set by gunicorn); a server that cannot say so gets 411.
    The body read here is what Django and the parser see afterwards.
    """
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        raise ApiError(400, "invalid_request", "Content-Length is not a number.") from None
    if declared > MAX_BODY_BYTES:
        raise _too_large()
    media_type, params = parse_header_parameters(request.META.get("CONTENT_TYPE", ""))
    charset = params.get("charset", "utf-8").lower()
    if media_type.lower() != JSON_MEDIA_TYPE or charset not in ("utf-8", "utf8"):
        shown = request.META.get("CONTENT_TYPE") or "none"
        raise ApiError(
            415,
            "unsupported_media_type",
            f"Send the body as {JSON_MEDIA_TYPE} (UTF-8); got Content-Type: {shown[:100]}.",
        )
    if hasattr(request, "_body"):
        if len(request._body) > MAX_BODY_BYTES:
            raise _too_large()
        return
    chunked = "chunked" in request.META.get("HTTP_TRANSFER_ENCODING", "").lower()
    environ = getattr(request, "environ", {})
    if chunked and "wsgi.input" in environ:
        if not environ.get("wsgi.input_terminated"):
            raise ApiError(
                411,
                "length_required",
                "This server cannot read a chunked body; send it with Content-Length.",
            )
        stream = environ["wsgi.input"]
    else:
        stream = request  # reads Django's own stream (Content-Length bounded; whole under ASGI)
    parts, size = [], 0
    while size <= MAX_BODY_BYTES:
        part = stream.read(min(_READ_CHUNK, MAX_BODY_BYTES + 1 - size))
        if not part:
            break
        parts.append(part)
        size += len(part)
    if size > MAX_BODY_BYTES:
        raise _too_large()
    # Hand the bytes read here to Django (request.body) and to the parser: the stream is spent.
    request._body = b"".join(parts)
    request._stream = io.BytesIO(request._body)


def read_body(request: HttpRequest) -> bytes:
    """The raw body (already read and bounded by `guard_json_body`)."""
    try:
        body = request.body
    except RawPostDataException:  # pragma: no cover (the guard reads it first)
        raise ApiError(400, "invalid_request", "The body was already consumed.") from None
    if len(body) > MAX_BODY_BYTES:
        raise _too_large()
    return body


def _too_large() -> ApiError:
    return ApiError(413, "body_too_large", f"The body is larger than {MAX_BODY_BYTES} bytes.")


class JsonRefused(ApiError):
    """JSON text refused by `parse_json_text` (400). `reason` and `params` say what, so that the
    console can say it in the reader's language; `message` is the API's English."""

    def __init__(
        self, code: str, message: str, *, field: str | None = None, reason: str = "", **params
    ):
        super().__init__(400, code, message, field=field)
        self.reason = reason or code
        self.params = params


class _NotFinite(ValueError):
    pass


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotFinite(text)
    return value


def _no_constants(name: str):
    raise _NotFinite(name)


class _Duplicated(dict):
    """An object in which a key appeared twice: `check_json_value` refuses it with its path.
    (json keeps the last value; a person reading the body may see the first.)"""

    duplicate = ""


def _object(pairs: list[tuple[str, Any]]) -> dict:
    found = dict(pairs)
    if len(found) == len(pairs):
        return found
    seen: set[str] = set()
    for key, _value in pairs:
        if key in seen:
            duplicated = _Duplicated(found)
            duplicated.duplicate = key
            return duplicated
        seen.add(key)
    return found  # pragma: no cover (a length difference means a key came twice)


def parse_json_text(text: str, *, what: str = "The body") -> Any:
    """JSON text from an untrusted sender, as data, or `JsonRefused`: the one parser of the API's
    bodies and the console's JSON fields.

    Refused: invalid syntax; NaN, Infinity and numbers out of a double's range (PostgreSQL's
    JSON has none of them); a key twice in one object; nesting deeper than MAX_JSON_DEPTH
    (also where it is deep enough to exhaust the parser's recursion); NUL characters and unpaired
    surrogates (PostgreSQL stores neither); strings and keys over their length limits.
    """
    try:
        data = json.loads(
            text,
            parse_float=_finite_float,
            parse_constant=_no_constants,
            object_pairs_hook=_object,
        )
    except RecursionError:
        # Thousands of levels: far past the limit, whatever the parser managed to read.
        raise _too_deep(None) from None
    except _NotFinite as exc:
        raise JsonRefused(
            "invalid_json",
            f"{what} is not valid JSON: {exc} is not a finite JSON number.",
            reason="not_finite",
            value=str(exc)[:40],
        ) from None
    except ValueError as exc:
        raise JsonRefused(
            "invalid_json", f"{what} is not valid JSON: {exc}", reason="syntax", error=str(exc)
        ) from None
    check_json_value(data)
    return data


def parse_json_body(raw: bytes) -> Any:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(
            400, "invalid_utf8", f"The body is not valid UTF-8 (byte {exc.start})."
        ) from None
    return parse_json_text(text)


def _too_deep(where: str | None) -> JsonRefused:
    return JsonRefused(
        "too_deep",
        f"JSON is nested deeper than {MAX_JSON_DEPTH} levels.",
        field=where,
        limit=MAX_JSON_DEPTH,
    )


def _check_string(value: str, path: list, *, limit: int, what: str) -> None:
    where = field_path(path)
    if "\x00" in value:
        raise JsonRefused(
            "nul_byte", f"{what} contains a NUL character.", field=where, reason="nul_byte"
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise JsonRefused(
            "invalid_utf8",
            f"{what} contains an unpaired surrogate.",
            field=where,
            reason="surrogate",
        ) from None
    if len(value) > limit:
        raise JsonRefused(
            "string_too_long",
            f"{what} is longer than {limit} characters.",
            field=where,
            reason="key_too_long" if what == "A key" else "string_too_long",
            limit=limit,
        )


def check_json_value(data: Any) -> None:
    """Walk the document iteratively (no recursion for an attacker to exhaust)."""
    stack: list[tuple[Any, list, int]] = [(data, [], 1)]
    while stack:
        value, path, depth = stack.pop()
        if isinstance(value, dict | list) and depth > MAX_JSON_DEPTH:
            raise _too_deep(field_path(path))
        if isinstance(value, _Duplicated):
            where = field_path([*path, value.duplicate])
            raise JsonRefused(
                "duplicate_key",
                f"The key {value.duplicate!r} appears twice in one object; send it once.",
                field=where,
                key=value.duplicate[:100],
            )
        if isinstance(value, dict):
            for key, item in value.items():
                _check_string(key, [*path, key], limit=MAX_KEY_CHARS, what="A key")
                stack.append((item, [*path, key], depth + 1))
        elif isinstance(value, list):
            stack.extend((item, [*path, i], depth + 1) for i, item in enumerate(value))
        elif isinstance(value, str):
            _check_string(value, path, limit=MAX_STRING_CHARS, what="A string")


class GuardedParser(Parser):
    def parse_body(self, request: HttpRequest):
        data = parse_json_body(read_body(request))
        if not isinstance(data, dict):
            raise ApiError(422, "invalid_type", "The body must be a JSON object.")
        return data


def reject_nul(value: str) -> str:
    """For query and path strings, which never pass through the body guard."""
    if "\x00" in value:
        raise PydanticCustomError("nul_byte", "contains a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise PydanticCustomError("invalid_utf8", "contains an unpaired surrogate") from None
    return value


# --------------------------------------------------------------------------------------------
# Identifiers: keys, names and references a person reads or a machine matches exactly.

# The characters an identifier may not hold (runs/invisible.py: default-ignorable code points,
# controls, format characters, line and paragraph separators, blank symbols). They are invisible
# or reorder what is shown: a key with U+202E renders reversed, and one with U+200B or U+3164
# looks like another key but is not. The API and the console check the same table.
INVISIBLE_RANGES = invisible.IDENTIFIER_FORBIDDEN_RANGES
# The same rule as a JSON-schema pattern (the characters themselves, escaped by JSON). Unpaired
# surrogates are refused too (400), but are left out: a pattern holding them is not valid
# Unicode, and valid UTF-8 JSON cannot carry them anyway.
IDENTIFIER_PATTERN = (
    "^[^"
    + "".join(
        chr(low) if low == high else f"{chr(low)}-{chr(high)}" for low, high in INVISIBLE_RANGES
    )
    + "]*$"
)


def check_identifier(value: str) -> str:
    """Identifiers may not hold invisible, control or format characters: 422."""
    value = reject_nul(value)
    char = invisible.first_forbidden_in_identifier(value)
    if char is not None:
        raise PydanticCustomError(
            "invisible_character",
            "contains {character}, an invisible or control character",
            {"character": invisible.character_name(char)},
        )
    return value


# --------------------------------------------------------------------------------------------
# Exception handlers


def _respond(api: NinjaAPI, request: HttpRequest, error: ApiError) -> HttpResponse:
    return api.create_response(request, error.body(), status=error.status)


def _validation_error(exc: ValidationError) -> ApiError:
    first = exc.errors[0] if exc.errors else {}
    loc = list(first.get("loc", []))
    # ("body", "<param>", "input", "customer") -> "input.customer"; ("query", "limit") -> "limit"
    if loc[:1] == ["body"]:
        loc = loc[2:]
    elif loc[:1] in (["query"], ["path"], ["header"]):
        loc = loc[1:]
    field = field_path(loc)
    kind = first.get("type", "")
    message = first.get("msg", "invalid value")
    if kind in ("nul_byte", "invalid_utf8"):
        return ApiError(400, kind, f"{field or 'A value'} {message}.", field=field)
    if kind == "invisible_character":
        return ApiError(422, "invalid_characters", f"{field} {message}.", field=field)
    if kind == "missing":
        return ApiError(422, "missing_field", f"{field} is required.", field=field)
    if kind == "extra_forbidden":
        return ApiError(422, "unknown_field", f"{field} is not a known field.", field=field)
    return ApiError(422, "invalid_field", f"{field or 'The request'}: {message}", field=field)


def install_handlers(api: NinjaAPI) -> None:
    @api.exception_handler(ApiError)
    def api_error(request, exc: ApiError):
        return _respond(api, request, exc)

    @api.exception_handler(ValidationError)
    def validation_error(request, exc: ValidationError):
        return _respond(api, request, _validation_error(exc))

    @api.exception_handler(AuthenticationError)
    def unauthenticated(request, exc):
        logger.warning(
            "api: unauthenticated %s %s from %s",
            request.method,
            request.path,
            request.META.get("REMOTE_ADDR"),
        )
        error = ApiError(
            401,
            "unauthenticated",
            "Send 'Authorization: Bearer <client_id>.<secret>' (or a signed webhook).",
        )
        response = _respond(api, request, error)
        response["WWW-Authenticate"] = 'Bearer realm="taskpilots"'
        return response

    @api.exception_handler(HttpError)
    def http_error(request, exc: HttpError):
        # ninja wraps parser failures in HttpError(400); the guard's own error is the cause.
        if isinstance(exc.__cause__, ApiError):
            return _respond(api, request, exc.__cause__)
        return _respond(api, request, ApiError(exc.status_code, "http_error", str(exc)))

    @api.exception_handler(Http404)
    def not_found(request, exc):
        return _respond(api, request, ApiError(404, "not_found", str(exc) or "Not found."))

    @api.exception_handler(Exception)
    def server_error(request, exc):
        logger.exception("api: %s %s failed", request.method, request.path)
        return _respond(api, request, ApiError(500, "server_error", "Internal error; logged."))

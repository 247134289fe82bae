"""Tools: what a step calls, with the metadata the engine needs to call it safely.

A tool says whether it has a side effect, how risky it is, whether the system behind it honours
our idempotency key (`dedupes_by_key`) or can say whether a keyed call happened (`lookup`), what
undoes it (`compensating_tool`), what can stand in for it (`fallback_tool`), and how its errors
map onto failure classes. Adapters turn a call into a `ToolError` with a class, so the engine
never has to guess from an exception type.
"""

from __future__ import annotations

import json
import os
import queue
import re
import threading
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode, urlsplit

import httpx2
from django.conf import settings

from runs import hooks
from runs.models import FailureClass, Risk
from runs.people import people
from taskpilots.httpclient import NOT_SENT, SharedClient

DEFAULT_REQUIRED_SNAPSHOT_FIELDS = ("target_resource", "permissions", "idempotency_key")


class NotSent(Exception):
    """A check made just before a request left refused it (runs.tools.about_to_send): nothing
    was sent. Not a tool failure: tool wrappers let it through unchanged."""


class ToolError(Exception):
    """A classified tool failure.

    `failure_class` decides the route; for a side effect every class except `unknown_outcome`
    means the external system did not commit the call.
    """

    def __init__(
        self,
        failure_class: str,
        message: str,
        *,
        status: int | None = None,
        retry_after: float | None = None,
        details: Any = None,
        answered: bool = False,
    ):
        if failure_class not in FailureClass.values:
            raise ValueError(f"unknown failure class {failure_class!r}")
        super().__init__(message)
        self.failure_class = failure_class
        self.message = message
        self.status = status
        self.retry_after = retry_after
        self.details = details
        # The system processed the call and answered with an error (an MCP isError result),
        # as opposed to no answer: nothing of it is still in flight.
        self.answered = answered

    def __str__(self) -> str:
        return f"{self.failure_class}: {self.message}"


@dataclass(frozen=True)
class CallContext:
    """What a tool call knows besides its parameters."""

    idempotency_key: str
    run_id: str
    step: str
    attempt: int
    timeout: float | None
    principal: str = "system"
    scopes: tuple[str, ...] = ()


@dataclass(frozen=True)
class ToolResult:
    """A successful call: the external id (commit proof) and the response body."""

    response: Any
    external_id: str = ""


@dataclass(frozen=True)
class LookupResult:
    found: bool
    external_id: str = ""
    response: Any = None


@dataclass(frozen=True)
class Verification:
    """How to find out, with reads, whether a call's effect is there: for a tool that cannot be
    asked by key and does not dedupe (a file write, a git commit behind a third-party server).

    After a crash or an unanswered call the engine reads (`read(params, ctx)`) and asks
    `recognise(params, observed, baseline)`: True — the effect is there (the verification is
    recorded as the commit proof), False — it is not (once the settle window has passed, the
    call is made again under the same key), None — the read cannot tell (a person decides).
    `baseline(params, ctx)`, when given, is read before the first call and kept in the snapshot,
    so an effect can be told from what was there before (a new commit, not an old one with the
    same message). `external_id(params, observed, baseline)` is the proof's external id.
    """

    read: Callable[[dict, CallContext], Any]
    recognise: Callable[[dict, Any, Any], bool | None]
    baseline: Callable[[dict, CallContext], Any] | None = None
    external_id: Callable[[dict, Any, Any], str] | None = None
    description: str = ""


@dataclass
class Tool:
    name: str
    invoke: Callable[[dict, CallContext], ToolResult]
    side_effect: bool = False
    risk: str = Risk.LOW
    dedupes_by_key: bool = False
    lookup: Callable[[str, CallContext], LookupResult] | None = None
    # Reconciliation by reads, for a tool without a lookup by key (see Verification).
    verification: Verification | None = None
    compensating_tool: str = ""
    # Parameters for the compensating call, from the committed effect's receipt and params.
    compensation_params: Callable[[dict, dict], dict] | None = None
    fallback_tool: str = ""
    timeout: float | None = None
    # How long after sending a call the system may still commit it (server-side processing of
    # a request the caller gave up on). A lookup that finds nothing inside this window is not
    # yet proof that nothing happened. None: twice the call's timeout plus a second.
    settle_seconds: float | None = None
    # Snapshot fields that must be filled before this tool may be called.
    required_snapshot_fields: tuple[str, ...] = DEFAULT_REQUIRED_SNAPSHOT_FIELDS
    # A scope the run must hold to call this tool ("" = none needed).
    scope: str = ""
    # Derive the target resource (what the call touches) from the parameters.
    target: Callable[[dict], str] | None = None
    # Parameter names and types, for the console's edit form and for validation.
    params_schema: Mapping[str, type] = field(default_factory=dict)
    description: str = ""
    # Fields of the response that must equal the snapshot's parameter of the same name (a
    # refund's amount and payment): a lookup by key that finds the effect with other values
    # has found something else than this call asked for, and a person confirms before the run
    # goes on (runs.engine.ledger.changed_result).
    expect_fields: tuple[str, ...] = ()
    # A read whose empty answer (None, [], {}, "") means the data is missing: `empty_result`.
    expects_result: bool = False
    # A read's answer as this adapter expects it: `check(response)` returns what is wrong with
    # it (a string) or None; a wrong shape means the API drifted (`api_drift`).
    response_check: Callable[[Any], str | None] | None = None
    # What approval rules measure a call by (runs.engine.gate): the parameter holding the
    # amount it moves, the one holding its ISO 4217 currency (or the currency it always uses),
    # and the one holding the records it touches (a count, or a list of them).
    amount_param: str = ""
    currency_param: str = ""
    default_currency: str = ""
    records_param: str = ""

    def __post_init__(self) -> None:
        if self.risk not in Risk.values:
            raise ValueError(f"tool {self.name}: risk must be one of {Risk.values}")

    @property
    def lookup_by_key(self) -> bool:
        return self.lookup is not None

    def unexpected(self, params: dict, response: Any) -> dict[str, dict]:
        """The `expect_fields` whose value in `response` is not the snapshot's: {field: {"now":
        the response's value, "snapshot": the parameter's}}. Fields the parameters lack are not
        compared."""
        found = response if isinstance(response, dict) else {}
        return {
            name: {"now": found.get(name), "snapshot": params[name]}
            for name in self.expect_fields
            if name in params and found.get(name) != params[name]
        }

    def target_of(self, params: dict) -> str:
        if self.target is None:
            return ""
        try:
            return str(self.target(params) or "")
        except (KeyError, TypeError, ValueError):
            return ""

    def validate(self, params: Any) -> dict:
        """Untrusted parameters (from a model or a person): a flat check against the schema."""
        if not isinstance(params, dict):
            raise ToolError(FailureClass.INVALID_INPUT, "parameters must be a JSON object")
        for name, kind in self.params_schema.items():
            if name not in params:
                raise ToolError(FailureClass.INVALID_INPUT, f"parameter {name!r} is missing")
            value = params[name]
            ok = isinstance(value, kind) and not (kind in (int, float) and isinstance(value, bool))
            if kind is float and isinstance(value, int) and not isinstance(value, bool):
                ok = True
            if not ok:
                raise ToolError(
                    FailureClass.INVALID_INPUT,
                    f"parameter {name!r} must be {kind.__name__}, got {type(value).__name__}",
                )
        return params

    def check_read(self, response: Any) -> None:
        """Classify a read's successful answer that the step cannot use. Writes are never
        checked here: their answer is the proof of a committed effect, whatever its shape."""
        if self.side_effect:
            return
        if self.expects_result and response in (None, [], {}, ""):
            raise ToolError(
                FailureClass.EMPTY_RESULT, f"{self.name} answered with nothing ({response!r})"
            )
        if self.response_check is None:
            return
        try:
            problem = self.response_check(response)
        except Exception as exc:  # a check that cannot read the answer: the shape is not ours
            problem = f"{type(exc).__name__}: {exc}"
        if problem:
            raise ToolError(
                FailureClass.API_DRIFT,
                f"{self.name} answered in an unexpected shape: {str(problem)[:300]}",
            )

    def describe(self) -> dict:
        return {
            "name": self.name,
            "side_effect": self.side_effect,
            "risk": self.risk,
            "dedupes_by_key": self.dedupes_by_key,
            "lookup_by_key": self.lookup_by_key,
            "verified_by_read": self.verification is not None,
            "compensating_tool": self.compensating_tool,
            "fallback_tool": self.fallback_tool,
            "timeout": self.timeout,
            "settle_seconds": self.settle_seconds,
            "scope": self.scope,
            "expect_fields": list(self.expect_fields),
            "expects_result": self.expects_result,
            "response_checked": self.response_check is not None,
        }


# --------------------------------------------------------------------------------------------
# Registry

# As their code registered them; `get` returns each as this deployment decided it (an admin's
# local decisions over a tool's own metadata, from the console), asked of the people's side
# (runs.people: `local_metadata`).
_TOOLS: dict[str, Tool] = {}


class UnknownTool(LookupError):
    pass


def register(tool: Tool, *, replace: bool = False) -> Tool:
    if tool.name in _TOOLS and not replace and _TOOLS[tool.name] is not tool:
        raise ValueError(f"tool {tool.name!r} is already registered")
    _TOOLS[tool.name] = tool
    return tool


# Tools that register themselves on first use, by name or "prefix." (e.g. an MCP server's,
# listed the first time one of them is asked for in a process: runs.agents.mcp).
_SOURCES: dict[str, Callable[[bool], Any]] = {}


def register_source(prefix: str, load: Callable[[bool], Any]) -> None:
    """`load(connect)` registers the tools named `prefix` (or starting with it, when it ends
    with "."); `connect=False` asks for what is known without reaching any outside system (what
    a web process lists), `connect=True` may connect (a worker about to call one)."""
    _SOURCES[prefix] = load


def _from_sources(name: str) -> None:
    for prefix, load in list(_SOURCES.items()):
        if name == prefix or (prefix.endswith(".") and name.startswith(prefix)):
            load(True)
            if name in _TOOLS:
                return


def get(name: str) -> Tool:
    if name not in _TOOLS and _SOURCES:
        _from_sources(name)
    if name not in _TOOLS:
        from runs.registry import load_lazily

        try:
            load_lazily(name)
        except ImportError as exc:  # e.g. an optional extra that is not installed
            raise UnknownTool(f"tool {name!r} cannot be loaded: {exc}") from exc
    try:
        tool = _TOOLS[name]
    except KeyError:
        raise UnknownTool(f"tool {name!r} is not registered") from None
    tool = people().local_metadata(tool)
    return hooks.wrapped(tool) if hooks.tool_wrappers else tool


def registered(name: str) -> Tool:
    """The tool exactly as its code registered it, without local decisions."""
    get(name)
    return _TOOLS[name]


def all_tools() -> dict[str, Tool]:
    """Every tool this process knows — the lazily registered modules' too (runs.registry) —
    those of lazy sources as far as they are known without connecting anywhere."""
    from runs.registry import load_all_lazily

    load_all_lazily()
    for load in list(_SOURCES.values()):
        load(False)
    decided = people().local_metadata
    return {name: decided(tool) for name, tool in _TOOLS.items()}


# --------------------------------------------------------------------------------------------
# Plain Python callables


def python_tool(
    name: str,
    fn: Callable[[dict, CallContext], Any],
    *,
    external_id: Callable[[Any], str] | None = None,
    lookup_fn: Callable[[str, CallContext], LookupResult] | None = None,
    **meta: Any,
) -> Tool:
    """Wrap `fn(params, ctx)`. Its return value is the response; `ToolError` passes through.

    Any other exception from a side-effecting function may have happened half-way, so it is an
    unknown outcome; from a read it is transient. With a `timeout`, the call runs in a helper
    thread and a late return counts as unknown (the thread cannot be killed, so the effect may
    still land: exactly the case reconciliation exists for).
    """
    side_effect = meta.get("side_effect", False)

    def invoke(params: dict, ctx: CallContext) -> ToolResult:
        try:
            value = _call_with_timeout(fn, params, ctx)
        except (ToolError, NotSent):
            raise
        except TimeoutError:
            cls = FailureClass.UNKNOWN_OUTCOME if side_effect else FailureClass.TRANSIENT
            raise ToolError(cls, f"no answer within {ctx.timeout}s") from None
        except Exception as exc:
            cls = FailureClass.UNKNOWN_OUTCOME if side_effect else FailureClass.TRANSIENT
            raise ToolError(cls, f"{type(exc).__name__}: {exc}") from exc
        ext = external_id(value) if external_id else _guess_external_id(value)
        return ToolResult(response=value, external_id=ext)

    return Tool(name=name, invoke=invoke, lookup=lookup_fn, **meta)


# The caller's hooks, per thread: "this call is about to wait on the outside world" (the engine
# gives its database connection back then, runs.engine.calls.connection_released, so a quick
# in-process call keeps it and a slow one does not hold it), and "this request is about to
# leave" (the engine checks there that its claim still holds: a worker paused between its
# earlier check and the request sends nothing when it wakes).
_waiting = threading.local()


@contextmanager
def when_waiting(hook: Callable[[], None], before_send: Callable[[], None] | None = None):
    """Run `hook` (once) if a call made in this block is about to wait, and `before_send`
    (which may raise NotSent) each time a request of it is about to leave."""
    previous = getattr(_waiting, "hook", None), getattr(_waiting, "before_send", None)
    _waiting.hook, _waiting.before_send = hook, before_send
    try:
        yield
    finally:
        _waiting.hook, _waiting.before_send = previous


def about_to_wait() -> None:
    """Tools call this before they wait on the outside world (a request sent, a call that did
    not return at once)."""
    hook = getattr(_waiting, "hook", None)
    if hook is not None:
        _waiting.hook = None
        hook()
    outer = getattr(_waiting, "outer", None)
    if outer is not None:
        _waiting.outer = None
        outer()


@contextmanager
def on_first_wait(hook: Callable[[], None]):
    """Run `hook` (once) the first time any call made in this block is about to wait, beside
    whatever `when_waiting` hooks the calls set: the task that advances a batch of runs hands
    the rest of its batch on then (runs.engine.execute.advance_each)."""
    previous = getattr(_waiting, "outer", None)
    _waiting.outer = hook
    try:
        yield
    finally:
        _waiting.outer = previous


def about_to_send() -> None:
    """Tools that send a request call this last before it leaves, with everything else of the
    request ready: the caller's check runs as close to the send as a tool can put it. Raises
    NotSent when the request must not leave."""
    about_to_wait()
    check = getattr(_waiting, "before_send", None)
    if check is not None:
        check()


# How long an in-process call may take before its caller counts it as waiting.
_QUICK_SECONDS = 0.002


def _call_with_timeout(fn, params, ctx):
    if ctx.timeout is None:
        about_to_wait()
        return fn(params, ctx)
    return _CALLERS.call(fn, params, ctx, ctx.timeout)


class _Callers:
    """Daemon threads that make python_tool calls with a timeout, reused from call to call (a
    thread started per call cost more than a quick tool). A call that overruns keeps its
    thread — it cannot be killed, and its effect may still land, which is exactly what the
    unknown outcome and reconciliation are for — and the next call gets a fresh thread."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0

    def call(self, fn, params, ctx, timeout: float):
        # The helper releases `done` when the call returns: a bare lock is the cheapest signal
        # between two threads (an Event is a condition variable around one).
        done = threading.Lock()
        done.acquire()
        box: dict[str, Any] = {}
        with self._lock:
            if self._idle:
                self._idle -= 1
            else:
                threading.Thread(target=self._serve, daemon=True, name="tool-call").start()
        self._jobs.put((fn, params, ctx, box, done))
        if not done.acquire(timeout=min(_QUICK_SECONDS, timeout)):
            about_to_wait()
            if not done.acquire(timeout=max(timeout - _QUICK_SECONDS, 0)):
                raise TimeoutError
        if "error" in box:
            raise box["error"]
        return box.get("value")

    def _serve(self) -> None:
        while True:
            fn, params, ctx, box, done = self._jobs.get()
            try:
                box["value"] = fn(params, ctx)
            except BaseException as exc:  # handed to the caller
                box["error"] = exc
            with self._lock:
                self._idle += 1
            done.release()


_CALLERS = _Callers()
# A forked child (a prefork pool process) has none of its parent's threads: start afresh.
os.register_at_fork(after_in_child=_CALLERS.__init__)


def _guess_external_id(value: Any) -> str:
    if isinstance(value, dict):
        for key in ("external_id", "id"):
            if value.get(key) not in (None, ""):
                return str(value[key])
    return ""


# --------------------------------------------------------------------------------------------
# Generic HTTP/JSON

# Tool calls go straight to the system they name: no proxy or credentials from the environment.
_http_client = SharedClient(trust_env=False)


# An error body that says the request named a field the server does not know (any common
# wording: "unknown field", "unsupported parameter", "unrecognized property", an error code such
# as TaskPilots' own "unknown_field", JSON Schema's "additional properties are not allowed"):
# our request was written for another API version.
_UNKNOWN_FIELD = re.compile(
    r"\b(unknown|unsupported|unrecogni[sz]ed|unexpected)[\s_-]+([a-z]+\s+)?"
    r"(field|parameter|param|property|attribute|argument)s?\b"
    r"|\b(field|parameter|property|attribute|argument)s?\b[^.]{0,60}\b(is|are)\s+not\s+"
    r"(supported|recogni[sz]ed|allowed|permitted)\b"
    r"|additional\s*properties",
    re.IGNORECASE,
)


def _says_unknown_field(body: Any) -> bool:
    text = body if isinstance(body, str) else json.dumps(body, default=str)
    return bool(_UNKNOWN_FIELD.search(text[:4000]))


def _classify_status(
    status: int, *, write: bool, retry_after: float | None, body: Any = None
) -> str:
    if status in (401, 403):
        return FailureClass.PERMISSION
    if status in (429, 503):
        return FailureClass.TRANSIENT
    # A read of something that is not there: the data is missing. A write keeps invalid_input
    # (the system refused it, and a person checks what it was sent to).
    if status in (404, 410) and not write:
        return FailureClass.EMPTY_RESULT
    # A refusal of the request's format, read or write: the call was not processed.
    if status == 406 or (status in (400, 422) and body is not None and _says_unknown_field(body)):
        return FailureClass.API_DRIFT
    if 400 <= status < 500:
        return FailureClass.INVALID_INPUT
    # Any other 5xx: on a write the server may have committed before failing.
    return FailureClass.UNKNOWN_OUTCOME if write else FailureClass.TRANSIENT


def _classify_transport_error(
    exc: Exception, *, netloc: str, timeout: float, write: bool
) -> ToolError:
    """What a failed exchange means: not sent (outage, transient, a request that cannot be
    sent), or sent with no answer (unknown outcome for a write, transient for a read)."""
    if isinstance(exc, httpx2.ConnectTimeout):
        return ToolError(FailureClass.TRANSIENT, f"could not connect to {netloc} in {timeout}s")
    if isinstance(exc, httpx2.PoolTimeout):
        return ToolError(
            FailureClass.TRANSIENT, f"no free connection to {netloc} within {timeout}s"
        )
    if isinstance(exc, httpx2.ConnectError):  # refused, DNS failure, unreachable, TLS handshake
        if _caused_by(exc, ConnectionRefusedError):
            return ToolError(FailureClass.OUTAGE, f"connection refused by {netloc}")
        return ToolError(FailureClass.OUTAGE, f"cannot reach {netloc}: {exc}")
    if isinstance(exc, NOT_SENT):  # an unsupported scheme, an invalid URL or header
        return ToolError(FailureClass.INVALID_INPUT, f"cannot send to {netloc}: {exc}")
    after_send = FailureClass.UNKNOWN_OUTCOME if write else FailureClass.TRANSIENT
    if isinstance(exc, httpx2.TimeoutException):
        return ToolError(after_send, f"no answer from {netloc} within {timeout}s")
    return ToolError(after_send, f"connection to {netloc} broke: {exc}")


def _caused_by(exc: BaseException, kind: type[BaseException]) -> bool:
    while exc is not None:
        if isinstance(exc, kind):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


@dataclass
class HttpResponse:
    status: int
    headers: dict[str, str]
    body: Any


def http_request(
    method: str,
    url: str,
    *,
    body: Any = None,
    headers: Mapping[str, str] | None = None,
    timeout: float,
    write: bool,
) -> HttpResponse:
    """One HTTP/JSON exchange with every failure classified (see _classify_transport_error).

    `timeout` bounds connecting, waiting for a pooled connection, and each read and write.
    """
    payload = None if body is None else json.dumps(body, separators=(",", ":")).encode()
    all_headers = {"Accept": "application/json", **(headers or {})}
    if payload is not None:
        all_headers["Content-Type"] = "application/json"
    if hooks.propagators:  # the trace context (taskpilots/otel), when tracing is on
        hooks.outgoing_headers(all_headers)
    about_to_send()
    try:
        response = _http_client().request(
            method, url, content=payload, headers=all_headers, timeout=timeout
        )
    except (httpx2.HTTPError, httpx2.InvalidURL) as exc:
        netloc = urlsplit(url).netloc
        raise _classify_transport_error(exc, netloc=netloc, timeout=timeout, write=write) from None
    raw = response.content
    try:
        parsed = json.loads(raw) if raw else None
    except ValueError:
        parsed = raw.decode(errors="replace")[:2000]
    response_headers = {name.lower(): value for name, value in response.headers.items()}
    return HttpResponse(response.status_code, response_headers, parsed)


def _retry_after(headers: Mapping[str, str]) -> float | None:
    try:
        return float(headers.get("retry-after", ""))
    except ValueError:
        return None


def _resolve(url: str | Callable[[], str]) -> str:
    return url() if callable(url) else url


@dataclass(frozen=True)
class _HttpEndpoint:
    """The call (and the lookup by key) behind an `http_tool`."""

    name: str
    method: str
    url: str | Callable[[], str]
    write: bool
    use_query: bool
    external_id_field: str
    lookup_url: str | Callable[[], str] | None
    classify: Callable[[HttpResponse, str], str | None] | None
    extra_headers: Callable[[CallContext], Mapping[str, str]] | None

    def headers_for(self, ctx: CallContext) -> dict[str, str]:
        headers = {"X-TaskPilots-Run": ctx.run_id, "X-TaskPilots-Step": ctx.step}
        if self.write:
            headers["Idempotency-Key"] = ctx.idempotency_key
        if self.extra_headers:
            headers.update(self.extra_headers(ctx))
        return headers

    def invoke(self, params: dict, ctx: CallContext) -> ToolResult:
        target, body = _resolve(self.url), params
        if self.use_query:
            target += ("&" if "?" in target else "?") + urlencode(params, doseq=True)
            body = None
        response = http_request(
            self.method,
            target,
            body=body,
            headers=self.headers_for(ctx),
            timeout=ctx.timeout or settings.TASKPILOTS["TOOL_TIMEOUT_SECONDS"],
            write=self.write,
        )
        if 200 <= response.status < 300:
            ext = ""
            if isinstance(response.body, dict) and response.body.get(self.external_id_field):
                ext = str(response.body[self.external_id_field])
            return ToolResult(response=response.body, external_id=ext)
        raise self.error(response, target)

    def error(self, response: HttpResponse, target: str) -> ToolError:
        retry_after = _retry_after(response.headers)
        cls = (self.classify(response, self.name) if self.classify else None) or _classify_status(
            response.status, write=self.write, retry_after=retry_after, body=response.body
        )
        detail = response.body
        if isinstance(detail, dict):
            detail = detail.get("error") or detail
        return ToolError(
            cls,
            f"{self.method} {urlsplit(target).path} answered {response.status}: "
            f"{str(detail)[:300]}",
            status=response.status,
            retry_after=retry_after,
            details=response.body,
        )

    def lookup(self, key: str, ctx: CallContext) -> LookupResult:
        assert self.lookup_url is not None
        target = _resolve(self.lookup_url)
        target += ("&" if "?" in target else "?") + urlencode({"key": key})
        timeout = ctx.timeout or settings.TASKPILOTS["TOOL_TIMEOUT_SECONDS"]
        response = http_request("GET", target, timeout=timeout, write=False)
        if response.status == 404:
            return LookupResult(found=False)
        if response.status == 200 and isinstance(response.body, dict):
            return LookupResult(
                found=bool(response.body.get("found", True)),
                external_id=str(response.body.get(self.external_id_field) or ""),
                response=response.body.get("response", response.body),
            )
        raise ToolError(FailureClass.TRANSIENT, f"lookup by key answered {response.status}")


def http_tool(
    name: str,
    method: str,
    url: str | Callable[[], str],
    *,
    query_params: bool | None = None,
    external_id_field: str = "id",
    lookup_url: str | Callable[[], str] | None = None,
    classify: Callable[[HttpResponse, str], str | None] | None = None,
    extra_headers: Callable[[CallContext], Mapping[str, str]] | None = None,
    **meta: Any,
) -> Tool:
    """A tool backed by an HTTP/JSON endpoint.

    Writes send the idempotency key in `Idempotency-Key` (and the run and step in
    `X-TaskPilots-Run` / `X-TaskPilots-Step`, so the receiver can tell a regenerated key from a
    new request). `lookup_url` (a `?key=` is appended) makes the tool able to say whether a keyed
    call happened: 200 found, 404 not found. `classify` lets a tool override the class of an
    error response (return None to keep the default mapping).
    """
    endpoint = _HttpEndpoint(
        name=name,
        method=method,
        url=url,
        write=bool(meta.get("side_effect", False)),
        use_query=(method.upper() == "GET") if query_params is None else query_params,
        external_id_field=external_id_field,
        lookup_url=lookup_url,
        classify=classify,
        extra_headers=extra_headers,
    )
    lookup = endpoint.lookup if lookup_url is not None else None
    return Tool(name=name, invoke=endpoint.invoke, lookup=lookup, **meta)

"""Calling tools: the parameters a step builds (untrusted until checked), the call context that
carries the idempotency key, and the run's permission to call."""

from __future__ import annotations

from contextlib import contextmanager

from django.db import connection

from runs.engine.claim import Claim
from runs.engine.dispatch import conf
from runs.engine.liveness import fence
from runs.models import FailureClass, canonical_json, to_json_value
from runs.tools import CallContext, LookupResult, Tool, ToolError, ToolResult, when_waiting

MAX_PARAMS_BYTES = 256 * 1024


def build_params(claim: Claim, tool: Tool | None) -> dict:
    """The step's parameters: built by the workflow (or a person's override), checked by the
    tool, JSON, at most 256 KiB, no NUL. A failure here is invalid input, never a call."""
    try:
        params = claim.definition.build_params(claim.ctx)
    except Exception as exc:
        raise ToolError(
            FailureClass.INVALID_INPUT, f"building parameters failed: {type(exc).__name__}: {exc}"
        ) from None
    if claim.step.spec.get("params_override") is not None:
        params = claim.step.spec["params_override"]
    if tool is not None:
        params = tool.validate(params)
    try:
        text = canonical_json(params)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ToolError(FailureClass.INVALID_INPUT, f"parameters are not JSON: {exc}") from None
    if len(text.encode()) > MAX_PARAMS_BYTES:
        raise ToolError(FailureClass.INVALID_INPUT, "parameters exceed 256 KiB")
    if "\x00" in text:
        raise ToolError(FailureClass.INVALID_INPUT, "parameters contain a NUL character")
    return to_json_value(params)  # a copy of plain JSON, or the value its text decodes to


def call_context(claim: Claim, tool: Tool, key: str = "") -> CallContext:
    step = claim.step
    return CallContext(
        idempotency_key=key,
        run_id=str(claim.run.id),
        step=step.name if not step.iteration else f"{step.name}#{step.iteration}",
        attempt=step.attempts,
        timeout=tool.timeout if tool.timeout is not None else conf("TOOL_TIMEOUT_SECONDS"),
        principal=claim.run.principal,
        scopes=tuple(claim.run.scopes or ()),
    )


def check_scope(claim: Claim, tool: Tool) -> None:
    scopes = claim.run.scopes or []
    if tool.scope and tool.scope not in scopes and "*" not in scopes:
        raise ToolError(
            FailureClass.PERMISSION,
            f"run acts as {claim.run.principal!r} without scope {tool.scope!r} for {tool.name}",
        )


def _release_connection() -> None:
    if connection.connection is not None and connection.pool and not connection.in_atomic_block:
        connection.close()


@contextmanager
def connection_released():
    """While a tool call or a model turn waits on the outside world no transaction is open: the
    database connection goes back to the pool (Django takes one again at the next query), so a
    worker's threads share a few connections instead of holding one each through every call
    (taskpilots/dbpool.py). Without a pool, or inside a transaction, the connection stays."""
    _release_connection()
    yield


def invoke(claim: Claim, tool: Tool, params: dict, key: str = "") -> ToolResult:
    """Call the tool for the claimed step, with the call context and its key — only while this
    worker still holds the claim (runs.engine.liveness.fence: ClaimLost otherwise), checked
    before the call and again as its request leaves. The connection goes back to the pool once
    the call waits (runs.tools.about_to_wait): a quick in-process call keeps it."""
    ctx = call_context(claim, tool, key)
    fence(claim)  # a worker that lost its claim while away sends nothing

    def before_send() -> None:
        # Again at the last moment, as the request is about to leave (runs.tools.about_to_send):
        # a worker paused since the check above finds its claim taken back when it wakes. Free
        # while the claim is young and the heartbeat vouches for it; a query otherwise, whose
        # connection goes back to the pool before the request waits.
        fence(claim)
        _release_connection()

    with when_waiting(_release_connection, before_send):
        return tool.invoke(params, ctx)


def lookup(claim: Claim, tool: Tool, key: str) -> LookupResult:
    """Ask the tool whether the call under `key` happened (reconciliation)."""
    ctx = call_context(claim, tool, key)
    with when_waiting(_release_connection):
        return tool.lookup(key, ctx)


def read_for_verification(claim: Claim, tool: Tool, params: dict, key: str, *, baseline=False):
    """Run the tool's verification read (runs.tools.Verification) for the call's parameters:
    its `baseline` read before the call, or its `read` afterwards. Anything but a ToolError
    from the read is a transient failure of the read (it says nothing about the effect)."""
    verification = tool.verification
    read = verification.baseline if baseline else verification.read
    ctx = call_context(claim, tool, key)
    try:
        with when_waiting(_release_connection):
            return read(params, ctx)
    except ToolError:
        raise
    except Exception as exc:
        raise ToolError(
            FailureClass.TRANSIENT, f"verification read failed: {type(exc).__name__}: {exc}"
        ) from exc

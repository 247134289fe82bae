"""A demo MCP server in front of the sandbox's simulated systems (docs/sandbox.md).

    python taskpilots/demo/servers/sandbox.py                     # stdio (what the demo agent uses)
    python taskpilots/demo/servers/sandbox.py --http 8766         # streamable HTTP on /mcp

Each tool forwards to the sandbox HTTP service at $TASKPILOTS_SANDBOX_URL, so the sandbox
ledger counts every effect. The TaskPilots idempotency key, run and step arrive in the call's
`_meta` (`taskpilots/idempotency-key`, `taskpilots/run`, `taskpilots/step`) and are passed on as
the sandbox's `Idempotency-Key`, `X-TaskPilots-Run` and `X-TaskPilots-Step` headers. Errors come
back as `isError` results whose `_meta["taskpilots/failure-class"]` says what happened, so the
client never has to guess whether a write landed.

Standalone on purpose (no Django): it is started by path, as its own process.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import urllib.parse
from typing import Any

import httpx2
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import CallToolResult, TextContent, ToolAnnotations

KEY, RUN, STEP = "taskpilots/idempotency-key", "taskpilots/run", "taskpilots/step"
FAILURE_CLASS = "taskpilots/failure-class"

server = MCPServer(
    "taskpilots-sandbox",
    instructions="Mail, tickets, CRM, payments and knowledge base of the TaskPilots sandbox.",
)

READ = ToolAnnotations(readOnlyHint=True, openWorldHint=True)

# One client (one connection pool) for the server's lifetime: it is its own process, never forked.
_http = httpx2.Client(trust_env=False)


def _base_url() -> str:
    return os.environ.get("TASKPILOTS_SANDBOX_URL", "http://127.0.0.1:8765").rstrip("/")


def _timeout() -> float:
    return float(os.environ.get("TASKPILOTS_MCP_HTTP_TIMEOUT", "30"))


def _answer(value: Any) -> CallToolResult:
    return CallToolResult(
        content=[TextContent(type="text", text=json.dumps(value, ensure_ascii=False))],
        structured_content=value if isinstance(value, dict) else {"result": value},
    )


def _error(failure_class: str, message: str, status: int | None = None) -> CallToolResult:
    meta: dict[str, Any] = {FAILURE_CLASS: failure_class}
    if status is not None:
        meta["taskpilots/status"] = status
    return CallToolResult(
        content=[TextContent(type="text", text=message)], is_error=True, _meta=meta
    )


def _status_class(status: int, outage: bool, write: bool) -> str:
    if outage:
        return "outage"
    if status in (401, 403):
        return "permission"
    if status in (429, 503):
        return "transient"
    if 400 <= status < 500:
        return "invalid_input"
    return "unknown_outcome" if write else "transient"


def _request(method: str, path: str, *, body: dict | None, ctx: Context | None) -> CallToolResult:
    write = method == "POST"
    meta = dict((ctx.request_context.meta if ctx else None) or {})
    headers = {"Accept": "application/json"}
    if meta.get(RUN):
        headers["X-TaskPilots-Run"] = str(meta[RUN])
    if meta.get(STEP):
        headers["X-TaskPilots-Step"] = str(meta[STEP])
    if write:
        if not meta.get(KEY):
            return _error("invalid_input", f"a write needs `_meta[{KEY!r}]`")
        headers["Idempotency-Key"] = str(meta[KEY])
        headers["Content-Type"] = "application/json"
    data = json.dumps(body).encode() if body is not None else None
    try:
        response = _http.request(
            method, _base_url() + path, content=data, headers=headers, timeout=_timeout()
        )
    except httpx2.ConnectError as exc:  # nothing was sent: the write did not happen
        return _error("outage", f"the sandbox could not be reached: {exc}")
    except (httpx2.ConnectTimeout, httpx2.PoolTimeout) as exc:  # nothing was sent either
        return _error("transient", f"no connection to the sandbox: {type(exc).__name__}")
    except httpx2.TransportError as exc:
        cls = "unknown_outcome" if write else "transient"
        return _error(cls, f"{method} {path}: no answer ({type(exc).__name__}: {exc})")
    if not response.is_success:
        detail = response.content.decode(errors="replace")[:500]
        outage = bool(response.headers.get("X-Sandbox-Outage"))
        status = response.status_code
        cls = _status_class(status, outage, write)
        return _error(cls, f"{method} {path} answered {status}: {detail}", status)
    return _answer(json.loads(response.content or b"null"))


def _get(path: str, query: dict, ctx: Context | None = None) -> CallToolResult:
    return _request("GET", f"{path}?{urllib.parse.urlencode(query)}", body=None, ctx=ctx)


@server.tool(annotations=READ)
def crm_lookup(email: str, ctx: Context) -> CallToolResult:
    """Find a customer in the CRM by email."""
    return _get("/crm/lookup", {"email": email}, ctx)


@server.tool(annotations=READ)
def get_ticket(ticket_id: str, ctx: Context) -> CallToolResult:
    """Read a helpdesk ticket."""
    return _get("/tickets/get", {"ticket_id": ticket_id}, ctx)


@server.tool(annotations=READ)
def search_kb(q: str, ctx: Context) -> CallToolResult:
    """Search the knowledge base."""
    return _get("/kb/search", {"q": q}, ctx)


@server.tool(annotations=READ)
def find_by_key(system: str, idempotency_key: str, ctx: Context) -> CallToolResult:
    """Whether a write with this idempotency key happened (mail and payments can tell)."""
    result = _get(f"/{system}/by-key", {"key": idempotency_key}, ctx)
    meta = result.meta or {}
    if result.is_error and meta.get("taskpilots/status") == 404:
        return _answer({"found": False})
    return result


@server.tool(annotations=ToolAnnotations(destructiveHint=False, idempotentHint=False))
def send_mail(to: str, subject: str, body: str, ctx: Context) -> CallToolResult:
    """Send an email to a customer."""
    return _request(
        "POST", "/mail/send", body={"to": to, "subject": subject, "body": body}, ctx=ctx
    )


@server.tool(annotations=ToolAnnotations(destructiveHint=False, idempotentHint=True))
def update_ticket(ticket_id: str, status: str, ctx: Context) -> CallToolResult:
    """Change a helpdesk ticket's status (open, pending, solved, closed)."""
    return _request(
        "POST", "/tickets/update", body={"ticket_id": ticket_id, "status": status}, ctx=ctx
    )


@server.tool(annotations=ToolAnnotations(destructiveHint=True, idempotentHint=True))
def refund_payment(payment_id: str, amount: float, ctx: Context) -> CallToolResult:
    """Refund (part of) a customer's payment."""
    return _request(
        "POST", "/payments/refund", body={"payment_id": payment_id, "amount": amount}, ctx=ctx
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http", type=int, metavar="PORT", help="serve streamable HTTP on PORT")
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args()
    # Tool errors are answers here, not crashes: keep stderr (the client's log) quiet.
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("mcp").setLevel(logging.WARNING)
    if args.http is not None:
        server.run("streamable-http", host=args.host, port=args.http)
    else:
        server.run()


if __name__ == "__main__":
    main()

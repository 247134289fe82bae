"""The sandbox's simulated systems: what each one accepts (validation), does (the writes, under
the store's lock) and answers (the reads). Standard library only, like the server
(taskpilots/sandbox/server.py) that serves them. Reference: docs/sandbox.md.
"""

from __future__ import annotations

import json
import math
import secrets
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

# Switch defaults per system; kb is read-only and has none.
DEFAULT_CONFIG: dict[str, dict[str, bool]] = {
    "mail": {"dedupes": False, "lookup": True},
    "tickets": {"dedupes": True, "lookup": False},
    "crm": {"dedupes": False, "lookup": False},
    "payments": {"dedupes": True, "lookup": True},
}
SYSTEMS = ("mail", "tickets", "crm", "payments", "kb")

TICKET_STATUSES = ("open", "pending", "solved", "closed")

KB_ARTICLES = (
    {
        "id": "kb_refunds",
        "title": "How refunds work",
        "text": "Refunds reach the card in 5-10 days.",
    },
    {"id": "kb_password", "title": "Resetting your password", "text": "Use 'Forgot password'."},
    {"id": "kb_shipping", "title": "Shipping times", "text": "Orders ship within 2 business days."},
    {"id": "kb_cancel", "title": "Cancelling a subscription", "text": "Cancel from Billing."},
)
# The degraded fallback: a fixed answer that needs no index, so it is "always up".
KB_FAQ = (
    {"q": "refund", "a": "Refunds reach the card in 5-10 business days."},
    {"q": "password", "a": "Use 'Forgot password' on the sign-in page."},
    {"q": "shipping", "a": "Orders ship within 2 business days."},
)


class InvalidInput(Exception):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


class Conflict(Exception):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def _new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(8)}"


# --- validation helpers -------------------------------------------------------------------------


def _required_str(body: dict[str, Any], field: str, max_length: int = 1000) -> str:
    value = body.get(field)
    if not isinstance(value, str) or not value.strip():
        raise InvalidInput(field, f"{field} is required and must be a non-empty string")
    if len(value) > max_length:
        raise InvalidInput(field, f"{field} is longer than {max_length} characters")
    return value


def _optional_str(body: dict[str, Any], field: str, max_length: int = 10_000) -> str | None:
    value = body.get(field)
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidInput(field, f"{field} must be a string")
    if len(value) > max_length:
        raise InvalidInput(field, f"{field} is longer than {max_length} characters")
    return value


def _email(body: dict[str, Any], field: str) -> str:
    value = _required_str(body, field, max_length=254).strip()
    local, at, domain = value.partition("@")
    if not at or not local or "." not in domain:
        raise InvalidInput(field, f"{field} is not an email address")
    return value.lower()


def _positive_amount(body: dict[str, Any], field: str) -> float:
    value = body.get(field)
    # bool is an int subclass; `true` is not an amount.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput(field, f"{field} is required and must be a number")
    if not math.isfinite(value) or value <= 0:
        raise InvalidInput(field, f"{field} must be greater than 0")
    if value > 1_000_000_000:
        raise InvalidInput(field, f"{field} is too large")
    return value


# --- the systems ---------------------------------------------------------------------------------
# A write is split in two: `validate` is pure and runs before anything is locked; `perform` runs
# under the store lock with the validated body, so checks against the ledger (is this refund
# already voided?) and the commit cannot interleave with another request.

Perform = Callable[[sqlite3.Connection, dict[str, Any]], tuple[str, str | None, dict[str, Any]]]


@dataclass(frozen=True)
class WriteAction:
    validate: Callable[[dict[str, Any]], dict[str, Any]]
    perform: Perform


def _validate_mail_send(body: dict[str, Any]) -> dict[str, Any]:
    return {
        "to": _email(body, "to"),
        "subject": _required_str(body, "subject", 998),
        "body": _required_str(body, "body", 100_000),
    }


def _perform_mail_send(db: sqlite3.Connection, body: dict[str, Any]) -> tuple[str, str, dict]:
    message_id = _new_id("msg")
    return message_id, body["to"], {"id": message_id, "status": "sent"}


def _validate_ticket_update(body: dict[str, Any]) -> dict[str, Any]:
    cleaned: dict[str, Any] = {"ticket_id": _required_str(body, "ticket_id", 100)}
    status = _optional_str(body, "status", 20)
    if status is not None and status not in TICKET_STATUSES:
        raise InvalidInput("status", f"status must be one of {', '.join(TICKET_STATUSES)}")
    for field, value in (
        ("status", status),
        ("comment", _optional_str(body, "comment")),
        ("assignee", _optional_str(body, "assignee", 200)),
    ):
        if value is not None:
            cleaned[field] = value
    if len(cleaned) == 1:
        raise InvalidInput("status", "nothing to update: give status, comment or assignee")
    return cleaned


def _perform_ticket_update(db: sqlite3.Connection, body: dict[str, Any]) -> tuple[str, str, dict]:
    update_id = _new_id("tku")
    ticket = _ticket_state(db, body["ticket_id"], pending_update=body)
    return update_id, body["ticket_id"], {"id": update_id, "status": "updated", "ticket": ticket}


def _validate_crm_create(body: dict[str, Any]) -> dict[str, Any]:
    cleaned: dict[str, Any] = {"email": _email(body, "email")}
    name = _optional_str(body, "name", 200)
    if name is not None:
        cleaned["name"] = name
    return cleaned


def _perform_crm_create(db: sqlite3.Connection, body: dict[str, Any]) -> tuple[str, str, dict]:
    contact_id = _new_id("con")
    return contact_id, body["email"], {"id": contact_id, "status": "created", **body}


def _validate_crm_tag(body: dict[str, Any]) -> dict[str, Any]:
    return {
        "contact_id": _required_str(body, "contact_id", 100),
        "tag": _required_str(body, "tag", 100),
    }


def _perform_crm_tag(db: sqlite3.Connection, body: dict[str, Any]) -> tuple[str, str, dict]:
    tag_id = _new_id("tag")
    response = {"id": tag_id, "status": "tagged", "contact_id": body["contact_id"]}
    return tag_id, body["contact_id"], {**response, "tag": body["tag"]}


def _validate_refund(body: dict[str, Any]) -> dict[str, Any]:
    cleaned: dict[str, Any] = {
        "payment_id": _required_str(body, "payment_id", 100),
        "amount": _positive_amount(body, "amount"),
        "currency": (_optional_str(body, "currency", 3) or "USD").upper(),
    }
    if len(cleaned["currency"]) != 3 or not cleaned["currency"].isalpha():
        raise InvalidInput("currency", "currency must be a 3-letter code")
    reason = _optional_str(body, "reason", 1000)
    if reason is not None:
        cleaned["reason"] = reason
    return cleaned


def _perform_refund(db: sqlite3.Connection, body: dict[str, Any]) -> tuple[str, str, dict]:
    refund_id = _new_id("re")
    response = {"id": refund_id, "status": "refunded", "payment_id": body["payment_id"]}
    return refund_id, body["payment_id"], {**response, "amount": body["amount"]}


def _validate_void(body: dict[str, Any]) -> dict[str, Any]:
    return {"refund_id": _required_str(body, "refund_id", 100)}


def _perform_void(db: sqlite3.Connection, body: dict[str, Any]) -> tuple[str, str, dict]:
    refund_id = body["refund_id"]
    refund = db.execute(
        "SELECT 1 FROM ledger WHERE system = 'payments' AND action = 'refund' AND external_id = ?",
        (refund_id,),
    ).fetchone()
    if refund is None:
        raise InvalidInput("refund_id", "no such refund")
    voided = db.execute(
        "SELECT external_id FROM ledger WHERE system = 'payments' AND action = 'void' "
        "AND target = ?",
        (refund_id,),
    ).fetchone()
    if voided is not None:
        # Like real payment APIs: a second void under a new key is an error, not a no-op, so a
        # compensation that was regenerated with a fresh key is visible.
        raise Conflict("refund_id", f"refund already voided by {voided[0]}")
    void_id = _new_id("vd")
    return void_id, refund_id, {"id": void_id, "status": "voided", "refund_id": refund_id}


WRITES: dict[tuple[str, str], WriteAction] = {
    ("mail", "send"): WriteAction(_validate_mail_send, _perform_mail_send),
    ("tickets", "update"): WriteAction(_validate_ticket_update, _perform_ticket_update),
    ("crm", "create"): WriteAction(_validate_crm_create, _perform_crm_create),
    ("crm", "tag"): WriteAction(_validate_crm_tag, _perform_crm_tag),
    ("payments", "refund"): WriteAction(_validate_refund, _perform_refund),
    ("payments", "void"): WriteAction(_validate_void, _perform_void),
}


def _ticket_state(
    db: sqlite3.Connection, ticket_id: str, pending_update: dict[str, Any] | None = None
) -> dict[str, Any]:
    # Every ticket exists and starts open; its state is the fold of its committed updates.
    ticket: dict[str, Any] = {"ticket_id": ticket_id, "status": "open", "assignee": None}
    comments: list[str] = []
    rows = db.execute(
        "SELECT request FROM ledger WHERE system = 'tickets' AND action = 'update' "
        "AND target = ? ORDER BY seq",
        (ticket_id,),
    ).fetchall()
    updates = [json.loads(row[0]) for row in rows]
    if pending_update is not None:
        updates.append(pending_update)
    for update in updates:
        for field in ("status", "assignee"):
            if field in update:
                ticket[field] = update[field]
        if "comment" in update:
            comments.append(update["comment"])
    return {**ticket, "comments": comments, "updates": len(updates)}


def _read_ticket(db: sqlite3.Connection, query: dict[str, str]) -> dict[str, Any]:
    ticket_id = _required_str(query, "ticket_id", 100)
    return _ticket_state(db, ticket_id)


def _read_crm_lookup(db: sqlite3.Connection, query: dict[str, str]) -> dict[str, Any]:
    email = _email(query, "email")
    rows = db.execute(
        "SELECT external_id, request FROM ledger WHERE system = 'crm' AND action = 'create' "
        "AND target = ? ORDER BY seq",
        (email,),
    ).fetchall()
    if not rows:
        return {"found": False, "contact": None, "matches": 0}
    contact_id, request = rows[0][0], json.loads(rows[0][1])
    tags = [
        json.loads(row[0])["tag"]
        for row in db.execute(
            "SELECT request FROM ledger WHERE system = 'crm' AND action = 'tag' AND target = ? "
            "ORDER BY seq",
            (contact_id,),
        )
    ]
    contact = {"id": contact_id, "email": email, "name": request.get("name"), "tags": tags}
    # `matches` > 1 is how a duplicate create (crm does not dedupe) shows up to a reader.
    return {"found": True, "contact": contact, "matches": len(rows)}


def _read_kb_search(db: sqlite3.Connection, query: dict[str, str]) -> dict[str, Any]:
    words = _required_str(query, "q", 200).lower().split()
    hits = [
        article
        for article in KB_ARTICLES
        if any(word in (article["title"] + " " + article["text"]).lower() for word in words)
    ]
    return {"results": hits}


def _read_kb_faq(db: sqlite3.Connection, query: dict[str, str]) -> dict[str, Any]:
    q = _required_str(query, "q", 200).lower()
    answers = [entry for entry in KB_FAQ if entry["q"] in q]
    return {"results": answers, "degraded": True}


READS: dict[tuple[str, str], Callable[[sqlite3.Connection, dict[str, str]], dict[str, Any]]] = {
    ("tickets", "get"): _read_ticket,
    ("crm", "lookup"): _read_crm_lookup,
    ("kb", "search"): _read_kb_search,
    ("kb", "faq"): _read_kb_faq,
}
# Reachable whatever faults or outages are set: this is the fallback a degraded step uses.
ALWAYS_UP = {("kb", "faq")}


def actions_of(system: str) -> set[str]:
    actions = {action for (sys_name, action) in (*WRITES, *READS) if sys_name == system}
    if system in DEFAULT_CONFIG:
        actions.add("by-key")
    return actions

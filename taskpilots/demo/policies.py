"""The decisions a model would make in the demo workflows, as deterministic, named functions.

Each is the place where a real model call plugs in: it reads the step context and returns a JSON
value, and the engine records that value as the step's result, so a resumed run never asks again.
"""

from __future__ import annotations

from runs.workflows import Context

REFUND_APPROVAL_THRESHOLD = 100
REFUND_DEFAULT_CURRENCY = "USD"
INTENTS = {
    "refund": ("refund", "money back", "charged twice", "退款"),
    "delivery": ("where is", "delivery", "shipping", "package", "物流"),
    "account": ("password", "login", "account", "账号"),
}


def classify_message(ctx: Context) -> dict:
    text = ctx.input["message"].lower()
    for intent, words in INTENTS.items():
        if any(word in text for word in words):
            return {"intent": intent, "confidence": 0.9}
    return {"intent": "other", "confidence": 0.5}


def kb_query(ctx: Context) -> dict:
    return {"q": ctx.results["classify"]["intent"]}


def compose_reply(ctx: Context) -> dict:
    customer = (ctx.results.get("lookup_customer") or {}).get("contact") or {}
    name = customer.get("name") or "there"
    knowledge = ctx.results.get("search_kb") or {}
    if knowledge.get("degraded"):
        articles = (knowledge.get("response") or {}).get("results") or []
    else:
        articles = knowledge.get("results") or []
    first = articles[0] if articles else {}
    # Full articles have "text"; the degraded FAQ answers with "a".
    answer = first.get("text") or first.get("a") or "A colleague will follow up shortly."
    return {
        "to": ctx.input["email"],
        "subject": f"Re: {ctx.input.get('subject') or 'your message'}",
        "body": f"Hi {name},\n\n{answer}\n\nKind regards,\nSupport",
    }


def ticket_update(ctx: Context) -> dict:
    return {
        "ticket_id": ctx.input["ticket_id"],
        "status": "pending",
        "comment": "Replied to the customer.",
    }


def refund_facts(ctx: Context) -> dict:
    amount = float(ctx.input["amount"])
    return {
        "amount": amount,
        # Explicit in the call, so the person approving sees the currency that will be refunded
        # (the payment system would otherwise apply its default, USD).
        "currency": (ctx.input.get("currency") or REFUND_DEFAULT_CURRENCY).upper(),
        "payment_id": ctx.input["payment_id"],
        "needs_approval": amount > REFUND_APPROVAL_THRESHOLD,
        "reason": ctx.input.get("reason", ""),
    }


def refund_params(ctx: Context) -> dict:
    facts = ctx.results["collect_facts"]
    # Facts recorded before the currency was (runs paused across an upgrade) mean USD.
    currency = facts.get("currency", REFUND_DEFAULT_CURRENCY)
    return {
        "payment_id": facts["payment_id"],
        "amount": facts["amount"],
        "currency": currency,
        "reason": facts["reason"] or "customer request",
    }


def approved_refund(ctx: Context) -> dict:
    return ctx.results["approve_refund"]["params"]


def lead_tag(ctx: Context) -> dict:
    company = ctx.input.get("company", "")
    tag = "enterprise" if ctx.input.get("employees", 0) >= 500 else "smb"
    return {"contact_id": ctx.results["create_contact"]["id"], "tag": f"{tag}:{company}"[:100]}


def sales_notification(ctx: Context) -> dict:
    return {
        "to": "sales@example.com",
        "subject": f"New lead: {ctx.input['name']}",
        "body": f"{ctx.input['name']} <{ctx.input['email']}> from {ctx.input.get('company', '?')}"
        f" was added to the CRM as {ctx.results['create_contact']['id']}.",
    }

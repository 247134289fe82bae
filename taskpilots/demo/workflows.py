"""The three demo workflows from the source articles, against the simulated external systems.

Each is also registered under a `drill.` name: `manage.py drill` runs those, so the drill's
escalation rules (short wait windows, fast retries) never touch the real ones.
"""

from __future__ import annotations

from datetime import timedelta

from runs import workflows
from runs.workflows import Workflow, approval, compute, read, side_effect, wait_event
from taskpilots.demo import policies
from taskpilots.demo import tools as _tools  # noqa: F401  (registers the sandbox tools)


def _validate_reply(data: dict) -> dict:
    for field in ("message", "email", "ticket_id"):
        if not isinstance(data.get(field), str) or not data[field].strip():
            raise ValueError(f"{field} must be a non-empty string")
    return data


def _validate_refund(data: dict) -> dict:
    if not isinstance(data.get("payment_id"), str) or not data["payment_id"]:
        raise ValueError("payment_id must be a non-empty string")
    amount = data.get("amount")
    if isinstance(amount, bool) or not isinstance(amount, int | float) or amount <= 0:
        raise ValueError("amount must be a positive number")
    currency = data.get("currency", "USD")
    if not isinstance(currency, str) or len(currency) != 3 or not currency.isalpha():
        raise ValueError("currency must be a 3-letter code (default USD)")
    return data


def _validate_lead(data: dict) -> dict:
    for field in ("email", "name"):
        if not isinstance(data.get(field), str) or not data[field].strip():
            raise ValueError(f"{field} must be a non-empty string")
    return data


def support_reply(name: str) -> Workflow:
    return Workflow(
        name,
        1,
        [
            compute("classify", policies.classify_message, stage="triage"),
            read(
                "lookup_customer",
                "crm.lookup",
                params=lambda ctx: {"email": ctx.input["email"]},
                stage="research",
            ),
            read("search_kb", "kb.search", params=policies.kb_query, stage="research"),
            side_effect("send_reply", "mail.send", params=policies.compose_reply, stage="reply"),
            side_effect(
                "update_ticket", "tickets.update", params=policies.ticket_update, stage="close"
            ),
        ],
        description="Answer a customer message: classify, look up the customer and the "
        "knowledge base, reply by mail, update the ticket.",
        scopes=("mail:send", "tickets:write", "crm:read"),
        validate_input=_validate_reply,
    )


def refund_approval(name: str) -> Workflow:
    return Workflow(
        name,
        1,
        [
            compute("collect_facts", policies.refund_facts, stage="facts"),
            approval(
                "approve_refund",
                tool="payments.refund",
                params=policies.refund_params,
                when=lambda ctx: ctx.results["collect_facts"]["needs_approval"],
                reason=lambda ctx: (
                    f"Refund of {ctx.results['collect_facts']['amount']:.2f} "
                    f"{ctx.results['collect_facts'].get('currency', 'USD')} is above the "
                    f"{policies.REFUND_APPROVAL_THRESHOLD} threshold"
                ),
                queue="support",
                sla=timedelta(hours=4),
                stage="approval",
            ),
            side_effect(
                "issue_refund", "payments.refund", params=policies.approved_refund, stage="refund"
            ),
            wait_event(
                "await_settlement",
                "payment.settled",
                correlation=lambda ctx: ctx.results["issue_refund"]["id"],
                timeout=timedelta(hours=24),
                stage="settlement",
            ),
        ],
        description="Refund a payment: facts, approval above the threshold, the refund "
        "(compensated by a void), then the bank's settlement callback.",
        scopes=("payments:refund",),
        validate_input=_validate_refund,
    )


def lead_sync(name: str) -> Workflow:
    return Workflow(
        name,
        1,
        [
            read(
                "read_lead",
                "crm.lookup",
                params=lambda ctx: {"email": ctx.input["email"]},
                stage="read",
            ),
            side_effect(
                "create_contact",
                "crm.create",
                params=lambda ctx: {"email": ctx.input["email"], "name": ctx.input["name"]},
                stage="sync",
            ),
            side_effect("tag_contact", "crm.tag", params=policies.lead_tag, stage="sync"),
            side_effect(
                "notify_sales", "mail.send", params=policies.sales_notification, stage="notify"
            ),
        ],
        description="Sync a lead into the CRM: read, create the contact, tag it, notify sales.",
        scopes=("crm:write", "crm:read", "mail:send"),
        validate_input=_validate_lead,
    )


DEMO = {
    "support.reply": support_reply,
    "refund.approval": refund_approval,
    "crm.lead_sync": lead_sync,
}
for _name, _factory in DEMO.items():
    workflows.register(_factory(_name), replace=True)
    workflows.register(_factory(f"drill.{_name}"), replace=True)

# For the drill's degrade_write scenario only: one mail through the switched-off relay.
workflows.register(
    Workflow(
        "drill.mail.degrade",
        1,
        [
            side_effect(
                "send",
                "mail.relay_down",
                params=lambda ctx: {"to": ctx.input["email"], "subject": "Hi", "body": "Hello."},
                stage="notify",
            )
        ],
        scopes=("mail:send",),
    ),
    replace=True,
)

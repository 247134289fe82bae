"""Tools for the simulated external systems (taskpilots/sandbox), through the generic HTTP adapter.

The switches mirror the sandbox defaults, so every branch of the unknown-outcome logic is taken
by some system: mail can be asked by key, tickets dedupe, CRM can do neither (a person decides),
payments do both.

Each tool states its full JSON input schema (types, formats, bounds, required parameters), the
rules the sandbox's systems apply to a call. Parameters a person edits are checked against it
before the decision is recorded (approvals/params.py), so an edit the system would refuse (a
negative amount, a currency that is not a code) is refused in the console or the API, not by
the payment system after the run went on. It is also the schema an agent's model sees for the
tool (runs.agents.tool_info).
"""

from __future__ import annotations

from django.conf import settings

from runs import tools
from runs.agents import AgentToolInfo, set_tool_info
from runs.models import FailureClass, Risk
from runs.tools import HttpResponse, http_tool


def sandbox(path: str):
    # Resolved at call time, so the base URL can change (tests start their own sandbox).
    return lambda: settings.TASKPILOTS["SANDBOX_URL"].rstrip("/") + path


def classify(response: HttpResponse, tool_name: str) -> str | None:
    # The sandbox marks an outage; a real system would be recognised by its own signals.
    if response.status == 503 and response.headers.get("x-sandbox-outage"):
        return FailureClass.OUTAGE
    return None


def fields(*names: str):
    """A response check: the answer is a JSON object with these fields (an answer without them
    is from another API version: `api_drift`, see docs/rules.md)."""

    def check(response) -> str | None:
        if not isinstance(response, dict):
            return f"expected a JSON object, got {type(response).__name__}"
        missing = [name for name in names if name not in response]
        return f"missing {', '.join(missing)}" if missing else None

    return check


# -- input schemas: what taskpilots/sandbox/server.py accepts, stated as JSON schema

# A refund or charge the payment system takes: more than 0, at most a billion.
MAX_AMOUNT = 1_000_000_000
TICKET_STATUSES = ("open", "pending", "solved", "closed")


def text(max_length: int, **extra) -> dict:
    """A non-blank string (the systems strip it and refuse an empty one)."""
    return {"type": "string", "minLength": 1, "maxLength": max_length, "pattern": "\\S", **extra}


EMAIL = {
    "type": "string",
    "maxLength": 254,
    "pattern": "^[^@\\s]+@[^@\\s]+\\.[^@\\s]+$",
    "description": "an email address",
}


def params(required: tuple[str, ...], **properties: dict) -> dict:
    return {"type": "object", "properties": properties, "required": list(required)}


def _define(name, method, path, *, lookup: bool = False, input_schema=None, **meta):
    system = path.strip("/").split("/")[0]
    tool = tools.register(
        http_tool(
            name,
            method,
            sandbox(path),
            lookup_url=sandbox(f"/{system}/by-key") if lookup else None,
            classify=classify,
            **meta,
        ),
        replace=True,
    )
    if input_schema is not None:
        describe(tool, input_schema)
    return tool


def describe(tool, input_schema: dict) -> None:
    set_tool_info(tool.name, AgentToolInfo(input_schema=input_schema, description=tool.description))


MAIL = params(("to", "subject", "body"), to=EMAIL, subject=text(998), body=text(100_000))


_define(
    "mail.send",
    "POST",
    "/mail/send",
    side_effect=True,
    risk=Risk.MEDIUM,
    lookup=True,
    target=lambda p: f"mailbox:{p['to']}",
    scope="mail:send",
    params_schema={"to": str, "subject": str, "body": str},
    input_schema=MAIL,
    description="Send an email to a customer.",
)
_define(
    "tickets.update",
    "POST",
    "/tickets/update",
    side_effect=True,
    risk=Risk.LOW,
    dedupes_by_key=True,
    target=lambda p: f"ticket:{p['ticket_id']}",
    scope="tickets:write",
    params_schema={"ticket_id": str, "status": str},
    input_schema=params(
        ("ticket_id", "status"),
        ticket_id=text(100),
        status={"type": "string", "enum": list(TICKET_STATUSES)},
        comment={"type": "string", "maxLength": 10_000},
        assignee={"type": "string", "maxLength": 200},
    ),
    description="Change a helpdesk ticket's status.",
)
_define(
    "tickets.get",
    "GET",
    "/tickets/get",
    target=lambda p: f"ticket:{p['ticket_id']}",
    input_schema=params(("ticket_id",), ticket_id=text(100)),
)
_define(
    "crm.lookup",
    "GET",
    "/crm/lookup",
    target=lambda p: f"contact:{p['email']}",
    response_check=fields("found", "contact"),
    input_schema=params(("email",), email=EMAIL),
)
_define(
    "crm.create",
    "POST",
    "/crm/create",
    side_effect=True,
    risk=Risk.MEDIUM,
    target=lambda p: f"contact:{p['email']}",
    scope="crm:write",
    params_schema={"email": str, "name": str},
    input_schema=params(("email", "name"), email=EMAIL, name=text(200)),
    description="Create a CRM contact for a lead.",
)
_define(
    "crm.tag",
    "POST",
    "/crm/tag",
    side_effect=True,
    risk=Risk.LOW,
    target=lambda p: f"contact:{p.get('contact_id')}",
    scope="crm:write",
    params_schema={"contact_id": str, "tag": str},
    input_schema=params(("contact_id", "tag"), contact_id=text(100), tag=text(100)),
    description="Tag a CRM contact.",
)
_define(
    "payments.void",
    "POST",
    "/payments/void",
    side_effect=True,
    risk=Risk.HIGH,
    dedupes_by_key=True,
    lookup=True,
    target=lambda p: f"refund:{p['refund_id']}",
    scope="payments:refund",
    params_schema={"refund_id": str},
    input_schema=params(("refund_id",), refund_id=text(100)),
    expect_fields=("refund_id",),
    description="Void a refund (the compensation of payments.refund).",
)
_define(
    "payments.refund",
    "POST",
    "/payments/refund",
    side_effect=True,
    risk=Risk.HIGH,
    dedupes_by_key=True,
    lookup=True,
    target=lambda p: f"payment:{p['payment_id']}",
    scope="payments:refund",
    params_schema={"payment_id": str, "amount": float},
    input_schema=params(
        ("payment_id", "amount"),
        payment_id=text(100),
        amount={
            "type": "number",
            "exclusiveMinimum": 0,
            "maximum": MAX_AMOUNT,
            "description": "in the currency's units, more than 0",
        },
        currency={
            "type": "string",
            "pattern": "^[A-Z]{3}$",
            "description": "an ISO 4217 code such as USD or EUR (default USD)",
        },
        reason={"type": "string", "maxLength": 1000},
    ),
    expect_fields=("payment_id", "amount"),
    # What approval rules measure it by (the payment system's default currency is USD).
    amount_param="amount",
    currency_param="currency",
    default_currency="USD",
    compensating_tool="payments.void",
    compensation_params=lambda params, original: {"refund_id": original["external_id"]},
    description="Refund a customer's payment.",
)
_define(
    "kb.faq",
    "GET",
    "/kb/faq",
    input_schema=params((), q={"type": "string", "maxLength": 200}),
    description="Static FAQ answers (always up).",
)
_define(
    "kb.search",
    "GET",
    "/kb/search",
    fallback_tool="kb.faq",
    response_check=fields("results"),
    input_schema=params(("q",), q=text(200)),
    description="Search the knowledge base.",
)

# A mail relay that is switched off: nothing listens on its address, so every call is refused
# before anything is sent. The drill's degrade_write scenario writes through it under a degrade
# rule, and mail.send (its fallback) does each write instead.
tools.register(
    http_tool(
        "mail.relay_down",
        "POST",
        "http://127.0.0.1:9/mail/send",
        side_effect=True,
        risk=Risk.MEDIUM,
        fallback_tool="mail.send",
        target=lambda p: f"mailbox:{p['to']}",
        scope="mail:send",
        params_schema={"to": str, "subject": str, "body": str},
        description="Send an email through the old relay (switched off; falls back to mail.send).",
    ),
    replace=True,
)
describe(tools.registered("mail.relay_down"), MAIL)

"""The demo agent, registered as workflow `demo.agent`: a refund desk built with the OpenAI Agents
SDK, using one plain Python tool and four tools of a local MCP server (taskpilots/demo/servers/
sandbox.py, in front of the simulated systems).

    engine.start_run("demo.agent", {"message": "My order arrived broken, please refund it.",
                                    "customer": "ann@example.com", "payment": "pay_1",
                                    "amount": 120.0, "ticket": "T-1", "days_since_purchase": 10})

The model is a deterministic policy (`RefundDeskModel`, no network): it decides each turn from
the conversation alone, so a run resumed in another process gets the same decisions. The refund
parks the run for approval in the console; an edited amount is what is refunded and what the
customer is told.

The MCP tools are registered from a pinned manifest (servers/sandbox.tools.json, what the
server's tools/list answers; a test checks they agree), so importing this module never starts the
server. Calls start it over stdio, with this interpreter.
"""

from __future__ import annotations

import json
from pathlib import Path

from django.conf import settings

from runs.agents import MissingExtra
from runs.agents.mcp import (
    McpServer,
    McpToolConfig,
    mcp_function_tools,
    python_command,
    register_mcp_tools,
)
from runs.agents.sdk import ToolPolicy, register_agent

try:
    from agents import Agent, ItemHelpers, function_tool
    from agents.items import ModelResponse
    from agents.models.interface import Model
    from agents.testing import assistant_message, function_call
    from agents.usage import Usage
except ModuleNotFoundError as exc:  # the optional `agents` extra
    raise MissingExtra("openai-agents") from exc

SERVER_SCRIPT = Path(__file__).resolve().parent / "servers" / "sandbox.py"
MANIFEST = SERVER_SCRIPT.with_name("sandbox.tools.json")

SANDBOX_MCP = McpServer(
    "sandbox",
    # The worker's own interpreter, so the server finds the same packages.
    command=python_command(str(SERVER_SCRIPT)),
    env=lambda: {"TASKPILOTS_SANDBOX_URL": settings.TASKPILOTS["SANDBOX_URL"]},
    timeout=20,
)


MCP_CONFIG = {
    "crm_lookup": McpToolConfig(target=lambda p: f"contact:{p['email']}"),
    "send_mail": McpToolConfig(
        target=lambda p: f"mailbox:{p['to']}",
        lookup_tool="find_by_key",
        lookup_arguments=lambda key: {"system": "mail", "idempotency_key": key},
    ),
    "update_ticket": McpToolConfig(target=lambda p: f"ticket:{p['ticket_id']}"),
    "refund_payment": McpToolConfig(
        target=lambda p: f"payment:{p['payment_id']}",
        lookup_tool="find_by_key",
        lookup_arguments=lambda key: {"system": "payments", "idempotency_key": key},
        needs_approval=True,
        approval_reason="Refunds need a person's approval.",
    ),
}

MCP_TOOLS = register_mcp_tools(
    SANDBOX_MCP,
    include=list(MCP_CONFIG),
    config=MCP_CONFIG,
    manifest=json.loads(MANIFEST.read_text()),
)


@function_tool
def check_refund_policy(amount: float, days_since_purchase: int) -> dict:
    """Whether a refund of `amount` is within policy."""
    eligible = days_since_purchase <= 30 and 0 < amount <= 500
    return {
        "eligible": eligible,
        "reason": "within 30 days and at most 500" if eligible else "outside the refund policy",
    }


# --------------------------------------------------------------------------------------------
# The policy model


def _case(items: list[dict]) -> dict:
    for item in items:
        if item.get("role") == "user" and isinstance(item.get("content"), str):
            _, _, case = item["content"].partition("\nCase: ")
            if case:
                return json.loads(case)
    return {}


def _outputs(items: list[dict]) -> dict[str, dict]:
    outputs = {}
    for item in items:
        if item.get("type") == "function_call_output":
            try:
                outputs[item["call_id"]] = json.loads(item["output"])
            except (ValueError, TypeError):
                outputs[item["call_id"]] = {"error": str(item.get("output"))}
    return outputs


def _unwrap(output: dict) -> tuple[dict, dict]:
    """(the tool's own result, the approval note if a person decided)."""
    approval = output.get("approval") if isinstance(output, dict) else None
    if approval is not None:
        output = output.get("result") or {}
    if isinstance(output, dict) and "server" in output and "result" in output:
        output = output["result"]  # an MCP tool's normalised response
    return (output if isinstance(output, dict) else {"value": output}), (approval or {})


def decide(items: list[dict]) -> list:
    """The refund desk's next move, from the conversation alone."""
    case, outputs = _case(items), _outputs(items)
    if "call-lookup" not in outputs:
        return [
            function_call("crm_lookup", {"email": case["customer"]}, call_id="call-lookup"),
            function_call(
                "check_refund_policy",
                {"amount": case["amount"], "days_since_purchase": case["days_since_purchase"]},
                call_id="call-policy",
            ),
        ]
    policy, _ = _unwrap(outputs["call-policy"])
    if not policy.get("eligible"):
        if "call-mail" not in outputs:
            return [
                function_call(
                    "send_mail",
                    {
                        "to": case["customer"],
                        "subject": "About your refund request",
                        "body": f"We cannot refund this order: {policy.get('reason')}.",
                    },
                    call_id="call-mail",
                )
            ]
        return [assistant_message("Refund declined: outside policy; the customer was told.")]
    if "call-refund" not in outputs:
        return [
            function_call(
                "refund_payment",
                {"payment_id": case["payment"], "amount": case["amount"]},
                call_id="call-refund",
            )
        ]
    refund, approval = _unwrap(outputs["call-refund"])
    amount = (approval.get("arguments") or {}).get("amount", case["amount"])
    if "call-mail" not in outputs:
        body = (
            f"We refunded {amount:.2f} to your payment {case['payment']} "
            f"(refund {refund.get('id')})."
        )
        return [
            function_call(
                "send_mail",
                {"to": case["customer"], "subject": "Your refund", "body": body},
                call_id="call-mail",
            ),
            function_call(
                "update_ticket",
                {"ticket_id": case["ticket"], "status": "solved"},
                call_id="call-ticket",
            ),
        ]
    return [assistant_message(f"Refunded {amount:.2f}, told the customer and solved the ticket.")]


class RefundDeskModel(Model):
    """A deterministic stand-in for an LLM (the SDK's Model interface; no network)."""

    async def get_response(
        self,
        system_instructions,
        input,
        model_settings,
        tools,
        output_schema,
        handoffs,
        tracing,
        *,
        previous_response_id=None,
        conversation_id=None,
        prompt=None,
    ) -> ModelResponse:
        items = ItemHelpers.input_to_new_input_list(input)
        return ModelResponse(output=decide(items), usage=Usage(requests=1), response_id=None)

    def stream_response(self, *args, **kwargs):
        raise NotImplementedError("the refund desk model does not stream")


# --------------------------------------------------------------------------------------------
# The agent and its registration


def _validate(data: dict) -> dict:
    out = {}
    for name, kind in (("message", str), ("customer", str), ("payment", str), ("ticket", str)):
        if not isinstance(data.get(name), kind) or not data[name].strip():
            raise ValueError(f"{name!r} must be a non-empty string")
        out[name] = data[name][:2000]
    amount = data.get("amount")
    if isinstance(amount, bool) or not isinstance(amount, int | float) or amount <= 0:
        raise ValueError("'amount' must be a positive number")
    days = data.get("days_since_purchase", 0)
    if isinstance(days, bool) or not isinstance(days, int) or days < 0:
        raise ValueError("'days_since_purchase' must be a whole number of days")
    return {**out, "amount": float(amount), "days_since_purchase": days}


def _input(data: dict) -> list[dict]:
    case = {k: data[k] for k in ("customer", "payment", "amount", "ticket", "days_since_purchase")}
    return [{"role": "user", "content": f"{data['message']}\nCase: {json.dumps(case)}"}]


AGENT = Agent(
    name="refund-desk",
    instructions="You handle refund requests: check the customer and the policy, refund, "
    "tell the customer and solve the ticket.",
    model=RefundDeskModel(),
    tools=[check_refund_policy, *mcp_function_tools(MCP_TOOLS)],
)

DEMO_AGENT = register_agent(
    "demo.agent",
    AGENT,
    tools={"check_refund_policy": ToolPolicy(side_effect=False, risk="low")},
    build_input=_input,
    validate_input=_validate,
)

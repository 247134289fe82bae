"""A Pydantic AI agent written as Pydantic AI's docs teach (deps, @agent.tool functions, a
structured output_type), with a fake model (FunctionModel) that answers from the conversation,
registered unchanged as the workflow `test.pai_agent`. Imported by the tests and, through
TASKPILOTS_WORKFLOW_MODULES, by their worker processes.

The side-effecting tool sends a mail to the sandbox (the receiving side, which counts what it
got) with the call's idempotency key. Each model call appends a line to the file named by
PAI_MODEL_LOG (when set), so the tests count model calls across processes too; with
PAI_HOLD_AFTER_SEND set, the tool waits after the mail left (a worker to SIGKILL there).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from django.conf import settings
from pydantic import BaseModel
from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from runs.agents.pydantic_ai import ToolPolicy, call_context, register_pydantic_agent
from runs.tools import LookupResult
from taskpilots.sandbox.client import SandboxClient

MODEL_CALLS: list[int] = []
# In-process tests: the "process dies" right after the mail left, before its receipt.
CRASH_AFTER_SEND = {"armed": False}


class Crash(BaseException):
    """Not an Exception: nothing on the call path may catch it."""


@dataclass
class Shop:
    """The agent's dependencies."""

    orders: dict[str, dict]
    sandbox_url: str


class Reply(BaseModel):
    """The agent's structured output."""

    summary: str
    mailed: bool


def fake_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Look the order up, mail the customer, answer: one step per model response so far."""
    MODEL_CALLS.append(1)
    if log := os.environ.get("PAI_MODEL_LOG"):
        with open(log, "a") as out:
            out.write("call\n")
    turn = sum(isinstance(m, ModelResponse) for m in messages)
    if turn == 0:
        return ModelResponse(parts=[ToolCallPart("lookup_order", {"order_id": "o-1"})])
    if turn == 1:
        order = messages[-1].parts[0].content
        mail = {
            "to": order["customer"],
            "subject": "Your order o-1",
            "body": f"We refunded {order['total']:.2f}.",
        }
        return ModelResponse(parts=[ToolCallPart("send_mail", mail)])
    output = info.output_tools[0].name
    answer = {"summary": "Refund mailed to the customer.", "mailed": True}
    return ModelResponse(parts=[ToolCallPart(output, answer)])


agent = Agent(
    FunctionModel(fake_model),
    deps_type=Shop,
    output_type=Reply,
    instructions="Help the customer with their order.",
)


@agent.tool
def lookup_order(ctx: RunContext[Shop], order_id: str) -> dict:
    """Look an order up."""
    return ctx.deps.orders.get(order_id, {"error": "no such order"})


@agent.tool
def send_mail(ctx: RunContext[Shop], to: str, subject: str, body: str) -> dict:
    """Send an email to a customer."""
    call = call_context()
    sent = SandboxClient(ctx.deps.sandbox_url).write(
        "mail",
        "send",
        {"to": to, "subject": subject, "body": body},
        key=call.idempotency_key,
        run=call.run_id,
        step=call.step,
    )
    if CRASH_AFTER_SEND["armed"]:
        CRASH_AFTER_SEND["armed"] = False
        raise Crash
    if hold := os.environ.get("PAI_HOLD_AFTER_SEND"):
        time.sleep(float(hold))
    return sent.json


def mail_by_key(key: str, call) -> LookupResult:
    found = SandboxClient(settings.TASKPILOTS["SANDBOX_URL"]).lookup("mail", key)
    if found.status == 404:
        return LookupResult(found=False)
    body = found.json
    return LookupResult(
        found=bool(body.get("found", True)),
        external_id=str(body.get("external_id") or ""),
        response=body.get("response", body),
    )


def shop(run_input: dict) -> Shop:
    return Shop(
        orders={"o-1": {"order_id": "o-1", "customer": run_input["customer"], "total": 80.0}},
        sandbox_url=settings.TASKPILOTS["SANDBOX_URL"],
    )


def register(approval: bool = False, name: str = "test.pai_agent"):
    mail = ToolPolicy(
        lookup=mail_by_key,
        target=lambda p: f"mailbox:{p['to']}",
        needs_approval=(lambda args: "refund" in args["body"].lower()) if approval else None,
        approval_reason="Mails about refunds are checked first",
    )
    return register_pydantic_agent(
        name,
        agent,
        deps=shop,
        tools={"lookup_order": ToolPolicy(side_effect=False, risk="low"), "send_mail": mail},
    )


register()

"""A LangGraph graph written as LangGraph's docs teach (a StateGraph over MessagesState, an agent
node calling a chat model with its tools bound, a prebuilt ToolNode, tools_condition routing, a
node asking a person with interrupt()), with a fake chat model that answers from the
conversation, registered unchanged as the workflow `test.lg_graph` (and, with the review node,
`test.lg_graph_review`). Imported by the tests and, through TASKPILOTS_WORKFLOW_MODULES, by their
worker processes.

The side-effecting tool sends a mail to the sandbox (the receiving side, which counts what it
got) with the call's idempotency key. Each model call appends a line to the file named by
LG_MODEL_LOG (when set), so the tests count model calls across processes too; with
LG_HOLD_AFTER_SEND set, the tool waits after the mail left (a worker to SIGKILL there).
"""

from __future__ import annotations

import os
import time
from typing import Any

from django.conf import settings
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import interrupt

from runs.agents.langgraph import ToolPolicy, call_context, register_langgraph
from runs.tools import LookupResult
from taskpilots.sandbox.client import SandboxClient

MODEL_CALLS: list[int] = []
# In-process tests: the "process dies" right after the mail left, before its receipt.
CRASH_AFTER_SEND = {"armed": False}
ORDERS = {"o-1": {"order_id": "o-1", "customer": "ann@example.com", "total": 80.0}}


class Crash(BaseException):
    """Not an Exception: nothing on the call path may catch it."""


class FakeShopModel(BaseChatModel):
    """Look the order up, mail the customer, answer: one step per AI message so far."""

    @property
    def _llm_type(self) -> str:
        return "fake-shop"

    def bind_tools(self, tools: Any, **kwargs: Any) -> FakeShopModel:
        return self

    def _generate(self, messages: list[BaseMessage], stop=None, run_manager=None, **kwargs):
        MODEL_CALLS.append(1)
        if log := os.environ.get("LG_MODEL_LOG"):
            with open(log, "a") as out:
                out.write("call\n")
        turn = sum(isinstance(m, AIMessage) for m in messages)
        if turn == 0:
            calls = [{"name": "lookup_order", "args": {"order_id": "o-1"}, "id": "c-1"}]
            message = AIMessage(content="", tool_calls=calls)
        elif turn == 1:
            import json

            order = json.loads(next(m for m in messages if isinstance(m, ToolMessage)).content)
            mail = {
                "to": order["customer"],
                "subject": "Your order o-1",
                "body": f"We refunded {order['total']:.2f}.",
            }
            message = AIMessage(
                content="", tool_calls=[{"name": "send_mail", "args": mail, "id": "c-2"}]
            )
        else:
            message = AIMessage(content="Refund mailed to the customer.")
        return ChatResult(generations=[ChatGeneration(message=message)])


@tool
def lookup_order(order_id: str) -> dict:
    """Look an order up."""
    return ORDERS.get(order_id, {"error": "no such order"})


@tool
def send_mail(to: str, subject: str, body: str) -> dict:
    """Send an email to a customer."""
    call = call_context()
    sent = SandboxClient(settings.TASKPILOTS["SANDBOX_URL"]).write(
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
    if hold := os.environ.get("LG_HOLD_AFTER_SEND"):
        time.sleep(float(hold))
    return sent.json


tools = [lookup_order, send_mail]
model = FakeShopModel().bind_tools(tools)


def agent(state: MessagesState):
    return {"messages": [model.invoke(state["messages"])]}


def review(state: MessagesState):
    """A person checks the mail before it leaves; what they approve (maybe edited) is sent."""
    last = state["messages"][-1]
    calls = []
    for call in last.tool_calls:
        if call["name"] == "send_mail":
            answer = interrupt({"question": "Send this mail?", **call["args"]})
            call = {**call, "args": {k: answer[k] for k in ("to", "subject", "body")}}
        calls.append(call)
    return {"messages": [AIMessage(content=last.content, tool_calls=calls, id=last.id)]}


def build(with_review: bool = False) -> StateGraph:
    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode(tools))
    builder.add_edge(START, "agent")
    if with_review:
        builder.add_node("review", review)
        builder.add_conditional_edges("agent", tools_condition, {"tools": "review", END: END})
        builder.add_edge("review", "tools")
    else:
        builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder


graph = build().compile()
# As LangGraph's docs teach for interrupt(): compiled with a checkpointer (TaskPilots compiles
# its own copy without one, its steps being the graph's durable state).
review_graph = build(with_review=True).compile(checkpointer=InMemorySaver())


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


def register(approval: bool = False):
    mail = ToolPolicy(
        lookup=mail_by_key,
        target=lambda p: f"mailbox:{p['to']}",
        needs_approval=(lambda args: "refund" in args["body"].lower()) if approval else None,
        approval_reason="Mails about refunds are checked first",
    )
    policies = {"lookup_order": ToolPolicy(side_effect=False, risk="low"), "send_mail": mail}
    register_langgraph("test.lg_graph", graph, tools=policies)
    register_langgraph("test.lg_graph_review", review_graph, tools=policies)


register()

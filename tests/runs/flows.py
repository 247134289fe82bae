"""Workflows and tools used by the engine tests; imported by the test process and by the real
Celery workers the tests start (TASKPILOTS_WORKFLOW_MODULES)."""

from __future__ import annotations

from datetime import timedelta

from runs import tools, workflows
from runs.models import FailureClass
from runs.tools import ToolError, python_tool
from runs.workflows import (
    DynamicStep,
    Workflow,
    approval,
    compute,
    read,
    side_effect,
    wait_event,
    wait_timer,
)
from taskpilots.demo import tools as demo_tools  # noqa: F401  (registers the sandbox tools)


def _register(workflow: Workflow) -> Workflow:
    return workflows.register(workflow, replace=True)


def _classify(ctx):
    return {"intent": "refund" if "refund" in ctx.input["message"].lower() else "question"}


REPLY = _register(
    Workflow(
        "test.reply",
        1,
        [
            compute("classify", _classify, stage="triage"),
            read("customer", "crm.lookup", params=lambda ctx: {"email": ctx.input["email"]},
                 stage="lookup"),
            side_effect(
                "send_reply",
                "mail.send",
                params=lambda ctx: {
                    "to": ctx.input["email"],
                    "subject": "Re: your message",
                    "body": f"We read it as a {ctx.results['classify']['intent']}.",
                },
                stage="reply",
            ),
            side_effect(
                "close_ticket",
                "tickets.update",
                params=lambda ctx: {"ticket_id": ctx.input["ticket"], "status": "solved"},
                stage="close",
            ),
        ],
    )
)  # fmt: skip

LEAD = _register(
    Workflow(
        "test.lead",
        1,
        [
            side_effect(
                "create_contact",
                "crm.create",
                params=lambda ctx: {"email": ctx.input["email"], "name": ctx.input["name"]},
                stage="sync",
            ),
            compute("done", lambda ctx: {"contact": ctx.results["create_contact"]["id"]}),
        ],
    )
)

REFUND = _register(
    Workflow(
        "test.refund",
        1,
        [
            compute("facts", lambda ctx: {"amount": ctx.input["amount"]}, stage="facts"),
            approval(
                "approve",
                tool="payments.refund",
                params=lambda ctx: {"payment_id": ctx.input["payment"],
                                    "amount": ctx.input["amount"]},
                when=lambda ctx: ctx.input["amount"] > 100,
                reason="Refund above 100 needs a person",
                stage="approval",
            ),
            side_effect("refund", "payments.refund",
                        params=lambda ctx: ctx.results["approve"]["params"], stage="refund"),
            wait_event("settlement", "payment.settled",
                       correlation=lambda ctx: ctx.results["refund"]["id"],
                       timeout=timedelta(hours=1), stage="settlement"),
        ],
    )
)  # fmt: skip

KB = _register(
    Workflow(
        "test.kb",
        1,
        [read("search", "kb.search", params=lambda ctx: {"q": ctx.input["q"]}, stage="search")],
    )
)

TIMER = _register(
    Workflow(
        "test.timer",
        1,
        [
            compute("before", lambda ctx: 1),
            wait_timer("pause", timedelta(minutes=5), stage="pause"),
            compute("after", lambda ctx: ctx.results["before"] + 1),
        ],
    )
)


def _route(ctx):
    return "big" if ctx.input["n"] > 10 else "small"


BRANCH = _register(
    Workflow(
        "test.branch",
        1,
        [
            compute("decide", lambda ctx: ctx.input["n"], next=_route),
            compute("small", lambda ctx: "small", next=lambda ctx: None),
            compute("big", lambda ctx: "big"),
        ],
    )
)


# An agent loop: the next tool call is decided at run time and recorded as a dynamic step.
def _agent_next(ctx, last_name):
    sent = sum(1 for h in ctx.history if h["name"] == "tool_call")
    if sent < ctx.input["mails"]:
        return DynamicStep(
            "tool_call",
            "side_effect",
            tool="mail.send",
            params={"to": f"lead{sent}@example.com", "subject": "Hello", "body": f"#{sent}"},
            stage="agent",
        )
    return None


AGENT = _register(Workflow("test.agent", 1, [compute("plan", lambda ctx: "plan")],
                           next=_agent_next))  # fmt: skip


# -- python tools and their counters (in-process tests only)
CALLS: dict[str, int] = {}


def _count(name):
    CALLS[name] = CALLS.get(name, 0) + 1


def _flaky(params, ctx):
    _count("flaky")
    if CALLS["flaky"] <= params.get("fail_times", 0):
        raise ToolError(FailureClass.TRANSIENT, "try again")
    return {"id": f"ok-{CALLS['flaky']}"}


tools.register(python_tool("test.flaky", _flaky, side_effect=True, dedupes_by_key=True,
                           target=lambda p: "thing:1"), replace=True)  # fmt: skip
tools.register(
    python_tool("test.noop_write", lambda p, c: (_count("noop"), {"id": c.idempotency_key})[1],
                side_effect=True, target=lambda p: "thing:1"),
    replace=True,
)  # fmt: skip

FLAKY = _register(
    Workflow("test.flaky", 1, [side_effect("write", "test.flaky", params=lambda ctx: {
        "fail_times": ctx.input.get("fail_times", 0)})])
)  # fmt: skip


# A model turn as a dynamic compute step: recorded once, never recomputed on resume.
MODEL_CALLS: list[str] = []


def _model_turn(ctx):
    MODEL_CALLS.append(ctx.spec["prompt"])
    return {"say": ctx.spec["prompt"].upper()}


workflows.register_handler("test.model_turn", _model_turn)


def _turns_next(ctx, last_name):
    turns = sum(1 for h in ctx.history if h["name"] == "turn")
    if turns < 2:
        return DynamicStep(
            "turn", "compute", extra={"handler": "test.model_turn", "prompt": f"hello {turns}"}
        )
    return None


TURNS = _register(Workflow("test.turns", 1, [compute("start", lambda ctx: 0)], next=_turns_next))


# -- degrading a write: a mail tool that is down (nothing listens on its port: connection
# refused, so the ledger knows nothing was sent), whose fallback is the sandbox's mail.send.
def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


DOWN_URL = f"http://127.0.0.1:{_closed_port()}/mail/send"
_MAIL_META = {"side_effect": True, "target": lambda p: f"mailbox:{p['to']}"}
tools.register(tools.http_tool("test.mail_down", "POST", DOWN_URL, fallback_tool="mail.send",
                               **_MAIL_META), replace=True)  # fmt: skip


def _half_sent(params, ctx):
    raise ConnectionResetError("the connection broke after the request was written")


# Its failure is an unknown outcome (python_tool: any exception from a write).
tools.register(python_tool("test.mail_unknown", _half_sent, fallback_tool="mail.send",
                           **_MAIL_META), replace=True)  # fmt: skip
# A write whose declared fallback is a read: a degrade rule for it is refused.
tools.register(python_tool("test.write_read_fallback", lambda p, c: {}, fallback_tool="kb.faq",
                           **_MAIL_META), replace=True)  # fmt: skip


def _mail_step(tool):
    return side_effect("send", tool, stage="notify", params=lambda ctx: {
        "to": ctx.input["to"], "subject": "Your order", "body": "It shipped."})  # fmt: skip


DEGRADE_WRITE = _register(Workflow("test.degrade_write", 1, [_mail_step("test.mail_down")]))
DEGRADE_UNKNOWN = _register(Workflow("test.degrade_unknown", 1, [_mail_step("test.mail_unknown")]))


# -- a worker that stops itself (SIGSTOP: a GC pause, a frozen VM) at the worst moment: after its
# claim was checked and the intent written, with the request about to be built and sent. Only
# the worker started with TASKPILOTS_TEST_PAUSE_FILE naming an existing file stops, once.
def _pausing_mail_url() -> str:
    import os
    import signal
    import threading

    mark = os.environ.get("TASKPILOTS_TEST_PAUSE_FILE")
    if mark:
        try:
            os.unlink(mark)  # whoever removes it stops; the file is there once
        except FileNotFoundError:
            pass
        else:
            # Directed at this thread, which stops at once; a stop sent to the process would be
            # taken by its main thread while this one ran on for a moment.
            signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
    return demo_tools.sandbox("/mail/send")()


tools.register(
    tools.http_tool(
        "test.mail_pausing",
        "POST",
        _pausing_mail_url,
        lookup_url=demo_tools.sandbox("/mail/by-key"),
        **_MAIL_META,
    ),
    replace=True,
)
PAUSING_MAIL = _register(Workflow("test.pausing_mail", 1, [_mail_step("test.mail_pausing")]))

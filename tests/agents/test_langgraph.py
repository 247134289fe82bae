"""A LangGraph graph, written as its docs teach and registered unchanged (tests/agents/
lg_graph.py), under TaskPilots: each node run and each tool call is a recorded step, the
side-effecting tool goes through the engine's protocol and its approval rule, an `interrupt()`
is an approval in the inbox whose decision is what the node gets back, and a resumed run never
runs a recorded node (nor asks its model) again."""

from __future__ import annotations

import operator
from datetime import timedelta
from typing import Annotated, TypedDict

import pytest
from django.utils import timezone
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from approvals import actions
from approvals.models import ApprovalRequest
from runs import engine
from runs.agents.langgraph import GraphSetupError, ToolPolicy, register_langgraph
from runs.engine import StartError
from runs.models import Run, SideEffect, Step
from tests.agents import lg_graph

pytestmark = pytest.mark.django_db

CASE = {"message": "Order o-1 arrived broken, please refund it."}
STEPS = ["start", "node:1:agent", "call:2.0:lookup_order", "node:3:agent", "call:4.0:send_mail",
         "node:5:agent", "finish"]  # fmt: skip
REVIEW_STEPS = ["start", "node:1:agent", "node:2:review", "call:3.0:lookup_order",
                "node:4:agent", "node:5:review", "interrupt:5.0:review", "node:5.1:review",
                "call:6.0:send_mail", "node:7:agent", "finish"]  # fmt: skip


@pytest.fixture(autouse=True)
def fresh():
    lg_graph.MODEL_CALLS.clear()
    lg_graph.CRASH_AFTER_SEND["armed"] = False
    lg_graph.register()
    yield
    lg_graph.register()


def start(name="test.lg_graph"):
    run, _ = engine.start_run(name, dict(CASE))
    return engine.run_until_quiet(run.pk)


def step_names(run):
    return list(Step.objects.filter(run=run).order_by("position").values_list("name", flat=True))


def test_each_node_run_and_tool_call_is_a_recorded_step(sandbox):
    run = start()
    assert run.status == "succeeded", run.attention_reason
    assert step_names(run) == STEPS
    assert run.result["final_output"] == "Refund mailed to the customer."
    assert len(lg_graph.MODEL_CALLS) == 3  # each model request asked once, the rest replayed
    steps = {s.name: s for s in Step.objects.filter(run=run)}
    assert steps["call:2.0:lookup_order"].kind == "read"
    assert steps["call:2.0:lookup_order"].tool == "test.lg_graph.lookup_order"
    assert steps["call:4.0:send_mail"].kind == "side_effect"
    assert steps["call:4.0:send_mail"].spec["params"]["to"] == "ann@example.com"
    assert all(steps[f"node:{k}:agent"].attempts == 1 for k in (1, 3, 5))
    mails = sandbox.ledger(system="mail", run=str(run.pk))
    assert len(mails) == 1
    effect = SideEffect.objects.get(run=run, tool="test.lg_graph.send_mail")
    assert effect.status == "committed"
    assert mails[0]["idempotency_key"] == effect.idempotency_key


def test_an_interrupt_is_an_approval_and_the_decision_is_what_the_node_gets_back(
    sandbox, support_user
):
    run = start("test.lg_graph_review")
    assert run.status == "needs_human", run.attention_reason
    assert step_names(run)[-1] == "interrupt:5.0:review"
    assert not sandbox.ledger(system="mail", run=str(run.pk))
    approval = ApprovalRequest.objects.get(run=run)
    assert approval.proposed_params["question"] == "Send this mail?"
    assert approval.proposed_params["to"] == "ann@example.com"
    assert "review" in approval.reason
    edited = {**approval.proposed_params, "subject": "Refund for order o-1"}
    actions.decide_approval(approval.pk, support_user, "approved_with_edits", edited_params=edited)
    run = engine.run_until_quiet(run.pk)
    assert run.status == "succeeded", run.attention_reason
    assert step_names(run) == REVIEW_STEPS
    mails = sandbox.ledger(system="mail", run=str(run.pk))
    assert len(mails) == 1
    sent = Step.objects.get(run=run, name="call:6.0:send_mail")
    assert sent.spec["params"]["subject"] == "Refund for order o-1"  # the person's edit
    assert len(lg_graph.MODEL_CALLS) == 3  # the review node's re-run asked no model


def test_a_rejected_interrupt_stops_the_graph_before_the_mail(sandbox, support_user):
    run = start("test.lg_graph_review")
    approval = ApprovalRequest.objects.get(run=run)
    actions.decide_approval(approval.pk, support_user, "rejected", comment="not this one")
    run = engine.run_until_quiet(run.pk)
    assert run.status in Run.TERMINAL and run.status != "succeeded"
    assert "node:5.1:review" not in step_names(run)
    assert not Step.objects.filter(run=run, name__startswith="call:6").exists()
    assert not sandbox.ledger(system="mail", run=str(run.pk))
    assert len(lg_graph.MODEL_CALLS) == 2


def test_a_side_effect_waits_for_a_person_by_rule(sandbox, support_user):
    lg_graph.register(approval=True)
    run = start()
    assert run.status == "needs_human", run.attention_reason
    assert step_names(run)[-1] == "approve:4.0:send_mail"
    assert not sandbox.ledger(system="mail", run=str(run.pk))
    approval = ApprovalRequest.objects.get(run=run)
    assert approval.proposed_params["subject"] == "Your order o-1"
    actions.decide_approval(approval.pk, support_user, "approved")
    run = engine.run_until_quiet(run.pk)
    assert run.status == "succeeded", run.attention_reason
    assert step_names(run) == [*STEPS[:4], "approve:4.0:send_mail", *STEPS[4:]]
    assert len(sandbox.ledger(system="mail", run=str(run.pk))) == 1
    assert len(lg_graph.MODEL_CALLS) == 3


def test_a_crash_after_the_mail_left_resumes_without_a_second_mail_or_model_call(sandbox):
    lg_graph.CRASH_AFTER_SEND["armed"] = True
    run, _ = engine.start_run("test.lg_graph", dict(CASE))
    with pytest.raises(lg_graph.Crash):
        engine.run_until_quiet(run.pk)
    assert len(sandbox.ledger(system="mail", run=str(run.pk))) == 1
    assert SideEffect.objects.get(run=run, tool="test.lg_graph.send_mail").status == "intended"
    Step.objects.filter(run=run, status="running").update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    engine.sweep()
    run = engine.run_until_quiet(run.pk)
    assert run.status == "succeeded", run.attention_reason
    assert len(sandbox.ledger(system="mail", run=str(run.pk))) == 1
    effect = SideEffect.objects.get(run=run, tool="test.lg_graph.send_mail")
    assert effect.status == "committed" and effect.confirmed_by == "reconcile"
    assert len(lg_graph.MODEL_CALLS) == 3


@pytest.mark.parametrize(
    "bad",
    [{}, {"message": ""}, {"message": "   "}, {"message": 42}, {"message": "x" * 20_001}],
)
def test_bad_input_is_refused_with_nothing_written(bad):
    with pytest.raises(StartError, match="message"):
        engine.start_run("test.lg_graph", bad)
    assert Run.objects.count() == 0 and Step.objects.count() == 0


def test_registration_says_what_is_wrong():
    with pytest.raises(GraphSetupError, match="no tools named"):
        register_langgraph("test.lg_x", lg_graph.graph, tools={"nope": "mail.send"})
    with pytest.raises(GraphSetupError, match="not registered"):
        register_langgraph("test.lg_x", lg_graph.graph, tools={"send_mail": "no.such.tool"})
    with pytest.raises(GraphSetupError, match="not a LangGraph StateGraph"):
        register_langgraph("test.lg_x", object())
    with pytest.raises(GraphSetupError, match="interrupt\\(\\) in the node"):
        compiled = lg_graph.build().compile(interrupt_before=["tools"])
        register_langgraph("test.lg_x", compiled)
    assert Run.objects.count() == 0


def test_the_graph_itself_is_unchanged():
    """Registering compiles a journaled copy from the graph's builder: the graph registered
    is not modified and still runs as LangGraph runs it."""
    runner = register_langgraph(
        "test.lg_copy", lg_graph.graph, tools={"send_mail": ToolPolicy(needs_approval=True)}
    )
    assert runner.graph is not lg_graph.graph
    assert lg_graph.graph.builder.nodes["tools"].runnable._wrap_tool_call is None
    agent = lg_graph.graph.nodes["agent"].bound
    state = agent.invoke({"messages": [("user", "hi")]})
    assert state["messages"][0].tool_calls[0]["name"] == "lookup_order"


def test_without_the_extra_the_engine_runs_and_the_import_says_what_to_install():
    from tests.taskpilots.test_plain_install import extras_only_modules, run_without_extras

    blocked = extras_only_modules()
    assert {"langgraph", "langchain_core"} <= set(blocked)
    code = """
import os
os.environ["DJANGO_SETTINGS_MODULE"] = "taskpilots.settings"
import django
django.setup()
import runs.agents, runs.engine, runs.agents.policy
try:
    from runs.agents.langgraph import register_langgraph
except ImportError as exc:
    print("langgraph:", exc)
print("imported:", sys.modules.get("langgraph") is not None)
"""
    result = run_without_extras(code, blocked)
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(": ", 1) for line in result.stdout.splitlines() if ": " in line)
    assert "pip install 'taskpilots[langgraph]'" in lines["langgraph"]
    assert lines["imported"] == "False"


class Fan(TypedDict):
    log: Annotated[list, operator.add]
    name: str
    send: bool


RAN: list[str] = []


def _node(label):
    def run(state: Fan):
        RAN.append(label)
        return {"log": [label]}

    return run


def ask(state: Fan):
    RAN.append("ask")
    name = interrupt("What is the customer's name?")
    answer = interrupt({"question": f"Mail {name}?", "send": True})
    return {"name": name, "send": answer["send"], "log": ["ask"]}


def fan_out(state: Fan) -> Command:
    RAN.append("a")
    return Command(update={"log": ["a"]}, goto=["b", "c"])


def fan_graph():
    builder = StateGraph(Fan)
    builder.add_node("a", fan_out)
    for label in ("b", "c"):
        builder.add_node(label, _node(label))
    builder.add_node("ask", ask)
    builder.add_edge(START, "a")
    builder.add_edge(["b", "c"], "ask")
    builder.add_edge("ask", END)
    return builder.compile()


def test_a_command_fans_out_to_parallel_nodes_and_one_node_interrupts_twice(support_user):
    RAN.clear()
    register_langgraph(
        "test.lg_fan",
        fan_graph(),
        graph_input=lambda data: {"log": [], "name": "", "send": False},
        validate_input=lambda data: data,
        output=lambda state: {
            "log": sorted(state["log"]),
            "name": state["name"],
            "send": state["send"],
        },  # fmt: skip
    )
    run, _ = engine.start_run("test.lg_fan", {})
    run = engine.run_until_quiet(run.pk)
    assert run.status == "needs_human", run.attention_reason
    first = ApprovalRequest.objects.get(run=run, step__name="interrupt:3.0:ask")
    assert first.proposed_params == {"value": "What is the customer's name?"}
    actions.decide_approval(
        first.pk, support_user, "approved_with_edits", edited_params={"value": "Ann"}
    )
    run = engine.run_until_quiet(run.pk)
    assert run.status == "needs_human", run.attention_reason
    second = ApprovalRequest.objects.get(run=run, step__name="interrupt:3.1:ask")
    assert second.proposed_params == {"question": "Mail Ann?", "send": True}
    actions.decide_approval(second.pk, support_user, "approved")
    run = engine.run_until_quiet(run.pk)
    assert run.status == "succeeded", run.attention_reason
    assert run.result["final_output"] == {"log": ["a", "ask", "b", "c"], "name": "Ann",
                                          "send": True}  # fmt: skip
    assert step_names(run) == ["start", "node:1:a", "node:2:b", "node:2:c", "node:3:ask",
                               "interrupt:3.0:ask", "node:3.1:ask", "interrupt:3.1:ask",
                               "node:3.2:ask", "finish"]  # fmt: skip
    # Each recorded node ran once; the interrupting node ran again after each decision, as
    # under LangGraph.
    assert sorted(RAN) == ["a", "ask", "ask", "ask", "b", "c"]


class Opaque:
    """Neither JSON nor a LangChain message."""


def test_a_node_output_that_cannot_be_recorded_stops_its_step_saying_why():
    builder = StateGraph(Fan)
    builder.add_node("odd", lambda state: {"log": [Opaque()]})
    builder.add_edge(START, "odd")
    register_langgraph(
        "test.lg_odd",
        builder,
        graph_input=lambda data: {"log": [], "name": "", "send": False},
        validate_input=lambda data: data,
    )
    run, _ = engine.start_run("test.lg_odd", {})
    run = engine.run_until_quiet(run.pk)
    assert run.status == "needs_human"  # an invalid_input failure goes to a person
    assert "not JSON or LangChain messages" in run.attention_reason
    assert Step.objects.get(run=run, name="node:1:odd").status == "needs_human"

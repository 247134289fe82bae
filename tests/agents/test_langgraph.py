"""A LangGraph graph, written as its docs teach and registered unchanged (tests/agents/
lg_graph.py), under TaskPilots: each node run and each tool call is a recorded step, the
side-effecting tool goes through the engine's protocol and its approval rule, an `interrupt()`
is an approval in the inbox whose decision is what the node gets back, and a resumed run never
runs a recorded node (nor asks its model) again."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

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

"""A Pydantic AI agent, written as its docs teach and registered unchanged (tests/agents/
pai_agent.py), under TaskPilots: each model request and each tool call is a recorded step, the
side-effecting tool goes through the engine's protocol and its approval rule, a resumed run
replays recorded model responses without asking the model again."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from approvals import actions
from approvals.models import ApprovalRequest
from runs import engine
from runs.agents.pydantic_ai import AgentSetupError, register_pydantic_agent
from runs.models import Run, SideEffect, Step
from tests.agents import pai_agent

pytestmark = pytest.mark.django_db

CASE = {"message": "Order o-1 arrived broken, please refund it.", "customer": "ann@example.com"}
STEPS = ["start", "model:1", "call:1.0:lookup_order", "model:2", "call:2.0:send_mail",
         "model:3", "finish"]  # fmt: skip


@pytest.fixture(autouse=True)
def fresh():
    pai_agent.MODEL_CALLS.clear()
    pai_agent.CRASH_AFTER_SEND["armed"] = False
    pai_agent.register()
    yield
    pai_agent.register()


def start(name="test.pai_agent"):
    run, _ = engine.start_run(name, dict(CASE))
    return engine.run_until_quiet(run.pk)


def step_names(run):
    return list(Step.objects.filter(run=run).order_by("position").values_list("name", flat=True))


def test_each_model_request_and_tool_call_is_a_recorded_step(sandbox):
    run = start()
    assert run.status == "succeeded", run.attention_reason
    assert step_names(run) == STEPS
    assert run.result["final_output"] == {"summary": "Refund mailed to the customer.",
                                          "mailed": True}  # fmt: skip
    assert run.result["model_requests"] == 3
    assert len(pai_agent.MODEL_CALLS) == 3  # each request asked once, the rest replayed
    steps = {s.name: s for s in Step.objects.filter(run=run)}
    assert steps["call:1.0:lookup_order"].kind == "read"
    assert steps["call:1.0:lookup_order"].tool == "test.pai_agent.lookup_order"
    assert steps["call:2.0:send_mail"].kind == "side_effect"
    assert steps["call:2.0:send_mail"].spec["params"]["to"] == "ann@example.com"
    assert all(steps[f"model:{k}"].attempts == 1 for k in (1, 2, 3))
    mails = sandbox.ledger(system="mail", run=str(run.pk))
    assert len(mails) == 1
    effect = SideEffect.objects.get(run=run, tool="test.pai_agent.send_mail")
    assert effect.status == "committed"
    assert mails[0]["idempotency_key"] == effect.idempotency_key


def test_a_side_effect_waits_for_a_person_by_rule(sandbox, support_user):
    pai_agent.register(approval=True)
    run = start()
    assert run.status == "needs_human", run.attention_reason
    assert step_names(run)[-1] == "approve:2.0:send_mail"
    assert not sandbox.ledger(system="mail", run=str(run.pk))
    approval = ApprovalRequest.objects.get(run=run)
    assert approval.proposed_params["subject"] == "Your order o-1"
    actions.decide_approval(approval.pk, support_user, "approved")
    run = engine.run_until_quiet(run.pk)
    assert run.status == "succeeded", run.attention_reason
    assert step_names(run) == [*STEPS[:4], "approve:2.0:send_mail", *STEPS[4:]]
    assert len(sandbox.ledger(system="mail", run=str(run.pk))) == 1
    assert len(pai_agent.MODEL_CALLS) == 3


def test_a_crash_after_the_mail_left_resumes_without_a_second_mail_or_model_call(sandbox):
    pai_agent.CRASH_AFTER_SEND["armed"] = True
    run, _ = engine.start_run("test.pai_agent", dict(CASE))
    with pytest.raises(pai_agent.Crash):
        engine.run_until_quiet(run.pk)
    assert len(sandbox.ledger(system="mail", run=str(run.pk))) == 1
    assert SideEffect.objects.get(run=run, tool="test.pai_agent.send_mail").status == "intended"
    Step.objects.filter(run=run, status="running").update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    engine.sweep()
    run = engine.run_until_quiet(run.pk)
    assert run.status == "succeeded", run.attention_reason
    assert len(sandbox.ledger(system="mail", run=str(run.pk))) == 1
    effect = SideEffect.objects.get(run=run, tool="test.pai_agent.send_mail")
    assert effect.status == "committed" and effect.confirmed_by == "reconcile"
    assert len(pai_agent.MODEL_CALLS) == 3


def test_registration_says_what_is_missing():
    with pytest.raises(AgentSetupError, match="deps="):
        register_pydantic_agent("test.pai_nodeps", pai_agent.agent)
    with pytest.raises(AgentSetupError, match="no tools named"):
        register_pydantic_agent("test.pai_x", pai_agent.agent, deps=pai_agent.shop,
                                tools={"nope": "mail.send"})  # fmt: skip
    assert Run.objects.count() == 0


def test_without_the_extra_the_engine_runs_and_the_import_says_what_to_install():
    from tests.taskpilots.test_plain_install import extras_only_modules, run_without_extras

    blocked = extras_only_modules()
    assert "pydantic_ai" in blocked
    code = """
import os
os.environ["DJANGO_SETTINGS_MODULE"] = "taskpilots.settings"
import django
django.setup()
import runs.agents, runs.engine, runs.agents.policy
try:
    from runs.agents.pydantic_ai import register_pydantic_agent
except ImportError as exc:
    print("pydantic_ai:", exc)
print("imported:", sys.modules.get("pydantic_ai") is not None)
"""
    result = run_without_extras(code, blocked)
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(": ", 1) for line in result.stdout.splitlines() if ": " in line)
    assert "pip install 'taskpilots[pydantic-ai]'" in lines["pydantic_ai"]
    assert lines["imported"] == "False"

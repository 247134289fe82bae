"""An OpenAI Agents SDK agent under TaskPilots, driven in-process with a scripted model (no
network): model turns are recorded steps, tool calls are steps with the tool's metadata, and
approvals go through the console's decide_approval."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from agents import Agent, RunContextWrapper, function_tool
from agents.testing import ScriptedModel, assistant_message, function_call
from django.utils import timezone

from approvals import actions
from approvals.models import ApprovalRequest
from runs import engine
from runs.agents.sdk import AgentSetupError, ToolPolicy, register_agent
from runs.models import Run, SideEffect, Snapshot, Step
from runs.tools import LookupResult, Verification

pytestmark = pytest.mark.django_db

# The "external system" behind the plain Python tools: credits issued, by idempotency key.
CREDITS: dict[str, dict] = {}
ORDERS = {"o-1": {"order_id": "o-1", "customer": "ann@example.com", "total": 80.0}}


class Crash(BaseException):
    """The worker dies right after the external system committed (not an Exception: nothing
    in the call path may catch it)."""


CRASH_AFTER_COMMIT = {"armed": False}
# The credit system commits, then the connection drops: the caller cannot tell.
FAIL_AFTER_COMMIT = {"armed": False}


@function_tool
def lookup_order(order_id: str) -> dict:
    """Look an order up."""
    return ORDERS.get(order_id, {"error": "no such order"})


@function_tool
def issue_credit(ctx: RunContextWrapper, customer: str, amount: float) -> dict:
    """Give a customer store credit."""
    key = ctx.context.idempotency_key
    CREDITS[key] = {"id": f"cr-{len(CREDITS) + 1}", "customer": customer, "amount": amount}
    if CRASH_AFTER_COMMIT["armed"]:
        CRASH_AFTER_COMMIT["armed"] = False
        raise Crash
    if FAIL_AFTER_COMMIT["armed"]:
        FAIL_AFTER_COMMIT["armed"] = False
        raise ConnectionResetError("connection reset after the request was sent")
    return CREDITS[key]


def credit_by_key(key, ctx):
    found = CREDITS.get(key)
    return LookupResult(found=found is not None, external_id=(found or {}).get("id", ""),
                        response=found)  # fmt: skip


POLICIES = {
    "lookup_order": ToolPolicy(side_effect=False, risk="low"),
    "issue_credit": ToolPolicy(
        lookup=credit_by_key, target=lambda p: f"customer:{p['customer']}", risk="high"
    ),
}


@pytest.fixture(autouse=True)
def clean():
    CREDITS.clear()
    CRASH_AFTER_COMMIT["armed"] = False
    FAIL_AFTER_COMMIT["armed"] = False


def make_agent(steps, *, approval=False, name="test.sdk_agent"):
    model = ScriptedModel(steps)
    agent = Agent(name="credit-bot", instructions="Help the customer.", model=model,
                  tools=[lookup_order, issue_credit])  # fmt: skip
    policies = dict(POLICIES)
    if approval:
        policies["issue_credit"] = ToolPolicy(
            lookup=credit_by_key, target=lambda p: f"customer:{p['customer']}", risk="high",
            needs_approval=lambda args: args["amount"] > 20, approval_reason="Credit above 20",
        )  # fmt: skip
    register_agent(name, agent, tools=policies)
    return model


def script(amount=50.0):
    return [
        [function_call("lookup_order", {"order_id": "o-1"}, call_id="c-lookup")],
        [function_call("issue_credit", {"customer": "ann@example.com", "amount": amount},
                       call_id="c-credit")],
        [assistant_message("Credit issued.")],
    ]  # fmt: skip


def start(input=None, name="test.sdk_agent"):
    run, _ = engine.start_run(name, input or {"message": "Order o-1 arrived broken"})
    return engine.run_until_quiet(run.pk)


def step_names(run):
    return list(Step.objects.filter(run=run).order_by("position").values_list("name", flat=True))


def test_every_model_turn_and_tool_call_is_a_recorded_step():
    model = make_agent(script())
    run = start()
    assert run.status == "succeeded", run.attention_reason
    assert step_names(run) == ["start", "turn:1", "call:1.0:lookup_order", "turn:2",
                               "call:2.0:issue_credit", "turn:3", "finish"]  # fmt: skip
    assert run.result["final_output"] == "Credit issued."
    steps = {s.name: s for s in Step.objects.filter(run=run)}
    assert steps["call:1.0:lookup_order"].kind == "read"
    assert steps["call:2.0:issue_credit"].kind == "side_effect"
    # The second turn saw the first tool's output, rebuilt from the recorded step.
    outputs = [i for i in model.calls[1].input if i.get("type") == "function_call_output"]
    assert json.loads(outputs[0]["output"])["total"] == 80.0
    snapshot = Snapshot.objects.get(run=run)
    assert snapshot.tool == "test.sdk_agent.issue_credit"
    assert snapshot.params == {"customer": "ann@example.com", "amount": 50.0}
    assert snapshot.target_resource == "customer:ann@example.com"
    effect = SideEffect.objects.get(run=run)
    assert effect.status == "committed" and effect.external_id == "cr-1"
    assert list(CREDITS) == [effect.idempotency_key]


def test_a_resumed_run_does_not_call_the_model_again_for_recorded_turns():
    model = make_agent(script())
    run = start()
    assert len(model.calls) == 3
    # Replay the tool calls and resume: a second model call would raise UnexpectedModelCall.
    Step.objects.filter(run=run).exclude(name__startswith="turn:").update(status="pending")
    Run.objects.filter(pk=run.pk).update(status="running", finished_at=None)
    run = engine.run_until_quiet(run.pk)
    assert run.status == "succeeded"
    assert len(model.calls) == 3
    assert len(CREDITS) == 1


def test_a_side_effecting_tool_is_called_once_across_a_crash():
    # The worker dies after the credit was issued but before the receipt was recorded: the
    # next attempt finds the `intended` ledger row, asks the system by key and does not call.
    model = make_agent(script())
    CRASH_AFTER_COMMIT["armed"] = True
    run, _ = engine.start_run("test.sdk_agent", {"message": "Order o-1 arrived broken"})
    with pytest.raises(Crash):
        engine.run_until_quiet(run.pk)
    effect = SideEffect.objects.get(run=run)
    assert effect.status == "intended" and len(CREDITS) == 1
    Step.objects.filter(run=run, status="running").update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    run = engine.run_until_quiet(run.pk)
    assert run.status == "succeeded", run.attention_reason
    assert len(CREDITS) == 1
    effect.refresh_from_db()
    assert effect.status == "committed" and effect.confirmed_by == "reconcile"
    assert len(model.calls) == 3
    assert all(s.attempts == 1 for s in Step.objects.filter(run=run, name__startswith="turn:"))


def test_an_approval_decided_in_the_console_flows_back_into_the_agent(support_user):
    model = make_agent(script(amount=50.0), approval=True)
    run = start()
    assert run.status == "needs_human"
    approval = ApprovalRequest.objects.get(run=run)
    assert approval.proposed_params == {"customer": "ann@example.com", "amount": 50.0}
    assert approval.reason == "Credit above 20" and approval.risk == "high"
    assert CREDITS == {}
    actions.decide_approval(approval.pk, support_user, "approved_with_edits",
                            edited_params={"customer": "ann@example.com", "amount": 15.0},
                            comment="policy caps goodwill credit")  # fmt: skip
    run = engine.run_until_quiet(run.pk)
    assert run.status == "succeeded", run.attention_reason
    assert [c["amount"] for c in CREDITS.values()] == [15.0]
    assert Snapshot.objects.get(run=run).params["amount"] == 15.0
    # The model's next turn is told what was decided and what was actually done.
    output = next(i for i in model.calls[2].input if i.get("call_id") == "c-credit"
                  and i.get("type") == "function_call_output")  # fmt: skip
    told = json.loads(output["output"])
    assert told["approval"] == {"decision": "approved_with_edits", "by": "sam-support",
                                "arguments": {"customer": "ann@example.com", "amount": 15.0},
                                "comment": "policy caps goodwill credit"}  # fmt: skip
    assert told["result"]["amount"] == 15.0


def test_an_edit_the_tools_schema_does_not_allow_never_reaches_the_tool_or_the_model(
    support_user,
):
    # The edited arguments go to the tool and, as the decision, to the model's next turn.
    model = make_agent(script(amount=50.0), approval=True)
    run = start()
    approval = ApprovalRequest.objects.get(run=run)
    turns = len(model.calls)
    for edited, field in [
        ({"customer": "ann@example.com", "amount": 15.0, "bogus": 1}, "bogus"),
        ({"customer": "ann@example.com", "amount": "15"}, "amount"),
        ({"bogus": 1}, "bogus"),
    ]:
        with pytest.raises(actions.InvalidParams) as refused:
            actions.decide_approval(approval.pk, support_user, "approved_with_edits",
                                    edited_params=edited)  # fmt: skip
        assert refused.value.field == field
    approval.refresh_from_db()
    assert approval.status == "pending" and CREDITS == {}
    assert engine.run_until_quiet(run.pk).status == "needs_human"
    assert len(model.calls) == turns


def test_an_unknown_outcome_settled_over_the_api_is_what_the_model_is_told(support_user):
    # docs/api.md documents this output: the settled call's result, as the model reads it.
    from django.test import Client

    from runs.api.models import ApiScope, PersonalToken

    model = ScriptedModel(script(amount=10.0))
    agent = Agent(name="credit-bot", instructions="Help the customer.", model=model,
                  tools=[lookup_order, issue_credit])  # fmt: skip
    # No lookup by key and no dedupe: only a person can say whether the credit was issued.
    blind = ToolPolicy(target=lambda params: f"customer:{params['customer']}")
    register_agent("test.sdk_agent", agent, tools={**POLICIES, "issue_credit": blind})
    FAIL_AFTER_COMMIT["armed"] = True
    run = start()
    assert run.status == "needs_human"
    effect = SideEffect.objects.get(run=run, status="unknown")
    _, issued = PersonalToken.issue(support_user, "helpdesk", [ApiScope.APPROVALS_WRITE])
    response = Client().post(
        f"/api/v1/runs/{run.pk}/outcome",
        {"happened": True, "proof": "cr-1", "idempotency_key": effect.idempotency_key},
        content_type="application/json",
        headers={"Authorization": f"Bearer {issued.token}"},
    )
    assert response.status_code == 200, response.content
    run = engine.run_until_quiet(run.pk)
    assert run.status == "succeeded", run.attention_reason
    output = next(i for i in model.calls[2].input if i.get("call_id") == "c-credit"
                  and i.get("type") == "function_call_output")  # fmt: skip
    assert json.loads(output["output"]) == {
        "id": "cr-1", "external_id": "cr-1", "confirmed_by": "user:sam-support"}  # fmt: skip
    assert len(CREDITS) == 1  # never sent twice


def test_a_call_below_the_approval_threshold_needs_nobody():
    make_agent(script(amount=10.0), approval=True)
    run = start()
    assert run.status == "succeeded"
    assert not ApprovalRequest.objects.filter(run=run).exists()


def test_a_rejected_call_is_not_made(support_user):
    make_agent(script(amount=50.0)[:2], approval=True)
    run = start()
    approval = ApprovalRequest.objects.get(run=run)
    actions.decide_approval(approval.pk, support_user, "rejected", comment="no")
    run = engine.run_until_quiet(run.pk)
    assert run.status == "cancelled"
    assert CREDITS == {}


def test_an_unknown_tool_is_told_to_the_model_not_called():
    model = make_agent([
        [function_call("delete_everything", {}, call_id="c-x")],
        [assistant_message("Sorry.")],
    ])  # fmt: skip
    run = start()
    assert run.status == "succeeded"
    told = [i for i in model.calls[1].input if i.get("type") == "function_call_output"]
    assert "no tool named 'delete_everything'" in told[0]["output"]


def test_a_model_failure_is_routed_like_a_tool_failure():
    make_agent([RuntimeError("model exploded")])
    run = start()
    assert run.status in ("needs_human", "failed")
    turn = Step.objects.get(run=run, name="turn:1")
    assert "model exploded" in turn.last_error


def test_an_agent_the_engine_cannot_protect_is_refused_at_registration():
    from agents import WebSearchTool

    agent = Agent(name="web", tools=[WebSearchTool()], model=ScriptedModel([]))
    with pytest.raises(AgentSetupError, match="not a function tool"):
        register_agent("test.sdk_bad", agent)
    agent = Agent(name="x", tools=[lookup_order], model=ScriptedModel([]))
    with pytest.raises(AgentSetupError, match="no tools named"):
        register_agent("test.sdk_bad", agent, tools={"missing": ToolPolicy()})


def test_bad_input_is_refused_before_anything_is_written():
    make_agent([])
    with pytest.raises(engine.StartError, match="message"):
        engine.start_run("test.sdk_agent", {"message": ""})
    assert not Run.objects.exists()


def test_a_function_tool_verified_by_a_read_settles_a_lost_answer_without_a_person():
    # No lookup by key, but the credit system can be read: ToolPolicy(verification=...) lets
    # the engine see the credit there, record the read as the commit proof, and go on.
    model = ScriptedModel(script(amount=10.0))
    agent = Agent(name="credit-bot", instructions="Help the customer.", model=model,
                  tools=[lookup_order, issue_credit])  # fmt: skip

    def credits_of(params, ctx):
        return [c for c in CREDITS.values() if c["customer"] == params["customer"]]

    verified = ToolPolicy(
        target=lambda params: f"customer:{params['customer']}",
        verification=Verification(
            read=credits_of,
            baseline=credits_of,
            recognise=lambda p, seen, before: len(seen) == len(before) + 1,
            external_id=lambda p, seen, before: seen[-1]["id"],
            description="list the customer's credits",
        ),
    )
    register_agent("test.sdk_agent", agent, tools={**POLICIES, "issue_credit": verified})
    FAIL_AFTER_COMMIT["armed"] = True
    run = start()
    assert run.status == "succeeded", run.attention_reason
    assert len(CREDITS) == 1
    effect = SideEffect.objects.get(run=run, tool="test.sdk_agent.issue_credit")
    assert (effect.confirmed_by, effect.external_id) == ("verification", "cr-1")
    output = next(i for i in model.calls[2].input if i.get("call_id") == "c-credit"
                  and i.get("type") == "function_call_output")  # fmt: skip
    assert json.loads(output["output"])["verified_by"] == "list the customer's credits"

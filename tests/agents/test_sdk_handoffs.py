"""OpenAI Agents SDK agents written as the SDK's docs write them — handoffs, a structured
output_type, a RunContextWrapper context and `Agent(mcp_servers=[MCPServerStdio(...)])` —
registered unchanged and run by the engine: every turn, handoff and MCP call is a recorded step,
the MCP write goes through snapshot → keyed call → receipt, and a resumed run goes on with the
agent that was current, without asking any recorded turn again."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

import pytest
from agents import (
    Agent,
    GuardrailFunctionOutput,
    RunContextWrapper,
    function_tool,
    handoff,
    input_guardrail,
)
from agents.agent_output import AgentOutputSchema
from agents.extensions import handoff_filters
from agents.mcp import MCPServerStdio
from agents.testing import ScriptedModel, assistant_message, function_call
from pydantic import BaseModel

from approvals import actions
from runs import engine
from runs.agents import mcp
from runs.agents.mcp import McpToolConfig
from runs.agents.sdk import AgentSetupError, ToolPolicy, call_context_of, register_agent
from runs.models import Run, SideEffect, Snapshot, Step

pytestmark = pytest.mark.django_db

SERVER = Path(__file__).with_name("drafts_mcp_server.py")
WORKFLOW = "test.sdk_handoffs"
CASE = {"message": "Order o-1 arrived broken, please reply to the customer.", "customer": "Ann"}
ORDERS = {"o-1": {"order_id": "o-1", "item": "teapot", "status": "delivered broken"}}
SEEN: dict[str, list] = {"contexts": []}


class Draft(BaseModel):
    title: str
    body: str
    draft_id: str


@dataclass
class Desk:
    """The run's context object (SDK: `Runner.run(..., context=Desk(...))`)."""

    customer: str
    tone: str = "warm"


@function_tool
def lookup_order(ctx: RunContextWrapper[Desk], order_id: str) -> dict:
    """Look an order up."""
    SEEN["contexts"].append((ctx.context, call_context_of(ctx).step))
    return ORDERS.get(order_id, {"error": "no such order"})


def writer_instructions(ctx: RunContextWrapper[Desk], agent: Agent) -> str:
    return f"You write replies to {ctx.context.customer} in a {ctx.context.tone} tone."


@pytest.fixture(autouse=True)
def var_dir(tmp_path, settings):
    settings.VAR_DIR = tmp_path / "var"  # MCP listing caches
    SEEN["contexts"].clear()
    yield
    mcp.close_connections()


@pytest.fixture
def ledger(tmp_path):
    return tmp_path / "drafts.ledger"


def published(ledger: Path) -> list[dict]:
    return [json.loads(line) for line in ledger.read_text().splitlines()] if ledger.exists() else []


def server_starts(ledger: Path) -> int:
    starts = ledger.with_name(f"{ledger.name}.starts")
    return len(starts.read_text().split()) if starts.exists() else 0


def triage_script():
    return [
        [function_call("lookup_order", {"order_id": "o-1"}, call_id="c-order")],
        [function_call("transfer_to_writer", {}, call_id="c-handoff")],
    ]


DRAFT = {
    "title": "Your teapot",
    "body": "Sorry! A new teapot is on its way.",
    "draft_id": "draft-1",
}


def writer_script(final=None):
    return [
        [function_call("style_guide", {"topic": "apology"}, call_id="c-style")],
        [function_call("publish_draft", {"title": DRAFT["title"], "body": DRAFT["body"]},
                       call_id="c-publish")],
        [assistant_message(json.dumps(final or DRAFT))],
    ]  # fmt: skip


def build(ledger, triage_steps, writer_steps, server_options=None, **registration):
    """The agents as the SDK docs write them; registered unchanged."""
    drafts = MCPServerStdio(
        name="Drafts server",
        params={"command": sys.executable, "args": [str(SERVER), str(ledger)]},
        tool_filter={"blocked_tool_names": ["delete_drafts"]},
        **(server_options or {}),
    )
    writer = Agent(
        name="Writer",
        handoff_description="Writes and publishes the reply draft.",
        instructions=writer_instructions,
        model=ScriptedModel(writer_steps),
        mcp_servers=[drafts],
        output_type=Draft,
    )
    triage = Agent(
        name="Triage",
        instructions="Find the order, then hand off to the writer.",
        model=ScriptedModel(triage_steps),
        tools=[lookup_order],
        handoffs=[writer],
    )
    writer.handoffs.append(handoff(triage))  # a cycle: triage → writer → triage
    register_agent(
        WORKFLOW,
        triage,
        tools={"lookup_order": ToolPolicy(side_effect=False, risk="low")},
        mcp_tools={
            "Drafts server": {
                "publish_draft": McpToolConfig(target=lambda p: f"draft:{p['title']}")
            }
        },
        context=lambda run_input: Desk(customer=run_input["customer"]),
        **registration,
    )
    return triage, writer


def names(run) -> list[str]:
    return list(Step.objects.filter(run=run).order_by("position").values_list("name", flat=True))


def drive_until(run_id, step_name: str) -> None:
    """Execute steps one by one, as a worker would, until `step_name` is recorded."""
    for _ in range(50):
        if Step.objects.filter(run_id=run_id, name=step_name, status="succeeded").exists():
            return
        claim = engine.claim_next(run_id, worker="test-worker")
        assert claim is not None, names(Run.objects.get(pk=run_id))
        engine.invoke_step(claim)
    pytest.fail(f"{step_name} was never recorded")


def test_a_triage_agent_hands_off_to_a_writer_with_mcp_tools_and_a_structured_output(ledger):
    triage, writer = build(ledger, triage_script(), writer_script())
    assert server_starts(ledger) == 0  # registering starts no MCP server
    run, _ = engine.start_run(WORKFLOW, CASE)
    run = engine.run_until_quiet(run.pk)
    assert run.status == "succeeded", run.attention_reason
    # Listed at the writer's first turn, in this process; the calls used the same session.
    assert server_starts(ledger) == 1
    assert names(run) == [
        "start", "turn:1", "call:1.0:lookup_order", "turn:2", "handoff:2.0:Writer",
        "turn:3", "call:3.0:style_guide", "turn:4", "call:4.0:publish_draft", "turn:5", "finish",
    ]  # fmt: skip
    # Each model turn was asked once, by the agent whose turn it was.
    assert (len(triage.model.calls), len(writer.model.calls)) == (2, 3)
    steps = {s.name: s for s in Step.objects.filter(run=run)}
    agents = [steps[f"turn:{k}"].result["agent"] for k in range(1, 6)]
    assert agents == ["Triage", "Triage", "Writer", "Writer", "Writer"]
    assert steps["handoff:2.0:Writer"].result == {
        "from": "Triage", "to": "Writer", "tool": "transfer_to_writer", "call_id": "c-handoff",
        "output": json.dumps({"assistant": "Writer"}),
    }  # fmt: skip
    # The model saw the handoff tool; the writer its own instructions, tools and output schema.
    asked = triage.model.calls[1]
    assert [h.tool_name for h in asked.handoffs] == ["transfer_to_writer"]
    assert [t.name for t in asked.tools] == ["lookup_order"]
    first = writer.model.calls[0]
    assert first.system_instructions == "You write replies to Ann in a warm tone."
    assert sorted(t.name for t in first.tools) == ["publish_draft", "style_guide"]
    assert [h.tool_name for h in first.handoffs] == ["transfer_to_triage"]
    assert isinstance(first.output_schema, AgentOutputSchema)
    assert first.output_schema.json_schema()["properties"].keys() == DRAFT.keys()
    told = [i for i in first.input if i.get("type") == "function_call_output"]
    assert [i["call_id"] for i in told] == ["c-order", "c-handoff"]
    # The MCP read is a read; the write one snapshotted, keyed call, counted where it landed.
    assert steps["call:3.0:style_guide"].kind == "read"
    assert steps["call:4.0:publish_draft"].kind == "side_effect"
    effect = SideEffect.objects.get(run=run)
    assert effect.status == "committed" and effect.tool == "mcp.Drafts_server.publish_draft"
    assert published(ledger) == [{"key": effect.idempotency_key, "title": DRAFT["title"]}]
    snapshot = Snapshot.objects.get(run=run)
    assert snapshot.target_resource == f"draft:{DRAFT['title']}"
    # The final output is the pydantic model's JSON; the function tool got the run's context.
    assert run.result["final_output"] == Draft(**DRAFT).model_dump()
    assert run.result["last_agent"] == "Writer" and run.result["turns"] == 5
    assert SEEN["contexts"] == [(Desk(customer="Ann"), "call:1.0:lookup_order")]


def test_a_run_resumed_after_the_handoff_goes_on_with_the_writer_and_asks_no_turn_again(ledger):
    build(ledger, triage_script(), writer_script())
    run, _ = engine.start_run(WORKFLOW, CASE)
    drive_until(run.pk, "handoff:2.0:Writer")
    assert published(ledger) == []
    # Another process: the agents registered anew, with models that know only what is left.
    # A triage turn asked again would fail (its script is empty).
    mcp.close_connections()
    triage, writer = build(ledger, [], writer_script())
    run = engine.run_until_quiet(run.pk)
    assert run.status == "succeeded", run.attention_reason
    assert (len(triage.model.calls), len(writer.model.calls)) == (0, 3)
    assert writer.model.calls[0].system_instructions.startswith("You write replies to Ann")
    seen = writer.model.calls[0].input
    assert seen[0] == {"role": "user", "content": CASE["message"]}
    assert [i.get("call_id") for i in seen if i.get("type") == "function_call_output"] == [
        "c-order", "c-handoff"]  # fmt: skip
    assert len(published(ledger)) == 1
    assert run.result["final_output"] == Draft(**DRAFT).model_dump()


def test_the_mcp_servers_require_approval_is_a_console_approval_before_the_write(
    ledger, support_user
):
    from approvals.models import ApprovalRequest

    always = {"require_approval": {"always": {"tool_names": ["publish_draft"]}}}
    build(ledger, triage_script(), writer_script(), server_options=always)
    run, _ = engine.start_run(WORKFLOW, CASE)
    run = engine.run_until_quiet(run.pk)
    assert run.status == "needs_human"
    approval = ApprovalRequest.objects.get(run=run)
    assert approval.step.name == "approve:4.0:publish_draft" and published(ledger) == []
    actions.decide_approval(approval.pk, support_user, "approved")
    run = engine.run_until_quiet(run.pk)
    assert run.status == "succeeded", run.attention_reason
    assert len(published(ledger)) == 1


def test_a_final_answer_that_does_not_match_the_output_type_is_a_classified_failure(ledger):
    build(ledger, triage_script(), writer_script(final={"title": "only a title"}))
    run, _ = engine.start_run(WORKFLOW, CASE)
    run = engine.run_until_quiet(run.pk)
    assert run.status == "needs_human"
    finish = Step.objects.get(run=run, name="finish")
    assert finish.error_class == "invalid_input"
    assert "does not match its output_type Draft" in finish.last_error
    assert len(published(ledger)) == 1  # the write before it happened once


def test_a_handoff_with_an_input_type_and_filter_runs_its_callback_and_filters_the_history(
    ledger,
):
    class Reason(BaseModel):
        reason: str

    received = []
    writer = Agent(name="Writer", instructions="Write.", model=ScriptedModel([
        [assistant_message("Done.")]]))  # fmt: skip
    triage = Agent(
        name="Triage",
        model=ScriptedModel(
            [
                [function_call("lookup_order", {"order_id": "o-1"}, call_id="c-order")],
                [
                    function_call("escalate", {"reason": "broken"}, call_id="c-h"),
                    function_call("escalate", {"reason": "twice"}, call_id="c-h2"),
                ],
            ]
        ),  # fmt: skip
        tools=[lookup_order],
        handoffs=[
            handoff(
                writer,
                tool_name_override="escalate",
                on_handoff=lambda ctx, data: received.append((ctx.context, data.reason)),
                input_type=Reason,
                input_filter=handoff_filters.remove_all_tools,
            )
        ],
    )
    register_agent(WORKFLOW, triage, context=lambda i: Desk(customer=i["customer"]))
    run, _ = engine.start_run(WORKFLOW, CASE)
    run = engine.run_until_quiet(run.pk)
    assert run.status == "succeeded", run.attention_reason
    assert names(run)[-4:] == ["turn:2", "handoff:2.0:Writer", "turn:3", "finish"]
    assert received == [(Desk(customer="Ann"), "broken")]  # the first handoff only, once
    # remove_all_tools: the writer sees the user's message only.
    assert writer.model.calls[0].input == [{"role": "user", "content": CASE["message"]}]
    assert run.result["final_output"] == "Done."


def test_a_handoff_with_arguments_its_input_type_refuses_is_a_classified_failure(ledger):
    class Reason(BaseModel):
        reason: str

    writer = Agent(name="Writer", model=ScriptedModel([]))
    triage = Agent(
        name="Triage",
        model=ScriptedModel([[function_call("escalate", {"why": 1}, call_id="c-h")]]),
        handoffs=[handoff(writer, tool_name_override="escalate", input_type=Reason,
                          on_handoff=lambda ctx, data: None)],
    )  # fmt: skip
    register_agent(WORKFLOW, triage)
    run, _ = engine.start_run(WORKFLOW, CASE)
    run = engine.run_until_quiet(run.pk)
    assert run.status == "needs_human"
    step = Step.objects.get(run=run, name="handoff:1.0:Writer")
    assert step.error_class == "invalid_input" and "escalate" in step.last_error


def test_a_tripped_input_guardrail_parks_the_run_before_any_model_turn(ledger, support_user):
    @input_guardrail
    def no_refund_fraud(ctx, agent, items) -> GuardrailFunctionOutput:
        flagged = "fraud" in json.dumps(items)
        return GuardrailFunctionOutput(output_info={"flagged": flagged}, tripwire_triggered=flagged)

    model = ScriptedModel([[assistant_message("Hello.")]])
    agent = Agent(name="Triage", model=model, input_guardrails=[no_refund_fraud])
    register_agent(WORKFLOW, agent)
    run, _ = engine.start_run(WORKFLOW, {"message": "this is fraud"})
    run = engine.run_until_quiet(run.pk)
    assert run.status == "needs_human"
    assert names(run) == ["start", "guardrail:input.0:no_refund_fraud",
                          "tripwire:input.0:no_refund_fraud"]  # fmt: skip
    assert "tripped" in Step.objects.get(run=run, name__startswith="tripwire:").last_error
    assert model.calls == ()
    # A person who decides the input is fine lets the run go on.
    actions.skip_step(run.pk, support_user, reason="a customer quoting a fraud notice")
    run = engine.run_until_quiet(run.pk)
    assert run.status == "succeeded" and len(model.calls) == 1


def test_stop_on_first_tool_ends_the_run_with_the_tools_result():
    model = ScriptedModel([[function_call("lookup_order", {"order_id": "o-1"}, call_id="c")]])
    agent = Agent(name="Triage", model=model, tools=[lookup_order],
                  tool_use_behavior="stop_on_first_tool")  # fmt: skip
    register_agent(WORKFLOW, agent, tools={"lookup_order": ToolPolicy(side_effect=False)},
                   context=lambda i: Desk(customer="Ann"))  # fmt: skip
    run, _ = engine.start_run(WORKFLOW, CASE)
    run = engine.run_until_quiet(run.pk)
    assert run.status == "succeeded", run.attention_reason
    assert run.result["final_output"] == ORDERS["o-1"]
    assert len(model.calls) == 1


def test_what_cannot_run_unchanged_is_refused_at_registration_with_the_reason(ledger):
    from agents import AgentHooks, Handoff
    from agents.mcp import MCPServerSse

    writer = Agent(name="Writer")
    cases = [
        (Agent(name="A", handoffs=[Agent(name="A")]), "two different agents are named 'A'"),
        (Agent(name="A", hooks=AgentHooks()), "AgentHooks are not run"),
        (Agent(name="A", tool_use_behavior=lambda ctx, results: None), "tool_use_behavior"),
        (Agent(name="A", tools=[writer.as_tool("w", "w")], handoffs=[]), None),
        (
            Agent(name="A", handoffs=[Handoff(tool_name="t", tool_description="d",
                  input_json_schema={}, on_invoke_handoff=None, agent_name="W")]),
            r"build it with handoff\(agent",
        ),
        (
            Agent(name="A", mcp_servers=[MCPServerSse(name="s", params={"url": "http://x"})]),
            "use MCPServerStdio or MCPServerStreamableHttp",
        ),
    ]  # fmt: skip
    for agent, reason in cases:
        if reason is None:
            register_agent("test.sdk_refused", agent)  # an agent as a tool without tools is fine
            continue
        with pytest.raises(AgentSetupError, match=reason):
            register_agent("test.sdk_refused", agent)
    acting = Agent(name="Helper", tools=[lookup_order])
    with pytest.raises(AgentSetupError, match="as a tool"):
        register_agent("test.sdk_refused", Agent(name="A", tools=[acting.as_tool("h", "h")]))
    drafts = MCPServerStdio(
        name="Drafts", params={"command": sys.executable, "args": [str(SERVER)]}
    )
    with pytest.raises(AgentSetupError, match="mcp_tools names"):
        register_agent("test.sdk_refused", Agent(name="A", mcp_servers=[drafts]),
                       mcp_tools={"Other": {}})  # fmt: skip


def test_is_enabled_and_output_guardrails_see_the_run_context():
    from agents import output_guardrail

    @dataclass
    class Verdict:
        refund: bool
        note: str

    checked = []

    @output_guardrail
    def polite(ctx, agent, output) -> GuardrailFunctionOutput:
        checked.append((ctx.context.customer, output))
        return GuardrailFunctionOutput(output_info="ok", tripwire_triggered=False)

    hidden = Agent(name="Hidden", model=ScriptedModel([]))
    # A dataclass is not a JSON object type: the SDK's schema wraps it in {"response": ...}.
    answer = {"response": {"refund": True, "note": "broken"}}
    model = ScriptedModel([[assistant_message(json.dumps(answer))]])
    agent = Agent(
        name="Triage",
        model=model,
        output_type=Verdict,
        output_guardrails=[polite],
        handoffs=[handoff(hidden, is_enabled=lambda ctx, agent: ctx.context.tone != "warm")],
    )
    register_agent(WORKFLOW, agent, context=lambda i: Desk(customer=i["customer"]))
    run, _ = engine.start_run(WORKFLOW, CASE)
    run = engine.run_until_quiet(run.pk)
    assert run.status == "succeeded", run.attention_reason
    assert names(run) == ["start", "turn:1", "guardrail:output.1.0:polite", "finish"]
    assert model.calls[0].handoffs == []  # disabled for this run's context
    assert checked == [("Ann", Verdict(refund=True, note="broken"))]
    assert run.result["final_output"] == {"refund": True, "note": "broken"}


def test_nest_handoff_history_gives_the_receiver_the_sdks_summary_of_the_conversation():
    writer = Agent(name="Writer", model=ScriptedModel([[assistant_message("Done.")]]))
    triage = Agent(
        name="Triage",
        model=ScriptedModel(triage_script()),
        tools=[lookup_order],
        handoffs=[handoff(writer, nest_handoff_history=True)],
    )
    register_agent(WORKFLOW, triage, context=lambda i: Desk(customer=i["customer"]))
    run, _ = engine.start_run(WORKFLOW, CASE)
    run = engine.run_until_quiet(run.pk)
    assert run.status == "succeeded", run.attention_reason
    (summary,) = writer.model.calls[0].input
    assert summary["role"] == "assistant" and "<CONVERSATION HISTORY>" in summary["content"]
    assert "lookup_order" in summary["content"] and CASE["message"] in summary["content"]


def test_each_agents_tools_are_bound_when_the_first_agent_is_registered():
    @function_tool(name_override="lookup_order")
    def lookup_other_order(order_id: str) -> dict:
        """Look an order up in the other shop."""
        return {}

    checker = Agent(name="Checker", tools=[lookup_order])
    writer = Agent(name="Writer Bot", tools=[lookup_other_order], handoffs=[checker])
    triage = Agent(name="Triage", tools=[lookup_order], handoffs=[writer])
    runner = register_agent(WORKFLOW, triage)
    bound = {name: node.bindings["lookup_order"].tool for name, node in runner.agents.items()}
    # Another function of the same name gets its agent's name; a shared one is the same tool.
    assert bound == {
        "Triage": f"{WORKFLOW}.lookup_order",
        "Writer Bot": f"{WORKFLOW}.Writer_Bot.lookup_order",
        "Checker": f"{WORKFLOW}.lookup_order",
    }


class Reply(TypedDict):
    subject: str
    lines: list[str]


@pytest.mark.parametrize(
    "output_type, answer",
    [
        (Reply, {"subject": "Teapot", "lines": ["Sorry."]}),
        (AgentOutputSchema(Draft, strict_json_schema=False), DRAFT),
        (list[int], {"response": [1, 2]}),  # wrapped by the SDK's schema
    ],
)
def test_every_kind_of_output_type_is_validated_and_recorded_as_json(output_type, answer):
    model = ScriptedModel([[assistant_message(json.dumps(answer))]])
    register_agent(WORKFLOW, Agent(name="Writer", model=model, output_type=output_type))
    run, _ = engine.start_run(WORKFLOW, CASE)
    run = engine.run_until_quiet(run.pk)
    assert run.status == "succeeded", run.attention_reason
    assert run.result["final_output"] == answer.get("response", answer)
    assert model.calls[0].output_schema is not None


def test_a_side_effecting_tool_gets_the_run_context_and_its_key_and_runs_once_on_replay():
    credits: dict[str, dict] = {}

    @function_tool
    def issue_credit(ctx: RunContextWrapper[Desk], amount: float) -> dict:
        """Give the customer store credit."""
        key = call_context_of(ctx).idempotency_key
        credits[key] = {"id": f"cr-{len(credits) + 1}", "customer": ctx.context.customer}
        return credits[key]

    model = ScriptedModel([
        [function_call("issue_credit", {"amount": 10.0}, call_id="c-credit")],
        [assistant_message("Credit issued.")],
    ])  # fmt: skip
    agent = Agent(name="Triage", model=model, tools=[issue_credit])
    register_agent(WORKFLOW, agent, context=lambda i: Desk(customer=i["customer"]))
    run, _ = engine.start_run(WORKFLOW, CASE)
    run = engine.run_until_quiet(run.pk)
    assert run.status == "succeeded", run.attention_reason
    effect = SideEffect.objects.get(run=run)
    assert credits == {effect.idempotency_key: {"id": "cr-1", "customer": "Ann"}}
    # Replayed: the committed key returns its receipt; neither the tool nor the model again.
    Step.objects.filter(run=run).exclude(name__startswith="turn:").update(status="pending")
    Run.objects.filter(pk=run.pk).update(status="running", finished_at=None)
    run = engine.run_until_quiet(run.pk)
    assert run.status == "succeeded" and len(credits) == 1 and len(model.calls) == 2

"""A Pydantic AI agent with an MCP server (tests/agents/pai_mcp_agent.py), written as Pydantic AI's
docs teach and registered unchanged: each MCP tool call is a `call:` step of the TaskPilots tool
`mcp.<id>.<tool>` (snapshot, intent, idempotency key in the call's _meta), an approval rule on
an MCP tool waits for a person, the model sees the tool names and schemas it would see without
TaskPilots and is asked once per request. What cannot run under TaskPilots is refused at
registration, saying why."""

from __future__ import annotations

import json
import sys

import pytest
from fastmcp.client.transports import SSETransport, StdioTransport
from pydantic_ai import Agent
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.models.function import FunctionModel

from approvals import actions
from approvals.models import ApprovalRequest
from runs import engine
from runs.agents import mcp
from runs.agents.mcp import McpToolConfig
from runs.agents.pydantic_ai import AgentSetupError, register_pydantic_agent
from runs.models import Run, SideEffect, Snapshot, Step
from tests.agents import pai_mcp_agent

pytestmark = pytest.mark.django_db

CASE = {"message": "Order o-1 arrived broken: draft an apology."}
STEPS = ["start", "model:1", "call:1.0:drafts_style_guide", "model:2",
         "call:2.0:drafts_publish_draft", "model:3", "finish"]  # fmt: skip


@pytest.fixture(autouse=True)
def drafts(tmp_path, settings, monkeypatch):
    settings.VAR_DIR = tmp_path / "var"
    ledger = tmp_path / "drafts.ledger"
    monkeypatch.setenv("PAI_DRAFTS_LEDGER", str(ledger))
    pai_mcp_agent.MODEL_CALLS.clear()
    pai_mcp_agent.register()
    yield ledger
    mcp.close_connections()


def published(ledger) -> list[dict]:
    return [json.loads(line) for line in ledger.read_text().splitlines()] if ledger.exists() else []


def step_names(run):
    return list(Step.objects.filter(run=run).order_by("position").values_list("name", flat=True))


def start():
    run, _ = engine.start_run("test.pai_mcp_agent", dict(CASE))
    return engine.run_until_quiet(run.pk)


def test_each_mcp_tool_call_is_a_step_of_its_taskpilots_tool(drafts):
    run = start()
    assert run.status == "succeeded", run.attention_reason
    assert step_names(run) == STEPS
    assert run.result["final_output"] == {"summary": "Draft published.", "published": True}
    assert len(pai_mcp_agent.MODEL_CALLS) == 3  # each request asked once, the rest replayed
    # The model sees the server's tools as Pydantic AI names them: prefixed, filtered.
    offered = pai_mcp_agent.MODEL_CALLS[0]
    assert sorted(offered) == ["drafts_publish_draft", "drafts_style_guide"]
    assert offered["drafts_publish_draft"]["required"] == ["title", "body"]
    steps = {s.name: s for s in Step.objects.filter(run=run)}
    style = steps["call:1.0:drafts_style_guide"]
    assert (style.kind, style.tool) == ("read", "mcp.drafts.style_guide")
    publish = steps["call:2.0:drafts_publish_draft"]
    assert (publish.kind, publish.tool) == ("side_effect", "mcp.drafts.publish_draft")
    assert publish.spec["params"] == {"title": "Sorry about order o-1", "body": "A warm apology."}
    effect = SideEffect.objects.get(run=run, tool="mcp.drafts.publish_draft")
    assert effect.status == "committed" and effect.external_id == "draft-1"
    snapshot = Snapshot.objects.get(run=run, step=publish)
    assert snapshot.idempotency_key == effect.idempotency_key
    assert snapshot.target_resource == "draft:Sorry about order o-1"
    # The server got exactly one call, carrying the idempotency key in its _meta.
    assert published(drafts) == [{"key": effect.idempotency_key, "title": "Sorry about order o-1"}]


def test_an_approval_rule_on_an_mcp_tool_waits_for_a_person(drafts, support_user):
    pai_mcp_agent.register(approval=True)
    run = start()
    assert run.status == "needs_human", run.attention_reason
    assert step_names(run)[-1] == "approve:2.0:drafts_publish_draft"
    assert published(drafts) == []
    approval = ApprovalRequest.objects.get(run=run)
    assert approval.proposed_params["title"] == "Sorry about order o-1"
    assert approval.reason == "Drafts are checked before they are published"
    actions.decide_approval(approval.pk, support_user, "approved")
    run = engine.run_until_quiet(run.pk)
    assert run.status == "succeeded", run.attention_reason
    assert step_names(run) == [*STEPS[:4], "approve:2.0:drafts_publish_draft", *STEPS[4:]]
    assert len(published(drafts)) == 1
    assert len(pai_mcp_agent.MODEL_CALLS) == 3


def stdio(ledger, **options) -> MCPToolset:
    command = StdioTransport(command=sys.executable, args=[str(pai_mcp_agent.SERVER), str(ledger)])
    return MCPToolset(command, **options)


def refused(*toolsets, **options) -> str:
    agent = Agent(FunctionModel(pai_mcp_agent.fake_model), toolsets=list(toolsets))
    with pytest.raises(AgentSetupError) as error:
        register_pydantic_agent("test.pai_mcp_refused", agent, **options)
    return str(error.value)


def test_what_cannot_run_under_taskpilots_is_refused_saying_why(drafts):
    sse = MCPToolset(SSETransport("http://127.0.0.1:9/sse"), id="old")
    assert "SSE transport is not supported" in refused(sse)
    assert "has no id" in refused(stdio(drafts))
    wrong = {"drafts": {}, "nope": {"x": McpToolConfig()}}
    assert "mcp_tools names ['nope']" in refused(stdio(drafts, id="drafts"), mcp_tools=wrong)
    approve = stdio(drafts, id="drafts").approval_required()
    assert "McpToolConfig(needs_approval" in refused(approve)
    headers = MCPToolset("http://127.0.0.1:9/mcp", id="web", headers={"X-Key": "k"})
    assert "custom headers" in refused(headers)
    assert "include_instructions" in refused(stdio(drafts, id="d", include_instructions=True))
    hooked = stdio(drafts, id="d", process_tool_call=lambda *args: None)
    assert "process_tool_call" in refused(hooked)
    other = StdioTransport(command=sys.executable, args=["other.py"])
    assert "two different MCP servers" in refused(
        stdio(drafts, id="drafts"), MCPToolset(other, id="drafts")
    )
    # Toolsets that are neither function tools nor MCP servers are refused, as before.
    from pydantic_ai.toolsets import ExternalToolset, FunctionToolset

    assert "neither a FunctionToolset nor an MCP server" in refused(ExternalToolset([]))
    assert "inside a wrapper" in refused(FunctionToolset([]).prefixed("x"))
    assert Run.objects.count() == 0


def test_a_tool_named_in_mcp_tools_that_the_server_lacks_stops_at_its_listing(drafts):
    agent = pai_mcp_agent.build_agent(drafts)
    config = {"drafts": {"unpublish": McpToolConfig(needs_approval=True)}}
    register_pydantic_agent("test.pai_mcp_lacking", agent, mcp_tools=config)
    run, _ = engine.start_run("test.pai_mcp_lacking", dict(CASE))
    run = engine.run_until_quiet(run.pk)
    assert run.status == "needs_human"
    assert "MCP server 'drafts' has no tools named ['unpublish']" in run.attention_reason
    assert pai_mcp_agent.MODEL_CALLS == []


def test_registering_reaches_no_server(tmp_path, monkeypatch):
    monkeypatch.setenv("PAI_DRAFTS_LEDGER", str(tmp_path / "fresh.ledger"))
    pai_mcp_agent.register()
    starts = tmp_path / "fresh.ledger.starts"
    assert not starts.exists()  # the server is started on first use, not at registration


def test_the_model_sees_the_tools_it_sees_without_taskpilots(drafts, tmp_path):
    from runs.agents import run_sync

    native = pai_mcp_agent.build_agent(tmp_path / "native.ledger")
    result = run_sync(lambda: native.run(CASE["message"]))  # Pydantic AI alone, no TaskPilots
    assert result.output.published
    alone = list(pai_mcp_agent.MODEL_CALLS)
    pai_mcp_agent.MODEL_CALLS.clear()
    run = start()
    assert run.status == "succeeded", run.attention_reason
    assert alone == pai_mcp_agent.MODEL_CALLS  # the same names and schemas, on every request


def test_a_server_that_cannot_be_listed_stops_the_run_for_a_person_saying_so(drafts):
    gone = MCPToolset(StdioTransport(command="/nonexistent/mcp-server", args=[]), id="gone")
    agent = Agent(FunctionModel(pai_mcp_agent.fake_model), toolsets=[gone])
    register_pydantic_agent("test.pai_mcp_gone", agent)
    run, _ = engine.start_run("test.pai_mcp_gone", dict(CASE))
    run = engine.run_until_quiet(run.pk)
    assert run.status == "needs_human"
    assert step_names(run) == ["start"]  # no step was made up for it
    assert "cannot list the tools of MCP server 'gone'" in run.attention_reason
    assert pai_mcp_agent.MODEL_CALLS == []


def test_renamed_and_combined_mcp_tools_call_their_taskpilots_tools(drafts):
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.toolsets import CombinedToolset

    def model(messages, info):
        pai_mcp_agent.MODEL_CALLS.append({t.name: {} for t in info.function_tools})
        if not any(isinstance(m, ModelResponse) for m in messages):
            return ModelResponse(parts=[ToolCallPart("guide", {"topic": "refunds"})])
        return ModelResponse(parts=[TextPart("ok")])

    renamed = stdio(drafts, id="drafts").renamed({"guide": "style_guide"})
    agent = Agent(FunctionModel(model), toolsets=[CombinedToolset([renamed])])
    register_pydantic_agent("test.pai_mcp_renamed", agent)
    run, _ = engine.start_run("test.pai_mcp_renamed", dict(CASE))
    run = engine.run_until_quiet(run.pk)
    assert run.status == "succeeded", run.attention_reason
    assert "guide" in pai_mcp_agent.MODEL_CALLS[0]
    step = Step.objects.get(run=run, name="call:1.0:guide")
    assert (step.kind, step.tool) == ("read", "mcp.drafts.style_guide")
    assert step.result["result"]["topic"] == "refunds"
    assert run.result["final_output"] == "ok"

"""MCP tools as TaskPilots tools, against a real local MCP server
(taskpilots/demo/servers/sandbox.py, started by the tests over stdio and streamable HTTP) that
forwards to the sandbox, whose ledger counts what really happened."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from approvals import actions
from approvals.models import ApprovalRequest
from runs import engine
from runs import tools as tool_registry
from runs.agents.mcp import (
    McpServer,
    McpToolConfig,
    list_tools,
    metadata_from_annotations,
    register_mcp_tools,
)
from runs.models import SideEffect, Snapshot, Step
from runs.tools import CallContext, ToolError
from taskpilots.demo import agent as demo

pytestmark = pytest.mark.django_db

CASE = {
    "message": "My order arrived broken, please refund it.",
    "customer": "ann@example.com",
    "payment": "pay_1",
    "amount": 120.0,
    "ticket": "T-1",
    "days_since_purchase": 10,
}


def call_context(key="k-1", timeout=10.0):
    return CallContext(idempotency_key=key, run_id="r-1", step="s", attempt=1, timeout=timeout)


def until_approval(support_user, *, amount=None):
    run, _ = engine.start_run("demo.agent", CASE)
    run = engine.run_until_quiet(run.pk)
    assert run.status == "needs_human", run.attention_reason
    approval = ApprovalRequest.objects.get(run=run)
    if amount is None:
        actions.decide_approval(approval.pk, support_user, "approved")
    else:
        edited = {**approval.proposed_params, "amount": amount}
        actions.decide_approval(
            approval.pk, support_user, "approved_with_edits", edited_params=edited
        )
    return run, approval


def test_the_pinned_manifest_is_what_the_server_lists():
    assert list_tools(demo.SANDBOX_MCP) == json.loads(demo.MANIFEST.read_text())


def test_annotations_give_the_default_metadata():
    assert metadata_from_annotations({"readOnlyHint": True})["side_effect"] is False
    # MCP's defaults for a tool that says nothing: a destructive, open-world write.
    assert metadata_from_annotations(None) == {"side_effect": True, "risk": "high",
                                               "dedupes_by_key": False}  # fmt: skip
    assert metadata_from_annotations({"destructiveHint": False, "openWorldHint": False,
                                      "idempotentHint": True}) == {
        "side_effect": True, "risk": "low", "dedupes_by_key": True}  # fmt: skip
    tools = {t.mcp_name: t for t in demo.MCP_TOOLS.values()}
    assert not tools["crm_lookup"].side_effect
    assert (tools["send_mail"].risk, tools["send_mail"].lookup_by_key) == ("medium", True)
    assert (tools["refund_payment"].risk, tools["refund_payment"].dedupes_by_key) == ("high", True)


def test_configuration_overrides_the_annotations():
    manifest = json.loads(demo.MANIFEST.read_text())
    tools = register_mcp_tools(
        demo.SANDBOX_MCP,
        include=["send_mail"],
        config={"send_mail": McpToolConfig(name="test.mcp_mail", risk="high",
                                           dedupes_by_key=True, key_argument="")},
        manifest=manifest,
    )  # fmt: skip
    assert tool_registry.get("test.mcp_mail") is tools["send_mail"]
    assert (tools["send_mail"].risk, tools["send_mail"].dedupes_by_key) == ("high", True)


def test_the_demo_agent_runs_through_the_mcp_server_with_an_edited_approval(sandbox, support_user):
    run, approval = until_approval(support_user, amount=100.0)
    assert approval.tool == "mcp.sandbox.refund_payment" and approval.risk == "high"
    assert approval.proposed_params == {"payment_id": "pay_1", "amount": 120.0}
    run = engine.run_until_quiet(run.pk)
    assert run.status == "succeeded", run.attention_reason
    assert run.result["final_output"].startswith("Refunded 100.00")
    refunds = sandbox.ledger(system="payments", run=str(run.pk))
    assert [r["request"]["amount"] for r in refunds] == [100.0]
    mails = sandbox.ledger(system="mail", run=str(run.pk))
    assert len(mails) == 1 and "100.00" in mails[0]["request"]["body"]
    assert len(sandbox.ledger(system="tickets", run=str(run.pk))) == 1
    # Every MCP side effect was snapshotted with its key, which reached the system.
    for effect in SideEffect.objects.filter(run=run):
        assert effect.status == "committed" and effect.external_id
        assert sandbox.ledger(key=effect.idempotency_key)
        receipt = effect.receipt["response"]
        assert set(receipt) == {"result", "server", "tool"} and receipt["server"] == "sandbox"
    targets = set(Snapshot.objects.filter(run=run).values_list("target_resource", flat=True))
    assert targets == {"payment:pay_1", "mailbox:ann@example.com", "ticket:T-1"}
    kinds = dict(Step.objects.filter(run=run).values_list("name", "kind"))
    assert kinds["call:1.0:crm_lookup"] == "read"
    assert kinds["call:1.1:check_refund_policy"] == "read"
    assert kinds["approve:2.0:refund_payment"] == "approval"


def test_a_write_that_committed_but_failed_is_confirmed_by_key_not_resent(sandbox, support_user):
    # The mail system commits and then answers 500: the MCP server says "unknown outcome", the
    # engine asks the server's find_by_key tool, finds the mail and records it as the proof.
    sandbox.inject("mail", "commit_then_500", action="send")
    run, _ = until_approval(support_user)
    run = engine.run_until_quiet(run.pk)
    assert run.status == "succeeded", run.attention_reason
    assert len(sandbox.ledger(system="mail", run=str(run.pk))) == 1
    effect = SideEffect.objects.get(run=run, tool="mcp.sandbox.send_mail")
    assert effect.status == "committed" and effect.confirmed_by == "reconcile"


def test_an_outage_behind_the_mcp_server_waits_and_recovers(sandbox, support_user):
    sandbox.inject("crm", "outage", seconds=60)
    run, _ = engine.start_run("demo.agent", CASE)
    run = engine.run_until_quiet(run.pk)
    assert run.status == "waiting"
    step = Step.objects.get(run=run, name="call:1.0:crm_lookup")
    assert (step.status, step.error_class) == ("waiting", "outage")
    sandbox.clear_faults()
    Step.objects.filter(pk=step.pk).update(next_attempt_at=timezone.now() - timedelta(seconds=1))
    engine.sweep()
    run = engine.run_until_quiet(run.pk)
    assert run.status == "needs_human"  # on to the refund approval: the lookup recovered
    step.refresh_from_db()
    assert step.status == "succeeded" and step.result["result"]["found"] in (True, False)


def test_failures_are_classified(sandbox):
    mail = tool_registry.get("mcp.sandbox.send_mail")
    with pytest.raises(ToolError) as bad_args:
        mail.validate({"to": "ann@example.com", "subject": 1, "body": "x"})
    assert bad_args.value.failure_class == "invalid_input"
    sandbox.inject("mail", "503", action="send")
    with pytest.raises(ToolError) as busy:
        mail.invoke({"to": "ann@example.com", "subject": "s", "body": "b"}, call_context())
    assert busy.value.failure_class == "transient"
    assert sandbox.ledger(system="mail") == []
    gone = McpServer("gone", command=["/nonexistent/mcp-server"])
    with pytest.raises(ToolError) as outage:
        register_mcp_tools(gone, manifest=json.loads(demo.MANIFEST.read_text()),
                           include=["crm_lookup"], config={
                               "crm_lookup": McpToolConfig(name="test.gone_lookup")})[
            "crm_lookup"].invoke({"email": "a@b.c"}, call_context())  # fmt: skip
    assert outage.value.failure_class == "outage"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def http_server(sandbox_process):
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, str(demo.SERVER_SCRIPT), "--http", str(port)],
        env={**__import__("os").environ, "TASKPILOTS_SANDBOX_URL": sandbox_process.url},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.1)
    yield f"http://127.0.0.1:{port}/mcp"
    process.terminate()
    process.wait(10)


def test_streamable_http_servers_are_discovered_and_called(http_server, sandbox):
    server = McpServer("sandbox_http", url=http_server)
    tools = register_mcp_tools(server, include=["crm_lookup", "update_ticket"])
    assert tools["update_ticket"].name == "mcp.sandbox_http.update_ticket"
    result = tools["update_ticket"].invoke({"ticket_id": "T-9", "status": "solved"},
                                           call_context(key="k-http"))  # fmt: skip
    assert result.external_id.startswith("tku_")
    assert [e["idempotency_key"] for e in sandbox.ledger(system="tickets")] == ["k-http"]
    found = tools["crm_lookup"].invoke({"email": "ann@example.com"}, call_context())
    assert found.response["server"] == "sandbox_http"

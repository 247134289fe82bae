"""Tool pause (the admin's circuit breaker): a paused tool is never called, its steps wait without
counting as failures, and resuming it lets the runs go on."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from approvals import rules
from approvals.models import EscalationRule, ToolPause
from runs import engine
from runs.models import SideEffect, Snapshot, Step, TimelineEvent, Wait
from tests.approvals.console_helpers import fast_passwords  # noqa: F401  (autouse)

pytestmark = pytest.mark.django_db

REPLY = {"message": "Where is my refund?", "email": "ann@example.com", "ticket": "T-1"}
PAUSE, RESUME = "/console/rules/tools/pause/", "/console/rules/tools/resume/"
TOOLS = "/console/rules/tools/"


def later(**delta):
    return timezone.now() + timedelta(**delta)


def start(workflow, input):
    run, _ = engine.start_run(workflow, input)
    return engine.run_until_quiet(run.pk)


def test_a_paused_tool_holds_its_steps_and_resume_lets_them_go_on(client, admin_user, sandbox):
    client.force_login(admin_user)
    assert client.post(PAUSE, {"tool": "mail.send", "reason": "bounce storm"}).status_code == 302
    run = start("test.reply", REPLY)
    assert run.status == "waiting"
    step = Step.objects.get(run=run, name="send_reply")
    assert step.status == "waiting" and step.error_class == ""
    # Held, not failed: no attempt used, no failure counted, nothing written or sent.
    assert step.attempts == 0 and run.failure_count == 0
    assert step.routing["paused_tool"] == "mail.send"
    assert not Snapshot.objects.filter(step=step).exists()
    assert not SideEffect.objects.filter(step=step).exists()
    wait = Wait.objects.get(step=step, status="pending")
    assert wait.kind == "tool_recovery" and wait.event_type == "mail.send"
    # The sweeper's safety re-check while still paused calls nothing either.
    assert engine.sweep(now=later(hours=2)).tool_probes == 1
    run = engine.run_until_quiet(run.pk)
    assert run.status == "waiting"
    assert Step.objects.get(pk=step.pk).attempts == 0
    assert sandbox.ledger(system="mail", run=str(run.pk)) == []
    assert client.get(TOOLS).content.decode().count("1 step waiting") == 1

    assert client.post(RESUME, {"tool": "mail.send"}).status_code == 302
    assert TimelineEvent.objects.filter(run=run, verb="tool.resumed").count() == 1
    assert engine.sweep().tool_probes == 1
    run = engine.run_until_quiet(run.pk)
    assert run.status == "succeeded"
    assert len(sandbox.ledger(system="mail", run=str(run.pk))) == 1
    step.refresh_from_db()
    assert step.attempts == 1 and step.routing == {}
    assert Wait.objects.get(pk=wait.pk).status == "resolved"
    pause = ToolPause.objects.get(tool="mail.send")
    assert pause.resumed_by == admin_user and pause.paused_by == admin_user


def test_a_paused_read_is_not_called_and_a_paused_fallback_is_not_used(admin_user, sandbox):
    rules.pause_tool("crm.lookup", admin_user, "CRM migration")
    run = start("test.reply", REPLY)
    assert run.status == "waiting"
    assert Step.objects.get(run=run, name="customer").status == "waiting"
    assert sandbox.ledger(system="crm", run=str(run.pk)) == []

    EscalationRule.objects.create(position=1, name="kb degrade", tool="kb.search",
                                  action="degrade")  # fmt: skip
    rules.pause_tool("kb.faq", admin_user, "FAQ being rewritten")
    sandbox.inject("kb", "503", action="search", count=-1)
    kb_run = start("test.kb", {"q": "refund"})
    step = Step.objects.get(run=kb_run, name="search")
    assert step.status != "degraded"
    assert "kb.faq is paused" in step.last_error


def test_pausing_twice_keeps_one_pause_and_resuming_an_unpaused_tool_is_a_no_op(client, admin_user):
    client.force_login(admin_user)
    client.post(PAUSE, {"tool": "mail.send", "reason": "one"})
    client.post(PAUSE, {"tool": "mail.send", "reason": "two"})
    assert ToolPause.objects.filter(tool="mail.send", resumed_at__isnull=True).count() == 1
    assert ToolPause.objects.get(tool="mail.send").reason == "one"
    assert client.post(RESUME, {"tool": "crm.lookup"}).status_code == 302
    assert not ToolPause.objects.filter(tool="crm.lookup").exists()


@pytest.mark.parametrize(
    ("data", "message"),
    [({"tool": "mail.sned", "reason": "x"}, "Did you mean mail.send"),
     ({"tool": "mail.send", "reason": "  "}, "Say why the tool is paused")],
)  # fmt: skip
def test_a_bad_pause_is_refused(client, admin_user, data, message):
    client.force_login(admin_user)
    response = client.post(PAUSE, data)
    assert response.status_code == 422
    assert message in response.content.decode()
    assert not ToolPause.objects.exists()


def test_only_admins_pause_tools(client, support_user):
    client.force_login(support_user)
    assert client.post(PAUSE, {"tool": "mail.send", "reason": "x"}).status_code == 403
    assert client.post(RESUME, {"tool": "mail.send"}).status_code == 403
    assert not ToolPause.objects.exists()

"""Degrading a side effect to its tool's fallback: only a call known not to have landed, as a
side effect of its own (snapshot, intent, key), counted on the receiving side (the sandbox)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from approvals import rules
from runs import engine
from runs.engine import ledger
from runs.models import Run, SideEffect, Snapshot, Step, TimelineEvent
from tests.factories import EscalationRuleFactory

pytestmark = pytest.mark.django_db

MAIL = {"to": "dee@example.com"}


@pytest.fixture(autouse=True)
def fast_tools(settings):
    settings.TASKPILOTS = {**settings.TASKPILOTS, "TOOL_TIMEOUT_SECONDS": 1.0}


def degrade_rule(tool="test.mail_down"):
    return EscalationRuleFactory(position=0, name="mail down: degrade", tool=tool,
                                 action="degrade", queue="support")  # fmt: skip


def start_and_drive(workflow="test.degrade_write"):
    run, _ = engine.start_run(workflow, MAIL)
    return engine.run_until_quiet(run.pk)


def mail_effects(sandbox, run):
    return sandbox.ledger(system="mail", run=str(run.pk))


def test_a_refused_write_is_done_once_by_its_fallback(sandbox):
    rule = degrade_rule()
    run = start_and_drive()
    assert run.status == Run.Status.SUCCEEDED
    step = Step.objects.get(run=run, name="send")
    key = f"tp-{run.pk}-send"
    fallback_key = f"{key}:fallback:mail.send"
    assert step.status == "degraded" and step.error_class == "outage"
    # The receiving side: one mail, sent by the fallback under its own key.
    sent = mail_effects(sandbox, run)
    assert [e["idempotency_key"] for e in sent] == [fallback_key]
    effects = {e.tool: e for e in SideEffect.objects.filter(run=run)}
    assert effects["test.mail_down"].status == "not_committed"
    assert effects["test.mail_down"].idempotency_key == key
    assert effects["mail.send"].status == "committed"
    assert effects["mail.send"].external_id == step.result["id"]
    # Each call had its snapshot written before it.
    assert set(Snapshot.objects.filter(step=step).values_list("tool", "idempotency_key")) == {
        ("test.mail_down", key),
        ("mail.send", fallback_key),
    }
    event = TimelineEvent.objects.get(run=run, verb="step.degraded")
    assert event.data["rule"]["rule"] == rule.name
    assert event.data["failure_class"] == "outage"
    assert (event.data["original_tool"], event.data["fallback_tool"]) == (
        "test.mail_down",
        "mail.send",
    )
    assert (event.data["original_key"], event.data["fallback_key"]) == (key, fallback_key)
    assert step.idempotency_key == key  # the step's own key stays the original's


def test_an_unknown_outcome_never_degrades(sandbox):
    # The first call may have landed: a second effect through the fallback could double it.
    degrade_rule("test.mail_unknown")
    run = start_and_drive("test.degrade_unknown")
    assert run.status == "needs_human"
    assert Step.objects.get(run=run, name="send").status == "unknown_outcome"
    assert mail_effects(sandbox, run) == []
    assert not SideEffect.objects.filter(run=run, tool="mail.send").exists()


def test_a_paused_fallback_escalates_saying_so(sandbox, admin_user):
    degrade_rule()
    rules.pause_tool("mail.send", admin_user, "mail provider migration")
    run = start_and_drive()
    assert run.status == "needs_human"
    step = Step.objects.get(run=run, name="send")
    assert step.status == "needs_human"
    assert "its fallback mail.send is paused" in step.last_error
    assert "test.mail_down failed (outage" in step.last_error
    assert mail_effects(sandbox, run) == []


def test_a_failing_fallback_escalates_with_both_failures(sandbox):
    degrade_rule()
    sandbox.inject("mail", "429", action="send", count=1)
    run = start_and_drive()
    assert run.status == "needs_human"
    step = Step.objects.get(run=run, name="send")
    assert "its fallback mail.send (key" in step.last_error
    assert "429" in step.last_error
    assert mail_effects(sandbox, run) == []
    fallback = SideEffect.objects.get(run=run, tool="mail.send")
    assert fallback.status == "not_committed"


def test_a_fallback_that_is_no_longer_a_write_escalates_saying_so(sandbox, monkeypatch):
    from runs import tools

    degrade_rule()
    real_get = tools.get

    def changed(name):
        tool = real_get(name)
        return (
            tools.Tool(**{**tool.__dict__, "side_effect": False}) if name == "mail.send" else tool
        )

    monkeypatch.setattr(ledger.tool_registry, "get", changed)
    run = start_and_drive()
    step = Step.objects.get(run=run, name="send")
    assert run.status == "needs_human"
    assert "mail.send is not a side-effect tool" in step.last_error
    assert mail_effects(sandbox, run) == []


class Crash(BaseException):
    """The worker dies here (nothing in the engine catches a BaseException)."""


@pytest.mark.parametrize("when", ["before_the_call", "after_the_call"])
def test_a_crash_in_the_fallback_call_still_sends_exactly_once(sandbox, monkeypatch, when):
    degrade_rule()
    real_invoke = ledger.invoke
    called: list[str] = []

    def dying(claim, tool, params, key=""):
        called.append(tool.name)
        if tool.name == "mail.send" and called.count("mail.send") == 1:
            if when == "after_the_call":
                real_invoke(claim, tool, params, key)
            raise Crash
        return real_invoke(claim, tool, params, key)

    monkeypatch.setattr(ledger, "invoke", dying)
    run, _ = engine.start_run("test.degrade_write", MAIL)
    with pytest.raises(Crash):
        engine.run_until_quiet(run.pk)
    fallback = SideEffect.objects.get(run=run, tool="mail.send")
    assert fallback.status == "intended"  # its intent was committed before the call
    # The lease runs out and the mail system's settle window passes; the sweeper's next claim.
    past = timezone.now() - timedelta(hours=1)
    Step.objects.filter(run=run).update(lease_expires_at=past)
    SideEffect.objects.filter(run=run).update(attempted_at=past)
    run = engine.run_until_quiet(run.pk)
    assert run.status == "succeeded"
    assert Step.objects.get(run=run, name="send").status == "degraded"
    assert len(mail_effects(sandbox, run)) == 1
    # The original, known not sent, was never called again: the fallback's row was settled.
    assert called.count("test.mail_down") == 1
    # And replaying the finished step sends nothing more.
    Step.objects.filter(run=run).update(status="pending", result=None)
    Run.objects.filter(pk=run.pk).update(status="running", finished_at=None)
    run = engine.run_until_quiet(run.pk)
    assert run.status == "succeeded"
    assert len(mail_effects(sandbox, run)) == 1
    assert called.count("test.mail_down") == 1


def test_the_run_page_shows_the_degraded_step_with_the_fallback_receipt(client, sandbox,
                                                                       support_user):  # fmt: skip
    degrade_rule()
    run = start_and_drive()
    client.force_login(support_user)
    page = client.get(f"/console/runs/{run.pk}/").content.decode()
    fallback = SideEffect.objects.get(run=run, tool="mail.send")
    assert f"tp-{run.pk}-send:fallback:mail.send" in page
    assert fallback.external_id in page
    assert "Fallback tool" in page and "Degraded to its fallback after" in page
    assert "connection refused" in page


def test_a_degraded_write_counts_as_a_tool_failure_recovered_in_place(sandbox):
    # The original tool failed (one tool failure, class outage) and the step finished at the
    # same step through its fallback, with no person: a local recovery.
    from approvals.metrics.dashboard import seed_figures

    degrade_rule()
    run = start_and_drive()
    assert run.status == Run.Status.SUCCEEDED
    figures = seed_figures([run.pk])
    assert figures["local_recovery_rate"]["value"] == 1.0
    assert figures["local_recovery_rate"]["counts"] == [1, 1]
    by_class = figures["tool_failure_rate"]["extra"]["by_class"]
    assert by_class["outage"]["failures"] == 1

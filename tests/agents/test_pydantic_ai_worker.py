"""The Pydantic AI agent (tests/agents/pai_agent.py) in real Celery worker processes: the worker
is SIGKILLed while the side-effecting tool runs, after the mail reached the receiving side and
before the receipt was recorded. Another worker takes the run over: exactly one mail on the
receiving side, and the model is not asked again for the requests already recorded."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from runs import engine
from runs.models import Run, SideEffect, Step, TimelineEvent
from tests.agents import pai_agent
from tests.worker import private_workers, wait_for

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

MODULES = "taskpilots.demo.tools,tests.runs.flows,tests.agents.pai_agent"
CASE = {"message": "Order o-1 arrived broken, please refund it.", "customer": "ann@example.com"}


def finished(run_id):
    def check():
        run = Run.objects.get(pk=run_id)
        return run if run.status in (Run.TERMINAL | Run.HUMAN) else None

    return check


def test_a_worker_killed_during_the_mail_leaves_one_mail_and_no_second_model_call(
    transactional_db, sandbox, tmp_path, monkeypatch
):
    log = tmp_path / "model-calls.log"
    monkeypatch.setenv("PAI_MODEL_LOG", str(log))  # this process's calls too, if it makes any
    pai_agent.register()
    env = {"TASKPILOTS_WORKFLOW_MODULES": MODULES, "PAI_MODEL_LOG": str(log)}
    with private_workers(env) as workers:
        first = workers.start(PAI_HOLD_AFTER_SEND="120")
        run, _ = engine.start_run("test.pai_agent", dict(CASE))
        wait_for(lambda: sandbox.ledger(system="mail", run=str(run.pk)), what="the mail to land")
        first.kill()  # SIGKILL, mid-tool: the mail left, its receipt is not recorded
        assert len(sandbox.ledger(system="mail", run=str(run.pk))) == 1
        effect = SideEffect.objects.get(run=run, tool="test.pai_agent.send_mail")
        assert effect.status == "intended"
        assert log.read_text().count("call") == 2  # model:1 and model:2
        Step.objects.filter(run=run, status="running").update(
            lease_expires_at=timezone.now() - timedelta(seconds=1)
        )
        workers.start()
        engine.sweep()
        run = wait_for(finished(run.pk), what="the run to finish")

    assert run.status == "succeeded", run.attention_reason
    assert run.result["final_output"] == {"summary": "Refund mailed to the customer.",
                                          "mailed": True}  # fmt: skip
    assert len(sandbox.ledger(system="mail", run=str(run.pk))) == 1
    effect.refresh_from_db()
    assert effect.status == "committed" and effect.confirmed_by == "reconcile"
    assert log.read_text().count("call") == 3  # model:3 only, after the crash
    models = Step.objects.filter(run=run, name__startswith="model:")
    assert models.count() == 3 and all(m.attempts == 1 for m in models)
    assert TimelineEvent.objects.filter(run=run, verb="step.lease_reclaimed").exists()


def test_a_worker_killed_after_the_mcp_server_published_leaves_one_draft_and_no_model_call(
    transactional_db, tmp_path, monkeypatch
):
    # The agent's MCP server (tests/agents/pai_mcp_agent.py): the worker dies right after the
    # server published the draft and answered, before the receipt was recorded.
    from tests.agents import pai_mcp_agent

    log, ledger = tmp_path / "model-calls.log", tmp_path / "drafts.ledger"
    monkeypatch.setenv("PAI_MODEL_LOG", str(log))
    monkeypatch.setenv("PAI_DRAFTS_LEDGER", str(ledger))
    pai_mcp_agent.register()
    modules = "taskpilots.demo.tools,tests.runs.flows,tests.agents.pai_mcp_agent"
    env = {"TASKPILOTS_WORKFLOW_MODULES": modules, "PAI_MODEL_LOG": str(log),
           "PAI_DRAFTS_LEDGER": str(ledger)}  # fmt: skip
    case = {"message": "Order o-1 arrived broken: draft an apology."}
    with private_workers(env) as workers:
        first = workers.start(TASKPILOTS_CHAOS_CRASH_AFTER_CALL="mcp.drafts.publish_draft")
        run, _ = engine.start_run("test.pai_mcp_agent", case)
        wait_for(lambda: ledger.exists() and ledger.read_text(), what="the draft to be published")
        wait_for(lambda: not first.alive, what="the worker to die after the call")
        first.kill()
        effect = SideEffect.objects.get(run=run, tool="mcp.drafts.publish_draft")
        assert effect.status == "intended"  # the draft is out, its receipt is not recorded
        assert log.read_text().count("call") == 2  # model:1 and model:2
        Step.objects.filter(run=run, status="running").update(
            lease_expires_at=timezone.now() - timedelta(seconds=1)
        )
        workers.start()
        engine.sweep()
        run = wait_for(finished(run.pk), what="the run to finish")

    assert run.status == "succeeded", run.attention_reason
    assert run.result["final_output"] == {"summary": "Draft published.", "published": True}
    drafts = ledger.read_text().splitlines()
    assert len(drafts) == 1  # exactly one effect on the server's side
    effect.refresh_from_db()
    assert effect.status == "committed" and effect.confirmed_by == "reconcile"
    assert effect.external_id == "draft-1"
    assert effect.idempotency_key in drafts[0]
    assert log.read_text().count("call") == 3  # model:3 only, after the crash
    models = Step.objects.filter(run=run, name__startswith="model:")
    assert models.count() == 3 and all(m.attempts == 1 for m in models)

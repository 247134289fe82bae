"""The LangGraph graph (tests/agents/lg_graph.py) in real Celery worker processes: the worker is
SIGKILLed while the side-effecting tool runs, after the mail reached the receiving side and
before the receipt was recorded. Another worker takes the run over: exactly one mail on the
receiving side, and the model is not asked again for the node runs already recorded."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from runs import engine
from runs.models import Run, SideEffect, Step, TimelineEvent
from tests.agents import lg_graph
from tests.worker import private_workers, wait_for

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

MODULES = "taskpilots.demo.tools,tests.runs.flows,tests.agents.lg_graph"
CASE = {"message": "Order o-1 arrived broken, please refund it."}


def finished(run_id):
    def check():
        run = Run.objects.get(pk=run_id)
        return run if run.status in (Run.TERMINAL | Run.HUMAN) else None

    return check


def test_a_worker_killed_during_the_mail_leaves_one_mail_and_no_second_model_call(
    transactional_db, sandbox, tmp_path, monkeypatch
):
    log = tmp_path / "model-calls.log"
    monkeypatch.setenv("LG_MODEL_LOG", str(log))  # this process's calls too, if it makes any
    lg_graph.register()
    env = {"TASKPILOTS_WORKFLOW_MODULES": MODULES, "LG_MODEL_LOG": str(log)}
    with private_workers(env) as workers:
        first = workers.start(LG_HOLD_AFTER_SEND="120")
        run, _ = engine.start_run("test.lg_graph", dict(CASE))
        wait_for(lambda: sandbox.ledger(system="mail", run=str(run.pk)), what="the mail to land")
        first.kill()  # SIGKILL, mid-tool: the mail left, its receipt is not recorded
        assert len(sandbox.ledger(system="mail", run=str(run.pk))) == 1
        effect = SideEffect.objects.get(run=run, tool="test.lg_graph.send_mail")
        assert effect.status == "intended"
        assert log.read_text().count("call") == 2  # node:1:agent and node:3:agent
        Step.objects.filter(run=run, status="running").update(
            lease_expires_at=timezone.now() - timedelta(seconds=1)
        )
        workers.start()
        engine.sweep()
        run = wait_for(finished(run.pk), what="the run to finish")

    assert run.status == "succeeded", run.attention_reason
    assert run.result["final_output"] == "Refund mailed to the customer."
    assert len(sandbox.ledger(system="mail", run=str(run.pk))) == 1
    effect.refresh_from_db()
    assert effect.status == "committed" and effect.confirmed_by == "reconcile"
    assert log.read_text().count("call") == 3  # node:5:agent only, after the crash
    nodes = Step.objects.filter(run=run, name__endswith=":agent")
    assert nodes.count() == 3 and all(n.attempts == 1 for n in nodes)
    assert TimelineEvent.objects.filter(run=run, verb="step.lease_reclaimed").exists()

"""The demo agent (OpenAI Agents SDK + MCP tools) in real Celery worker processes: a worker that
dies mid-agent, right after the MCP server sent the mail and before the receipt was recorded,
is replaced and the run continues from its last recorded step — no second mail, no second
model call for a recorded turn."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from approvals import actions
from approvals.models import ApprovalRequest
from runs import engine
from runs.models import Run, SideEffect, Step, TimelineEvent
from taskpilots.demo import agent as demo  # noqa: F401  (registers demo.agent in this process too)
from tests.worker import private_workers, wait_for

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

MODULES = "taskpilots.demo.tools,tests.runs.flows,taskpilots.demo.agent"
CASE = {
    "message": "My order arrived broken, please refund it.",
    "customer": "ann@example.com",
    "payment": "pay_1",
    "amount": 120.0,
    "ticket": "T-1",
    "days_since_purchase": 10,
}


@pytest.fixture
def workers(transactional_db, sandbox):
    with private_workers({"TASKPILOTS_WORKFLOW_MODULES": MODULES}) as pool:
        yield pool


def parked(run_id):
    def check():
        run = Run.objects.get(pk=run_id)
        return run if run.status in (Run.TERMINAL | Run.HUMAN) else None

    return check


def test_the_agent_survives_a_worker_crash_without_a_second_mail_or_model_call(
    workers, sandbox, support_user
):
    # The first turns run here, in the test process; the rest in workers: whichever process
    # picks the run up continues from the recorded steps.
    run, _ = engine.start_run("demo.agent", CASE)
    run = engine.run_until_quiet(run.pk)
    assert run.status == "needs_human", run.attention_reason
    approval = ApprovalRequest.objects.get(run=run)
    actions.decide_approval(approval.pk, support_user, "approved")  # resumes through the broker
    # A prefork worker (without the connection pool, which prefork cannot share): its pool
    # process dies right after the mail landed, before recording it (prefork replaces it, and
    # would crash again on redelivery: stop this chaos worker altogether).
    first = workers.start(
        pool="prefork",
        TASKPILOTS_DB_POOL_SIZE="0",
        TASKPILOTS_CHAOS_CRASH_AFTER_CALL="mcp.sandbox.send_mail",
    )
    wait_for(lambda: sandbox.ledger(system="mail", run=str(run.pk)), what="the mail to land")
    wait_for(
        lambda: (
            "exitcode 137" in "".join(first.output)
            or "signal 9" in "".join(first.output)
            or "WorkerLostError" in "".join(first.output)
        ),
        what="the pool process to die after sending the mail",
    )
    first.kill()
    assert len(sandbox.ledger(system="mail", run=str(run.pk))) == 1
    assert SideEffect.objects.get(run=run, tool="mcp.sandbox.send_mail").status == "intended"
    Step.objects.filter(run=run, status="running").update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    workers.start()
    engine.sweep()
    run = wait_for(parked(run.pk), what="the run to finish")
    assert run.status == "succeeded", run.attention_reason
    assert run.result["final_output"].startswith("Refunded 120.00")
    assert len(sandbox.ledger(system="mail", run=str(run.pk))) == 1
    assert len(sandbox.ledger(system="payments", run=str(run.pk))) == 1
    assert len(sandbox.ledger(system="tickets", run=str(run.pk))) == 1
    mail = SideEffect.objects.get(run=run, tool="mcp.sandbox.send_mail")
    assert mail.status == "committed" and mail.confirmed_by == "reconcile"
    turns = Step.objects.filter(run=run, name__startswith="turn:")
    assert turns.count() == 4 and all(t.attempts == 1 for t in turns)
    assert TimelineEvent.objects.filter(run=run, verb="step.lease_reclaimed").exists()

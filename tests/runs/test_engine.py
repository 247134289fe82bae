"""The engine in-process: every route, the side-effect protocol and its replay, against the
sandbox as the receiving side (its ledger counts what really happened)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from approvals import actions
from approvals.models import ApprovalRequest, EscalationRule, HumanDecision
from runs import engine, tools, workflows
from runs.engine import calls, ledger
from runs.models import FailureClass, Run, SideEffect, Snapshot, Step, TimelineEvent, Wait
from runs.rehydration import rehydration_document
from tests.factories import EscalationRuleFactory
from tests.worker import wait_for

pytestmark = pytest.mark.django_db

REPLY_INPUT = {"message": "Where is my refund?", "email": "ann@example.com", "ticket": "T-1"}


def start(workflow, input, **kw):
    run, created = engine.start_run(workflow, input, **kw)
    assert created
    return run


def drive(run) -> Run:
    return engine.run_until_quiet(run.pk)


def later(**delta):
    return timezone.now() + timedelta(**delta)


def make_due(run):
    """Drive time: whatever the run is waiting for (backoff, probe, settle window) is due now."""
    past = timezone.now() - timedelta(hours=1)
    Step.objects.filter(run=run, status__in=["retry_scheduled", "waiting"]).update(
        next_attempt_at=past
    )
    SideEffect.objects.filter(run=run).update(attempted_at=past)


def steps(run):
    return {(s.name, s.iteration): s for s in Step.objects.filter(run=run)}


def verbs(run):
    return list(
        TimelineEvent.objects.filter(run=run).order_by("seq").values_list("verb", flat=True)
    )


@pytest.fixture(autouse=True)
def fast_tools(settings):
    settings.TASKPILOTS = {**settings.TASKPILOTS, "TOOL_TIMEOUT_SECONDS": 1.0}


class TestHappyPathAndReplay:
    def test_it_runs_every_step_and_sends_each_effect_once(self, sandbox):
        run = drive(start("test.reply", REPLY_INPUT))
        assert run.status == Run.Status.SUCCEEDED
        assert len(sandbox.ledger(system="mail", run=str(run.pk))) == 1
        assert len(sandbox.ledger(system="tickets", run=str(run.pk))) == 1
        assert [s.status for s in Step.objects.filter(run=run).order_by("position")] == [
            "succeeded"
        ] * 4
        effect = SideEffect.objects.get(run=run, tool="mail.send")
        assert effect.status == "committed" and effect.confirmed_by == "tool"
        assert effect.external_id.startswith("msg_")

    def test_the_snapshot_holds_every_seed_field_before_the_call(self, sandbox):
        run = drive(
            start(
                "test.reply",
                REPLY_INPUT,
                principal="agent:support-bot",
                scopes=["mail:send", "tickets:write"],
                session_context_ref="conv-42",
            )
        )
        snap = Snapshot.objects.get(run=run, tool="mail.send")
        assert snap.params["to"] == "ann@example.com"
        assert snap.target_resource == "mailbox:ann@example.com"
        assert snap.permissions == {
            "actor": "agent:support-bot",
            "scopes": ["mail:send", "tickets:write"],
        }
        assert snap.session_context_ref == "conv-42"
        assert snap.stage == "reply"
        assert set(snap.prior_results_summary) == {"classify", "customer"}
        assert snap.idempotency_key == f"tp-{run.pk}-send_reply"
        assert snap.missing_fields == []
        assert snap.checksum == snap.compute_checksum()
        # Written before the side effect was asked for:
        order = verbs(run)
        assert order.index("snapshot.written") < order.index("side_effect.intended") < order.index(
            "side_effect.committed")  # fmt: skip

    def test_replay_after_forcing_steps_back_does_not_send_again(self, sandbox):
        run = drive(start("test.reply", REPLY_INPUT))
        # Force the side-effect steps back to pending and the run back to running, as a replay
        # from an old checkpoint would.
        Step.objects.filter(run=run, name__in=["send_reply", "close_ticket"]).update(
            status="pending", result=None
        )
        Run.objects.filter(pk=run.pk).update(status="running", finished_at=None)
        run = drive(run)
        assert run.status == "succeeded"
        assert len(sandbox.ledger(system="mail", run=str(run.pk))) == 1
        assert len(sandbox.ledger(system="tickets", run=str(run.pk))) == 1
        assert verbs(run).count("side_effect.reused") == 2

    def test_completed_steps_are_not_executed_again(self, sandbox):
        sandbox.inject("tickets", "503")  # the last step fails once, then retries
        run = drive(start("test.reply", REPLY_INPUT))
        assert run.status == "running"
        make_due(run)
        run = drive(run)
        assert run.status == "succeeded"
        started = [
            e.data["step"] for e in TimelineEvent.objects.filter(run=run, verb="step.started")
        ]
        assert started.count("classify") == 1 and started.count("send_reply") == 1
        assert started.count("close_ticket") == 2

    def test_a_finished_run_has_nothing_pending_and_a_branching_one_says_so(self, sandbox):
        run = drive(start("test.reply", REPLY_INPUT))
        assert run.status == "succeeded"
        assert rehydration_document(run)["pending_steps"] == []
        branching = workflows.Workflow(
            "test.pending_branch",
            1,
            [
                workflows.compute("a", lambda ctx: 1, next=lambda ctx: "c"),
                workflows.compute("b", lambda ctx: 2),
                workflows.approval("c", reason="look"),
            ],
        )
        workflows.register(branching, replace=True)
        run = drive(start("test.pending_branch", {}))
        doc = rehydration_document(run)
        assert doc["current_step"]["name"] == "c"
        assert doc["pending_steps"] == [] and doc["pending_steps_exact"] is True
        run2, _ = engine.start_run("test.pending_branch", {}, business_key="pending-2")
        doc = rehydration_document(Run.objects.get(pk=run2.pk))
        assert [s["name"] for s in doc["pending_steps"]] == ["a", "b", "c"]
        assert doc["pending_steps_exact"] is False  # "a" chooses its next step at run time

    def test_the_rehydration_document_has_every_field_from_the_seed(self, sandbox):
        run = drive(start("test.refund", {"amount": 150, "payment": "pay_1"}))
        doc = rehydration_document(run)
        for key in ("run_id", "current_stage", "latest_checkpoint", "input_snapshot_ref",
                    "awaited_event_type", "timer_deadline", "external_resource_ids",
                    "executed_side_effect_keys", "human_decisions", "failure_count",
                    "escalation"):  # fmt: skip
            assert key in doc
        assert doc["current_step"]["name"] == "approve"
        assert doc["escalation"]["queue"] == "support"
        # What resuming will do: the declared steps after the approval, with tools and stages.
        assert doc["pending_steps"] == [
            {"name": "refund", "kind": "side_effect", "tool": "payments.refund",
             "stage": "refund"},
            {"name": "settlement", "kind": "wait_event", "tool": None, "stage": "settlement"},
        ]  # fmt: skip
        assert doc["pending_steps_exact"] is True
        import json

        json.dumps(doc)


class TestUnknownOutcome:
    def test_lookup_by_key_turns_a_half_success_into_a_commit(self, sandbox):
        sandbox.inject("mail", "commit_then_500", action="send")
        run = drive(start("test.reply", REPLY_INPUT))
        assert run.status == "succeeded"
        assert len(sandbox.ledger(system="mail", run=str(run.pk))) == 1
        effect = SideEffect.objects.get(run=run, tool="mail.send")
        assert effect.confirmed_by == "reconcile"

    def test_lookup_saying_not_found_leads_to_a_resend_with_the_same_key(self, sandbox):
        sandbox.inject("mail", "timeout_before_commit", action="send", seconds=3)
        run = drive(start("test.reply", REPLY_INPUT))
        assert run.status == "running"  # retry scheduled after the lookup said "not found"
        make_due(run)
        run = drive(run)
        assert run.status == "succeeded"
        ledger = sandbox.ledger(system="mail", run=str(run.pk))
        assert len(ledger) == 1 and ledger[0]["idempotency_key"] == f"tp-{run.pk}-send_reply"

    def test_nothing_found_while_the_request_may_be_in_flight_is_not_resent(self, sandbox):
        # The call times out after 1 s but the mail system commits after 1.5 s. A lookup at 1 s
        # finds nothing; resending then would send twice. The engine asks again later instead.
        sandbox.inject("mail", "latency", action="send", latency_ms=1500)
        run = drive(start("test.reply", REPLY_INPUT))
        step = Step.objects.get(run=run, name="send_reply")
        assert step.status == "retry_scheduled"
        assert "in flight" in step.last_error
        assert SideEffect.objects.get(step=step).status == "unknown"
        # The late commit lands at the sandbox (waited for, not slept for: under load it can
        # take longer than the 0.5 s the clock would promise).
        wait_for(lambda: sandbox.ledger(system="mail", run=str(run.pk)), what="the late commit")
        make_due(run)
        run = drive(run)
        assert run.status == "succeeded"
        assert len(sandbox.ledger(system="mail", run=str(run.pk))) == 1
        assert SideEffect.objects.get(step=step).confirmed_by == "reconcile"

    def test_a_lookup_that_cannot_be_answered_is_asked_again_not_escalated(self, sandbox):
        # The write landed, and the mail system then cannot answer the lookup (503): no evidence
        # either way, so the engine asks again later instead of resending or escalating.
        sandbox.inject("mail", "commit_then_500", action="send")
        sandbox.inject("mail", "503", action="by-key")
        run = drive(start("test.reply", REPLY_INPUT))
        step = Step.objects.get(run=run, name="send_reply")
        assert step.status == "retry_scheduled" and run.status == "running"
        assert "side_effect.lookup_failed" in verbs(run)
        make_due(run)
        run = drive(run)
        assert run.status == "succeeded"
        assert len(sandbox.ledger(system="mail", run=str(run.pk))) == 1
        assert SideEffect.objects.get(step=step).confirmed_by == "reconcile"

    def test_a_deduping_system_is_simply_asked_again(self, sandbox):
        sandbox.inject("tickets", "commit_then_500", action="update")
        run = drive(start("test.reply", REPLY_INPUT))
        make_due(run)
        run = drive(run)
        assert run.status == "succeeded"
        assert len(sandbox.ledger(system="tickets", run=str(run.pk))) == 1

    def test_without_lookup_or_dedupe_a_person_decides(self, sandbox, support_user):
        sandbox.inject("crm", "commit_then_500", action="create")
        run = drive(start("test.lead", {"email": "lee@example.com", "name": "Lee"}))
        assert run.status == "needs_human"
        assert run.queue == "support"
        step = Step.objects.get(run=run, name="create_contact")
        assert step.status == "unknown_outcome"
        assert "may or may not" in step.last_error
        assert SideEffect.objects.get(step=step).status == "unknown"
        assert len(sandbox.ledger(system="crm", run=str(run.pk))) == 1  # never a silent retry
        contact_id = sandbox.ledger(system="crm", run=str(run.pk))[0]["external_id"]
        actions.confirm_outcome(step.pk, support_user, happened=True, proof=contact_id)
        run = drive(run)
        assert run.status == "succeeded"
        assert len(sandbox.ledger(system="crm", run=str(run.pk))) == 1
        assert HumanDecision.objects.get(run=run).verb == "confirm_happened"

    def test_confirmed_not_happened_retries_with_the_same_key(self, sandbox, support_user):
        sandbox.inject("crm", "timeout_before_commit", action="create", seconds=3)
        run = drive(start("test.lead", {"email": "lee@example.com", "name": "Lee"}))
        step = Step.objects.get(run=run, name="create_contact")
        assert step.status == "unknown_outcome"
        assert sandbox.ledger(system="crm", run=str(run.pk)) == []
        actions.confirm_outcome(step.pk, support_user, happened=False)
        run = drive(run)
        assert run.status == "succeeded"
        ledger = sandbox.ledger(system="crm", run=str(run.pk))
        assert len(ledger) == 1 and ledger[0]["idempotency_key"] == step.idempotency_key

    def test_an_intent_left_by_a_crashed_worker_is_reconciled(self, sandbox):
        # The worker wrote snapshot + intent and died before it could call: the lease expires,
        # the next claim finds the `intended` row, asks the mail system, and sends once.
        run = start("test.reply", REPLY_INPUT)
        for _ in range(2):
            claim = engine.claim_next(run.pk)
            engine.record_outcome(claim, engine.execute(claim))
        claim = engine.claim_next(run.pk, worker="doomed")
        assert claim.step.name == "send_reply"
        tool = tools.get("mail.send")
        params = calls.build_params(claim, tool)
        ledger.write_intent(claim, tool, params, engine.idempotency_key_for(claim.step))
        Step.objects.filter(pk=claim.step.pk).update(lease_expires_at=later(seconds=-1))
        SideEffect.objects.filter(run=run).update(attempted_at=later(hours=-1))
        run = drive(run)
        assert run.status == "succeeded"
        assert len(sandbox.ledger(system="mail", run=str(run.pk))) == 1
        assert "step.lease_reclaimed" in verbs(run)
        assert "side_effect.unknown" in verbs(run)


class TestFailureRoutes:
    def test_transient_errors_are_retried_with_backoff(self, sandbox):
        sandbox.inject("mail", "429", action="send", count=2)
        run = drive(start("test.reply", REPLY_INPUT))
        step = Step.objects.get(run=run, name="send_reply")
        assert step.status == "retry_scheduled"
        assert step.next_attempt_at > timezone.now()
        assert step.routing["rule"] == "Retry transient errors"
        for _ in range(2):
            make_due(run)
            run = drive(run)
        assert run.status == "succeeded"
        assert Step.objects.get(pk=step.pk).attempts == 3
        assert len(sandbox.ledger(system="mail", run=str(run.pk))) == 1

    def test_retries_that_run_out_escalate(self, sandbox):
        EscalationRuleFactory(position=1, failure_class="transient", action="retry",
                              max_attempts=2, queue="ops")  # fmt: skip
        sandbox.inject("mail", "503", action="send", count=-1)
        run = drive(start("test.reply", REPLY_INPUT))
        make_due(run)
        run = drive(run)
        assert run.status == "needs_human"
        assert run.attention_reason.startswith("Gave up after 2 attempts")
        assert sandbox.ledger(system="mail", run=str(run.pk)) == []

    def test_an_outage_waits_probes_and_escalates_when_it_outlasts_the_window(self, sandbox):
        sandbox.inject("mail", "outage", seconds=600)
        run = drive(start("test.reply", REPLY_INPUT))
        assert run.status == "waiting"
        step = Step.objects.get(run=run, name="send_reply")
        assert step.status == "waiting" and step.error_class == "outage"
        wait = Wait.objects.get(step=step, kind="tool_recovery")
        # A probe before the window closes: still down, still waiting.
        report = engine.sweep(now=later(seconds=31))
        assert report.tool_probes == 1
        run = drive(run)
        assert run.status == "waiting"
        # The window closes: escalate.
        Wait.objects.filter(pk=wait.pk).update(due_at=later(seconds=-1))
        engine.sweep(now=later(seconds=61))
        run = drive(run)
        assert run.status == "needs_human"
        assert "wait window" in run.attention_reason
        assert sandbox.ledger(system="mail", run=str(run.pk)) == []

    def test_an_outage_that_ends_within_the_window_resumes(self, sandbox):
        sandbox.inject("mail", "outage", seconds=600)
        run = drive(start("test.reply", REPLY_INPUT))
        sandbox.clear_faults()
        engine.sweep(now=later(seconds=31))
        run = drive(run)
        assert run.status == "succeeded"
        assert len(sandbox.ledger(system="mail", run=str(run.pk))) == 1
        assert Wait.objects.get(run=run, kind="tool_recovery").status == "resolved"

    def test_a_stopped_system_is_an_outage_not_a_duplicate(self, sandbox_process, sandbox):
        sandbox_process.stop()
        try:
            run = drive(start("test.reply", REPLY_INPUT))
        finally:
            sandbox_process.start()
        assert run.status == "waiting"
        assert Step.objects.get(run=run, name="customer").error_class == "outage"

    def test_invalid_input_goes_to_a_person(self, sandbox):
        run = drive(start("test.reply", {**REPLY_INPUT, "ticket": ""}))
        assert run.status == "needs_human"
        step = Step.objects.get(run=run, name="close_ticket")
        assert step.error_class == FailureClass.INVALID_INPUT
        assert "422" in step.last_error
        assert run.queue == "support"

    def test_missing_scope_is_a_permission_failure_before_any_call(self, sandbox):
        run = drive(start("test.reply", REPLY_INPUT, scopes=["tickets:write"]))
        assert run.status == "needs_human"
        assert run.queue == "admin"
        assert Step.objects.get(run=run, name="send_reply").error_class == "permission"
        assert sandbox.ledger(system="mail") == []

    def test_a_failing_read_degrades_to_its_fallback(self, sandbox):
        EscalationRuleFactory(position=1, tool="kb.search", action="degrade")
        sandbox.inject("kb", "503", action="search", count=-1)
        run = drive(start("test.kb", {"q": "refund policy"}))
        assert run.status == "succeeded"
        step = Step.objects.get(run=run, name="search")
        assert step.status == "degraded"
        assert step.result["fallback_tool"] == "kb.faq"

    def test_the_fail_action_fails_the_run(self, sandbox):
        EscalationRuleFactory(position=1, failure_class="invalid_input", action="fail")
        run = drive(start("test.reply", {**REPLY_INPUT, "ticket": ""}))
        assert run.status == "failed"

    def test_the_compensate_action_undoes_committed_effects(self, sandbox):
        EscalationRuleFactory(position=1, workflow="test.refund", step="settlement",
                              failure_class="timeout", action="compensate")  # fmt: skip
        run = drive(start("test.refund", {"amount": 50, "payment": "pay_9"}))
        assert run.status == "waiting"
        engine.sweep(now=later(hours=2))
        run = drive(run)
        assert run.status == "compensated"
        assert len(sandbox.ledger(system="payments", run=str(run.pk))) == 2  # refund + void
        refund = SideEffect.objects.get(run=run, tool="payments.refund")
        assert refund.status == "compensated" and refund.compensation_key

    def test_every_routing_decision_names_its_rule(self, sandbox):
        sandbox.inject("mail", "429", action="send")
        run = drive(start("test.reply", REPLY_INPUT))
        event = TimelineEvent.objects.get(run=run, verb="step.retry_scheduled")
        assert event.data["routing"]["rule"] == "Retry transient errors"
        assert event.data["routing"]["failure_class"] == "transient"
        assert event.data["routing"]["version"] == 1

    def test_a_rule_edit_takes_effect_without_restart(self, sandbox):
        rule = EscalationRule.objects.get(name="Retry transient errors")
        rule.action = "fail"
        rule.save()
        sandbox.inject("mail", "429", action="send")
        run = drive(start("test.reply", REPLY_INPUT))
        assert run.status == "failed"


class TestIdempotencyKeys:
    def test_the_same_key_with_other_parameters_is_a_hard_error(self, sandbox):
        run = start("test.reply", REPLY_INPUT)
        for _ in range(2):
            claim = engine.claim_next(run.pk)
            engine.record_outcome(claim, engine.execute(claim))
        claim = engine.claim_next(run.pk)
        tool = tools.get("mail.send")
        key = engine.idempotency_key_for(claim.step)
        ledger.write_intent(claim, tool, {"to": "x@example.com", "subject": "s", "body": "b"}, key)
        SideEffect.objects.filter(idempotency_key=key).update(status="not_committed")
        engine.record_outcome(claim, engine.execute(claim))
        run.refresh_from_db()
        assert run.status == "needs_human"
        assert "other parameters" in Step.objects.get(run=run, name="send_reply").last_error
        assert sandbox.ledger(system="mail") == []
        assert "side_effect.key_conflict" in verbs(run)


class TestApprovalsWaitsAndEvents:
    def test_small_refunds_need_no_approval(self, sandbox):
        run = drive(start("test.refund", {"amount": 20, "payment": "pay_1"}))
        assert run.status == "waiting"
        assert steps(run)[("approve", 0)].result["decision"] == "not_required"

    def test_an_approval_with_edits_flows_into_the_side_effect(self, sandbox, support_user):
        run = drive(start("test.refund", {"amount": 150, "payment": "pay_1"}))
        assert run.status == "needs_human"
        approval = ApprovalRequest.objects.get(run=run)
        assert approval.proposed_params == {"payment_id": "pay_1", "amount": 150}
        assert approval.due_at is not None
        actions.decide_approval(approval.pk, support_user, "approved_with_edits",
                               edited_params={"payment_id": "pay_1", "amount": 80.0})  # fmt: skip
        run = drive(run)
        assert run.status == "waiting"
        ledger = sandbox.ledger(system="payments", run=str(run.pk))
        assert len(ledger) == 1 and ledger[0]["request"]["amount"] == 80.0
        refund_id = ledger[0]["external_id"]
        assert (
            engine.deliver_event("evt-1", "payment.settled", refund_id, {"ok": True}) == "resumed"
        )
        assert engine.deliver_event("evt-1", "payment.settled", refund_id, {"ok": True}) == (
            "duplicate")  # fmt: skip
        run = drive(run)
        assert run.status == "succeeded"
        decision = HumanDecision.objects.get(run=run)
        assert decision.before["amount"] == 150
        assert decision.after["diff"] == {"amount": [150, 80.0]}

    def test_a_second_decision_loses_and_is_told_who_won(self, sandbox, support_user, admin_user):
        run = drive(start("test.refund", {"amount": 150, "payment": "pay_1"}))
        approval = ApprovalRequest.objects.get(run=run)
        actions.decide_approval(approval.pk, support_user, "approved")
        with pytest.raises(actions.DecisionConflict, match="sam-support"):
            actions.decide_approval(approval.pk, admin_user, "rejected")

    def test_rejecting_before_any_effect_cancels(self, sandbox, support_user):
        run = drive(start("test.refund", {"amount": 150, "payment": "pay_1"}))
        approval = ApprovalRequest.objects.get(run=run)
        actions.decide_approval(approval.pk, support_user, "rejected", comment="fraud")
        run.refresh_from_db()
        assert run.status == "cancelled"
        assert sandbox.ledger(system="payments") == []

    def test_an_early_callback_is_not_lost(self, sandbox):
        run = start("test.refund", {"amount": 20, "payment": "pay_1"})
        for _ in range(3):  # facts, approve (not required), refund
            claim = engine.claim_next(run.pk)
            engine.record_outcome(claim, engine.execute(claim))
        refund_id = SideEffect.objects.get(run=run).external_id
        assert engine.deliver_event("evt-early", "payment.settled", refund_id, {"n": 1}) == "stored"
        run = drive(run)
        assert run.status == "succeeded"
        assert steps(run)[("settlement", 0)].result == {"n": 1}

    def test_a_wait_that_times_out_goes_to_a_person(self, sandbox):
        run = drive(start("test.refund", {"amount": 20, "payment": "pay_1"}))
        report = engine.sweep(now=later(hours=2))
        assert report.waits_timed_out == 1
        run.refresh_from_db()
        assert run.status == "needs_human"
        assert "No payment.settled event" in run.attention_reason

    def test_a_timer_wakes_the_run(self):
        run = drive(start("test.timer", {}))
        assert run.status == "waiting"
        assert engine.sweep(now=later(minutes=1)).timers_fired == 0
        assert engine.sweep(now=later(minutes=6)).timers_fired == 1
        run = drive(run)
        assert run.status == "succeeded"
        assert run.result == 2


class TestDefinitions:
    @pytest.mark.parametrize(("n", "path"), [(20, ["decide", "big"]), (1, ["decide", "small"])])
    def test_branching_follows_the_next_function(self, n, path):
        run = drive(start("test.branch", {"n": n}))
        assert run.status == "succeeded"
        assert [s.name for s in Step.objects.filter(run=run).order_by("position")] == path

    def test_agent_steps_are_appended_at_run_time_and_replay_safely(self, sandbox):
        run = drive(start("test.agent", {"mails": 3}))
        assert run.status == "succeeded"
        calls = Step.objects.filter(run=run, name="tool_call").order_by("iteration")
        assert [s.iteration for s in calls] == [0, 1, 2]
        assert all(s.spec["dynamic"] for s in calls)
        assert len(sandbox.ledger(system="mail", run=str(run.pk))) == 3
        Step.objects.filter(run=run, name="tool_call").update(status="pending")
        Run.objects.filter(pk=run.pk).update(status="running")
        drive(run)
        assert len(sandbox.ledger(system="mail", run=str(run.pk))) == 3

    def test_dynamic_compute_steps_are_recorded_and_not_recomputed(self):
        from tests.runs import flows

        flows.MODEL_CALLS.clear()
        run = drive(start("test.turns", {}))
        assert run.status == "succeeded" and run.result == {"say": "HELLO 1"}
        assert flows.MODEL_CALLS == ["hello 0", "hello 1"]
        Run.objects.filter(pk=run.pk).update(status="running")
        drive(run)
        assert flows.MODEL_CALLS == ["hello 0", "hello 1"]

    def test_a_run_whose_version_is_gone_goes_to_a_person(self):
        run = start("test.timer", {})
        Run.objects.filter(pk=run.pk).update(workflow_version=99)
        run = drive(run)
        assert run.status == "needs_human"
        assert "no longer registered" in run.attention_reason

    def test_idempotent_start_by_business_key(self):
        run, created = engine.start_run("test.timer", {"a": 1}, business_key="order-7")
        again, created_again = engine.start_run("test.timer", {"a": 1}, business_key="order-7")
        assert created and not created_again and again.pk == run.pk
        with pytest.raises(engine.BusinessKeyConflict):
            engine.start_run("test.timer", {"a": 2}, business_key="order-7")
        assert Run.objects.count() == 1

    def test_a_start_writes_what_the_model_verbs_would(self):
        # start_run writes the run and its run.created event as one statement (runs.batch);
        # the same run made by the ORM and TimelineEvent.append must be the same rows.
        from runs.audit import verify_chain

        run, _ = engine.start_run(
            "test.timer", {"b": [1, "é"], "a": 1}, business_key="k-1", principal="agent:x"
        )
        fast = Run.objects.get(pk=run.pk)
        slow = Run.objects.create(
            workflow=fast.workflow,
            workflow_version=fast.workflow_version,
            input=fast.input,
            input_digest=fast.input_digest,
            business_key="k-2",
            principal="agent:x",
            scopes=fast.scopes,
        )
        event = TimelineEvent.objects.get(run=fast)
        slow.record(event.verb, {**event.data, "business_key": "k-2"}, actor=event.actor)
        slow.refresh_from_db()
        skip = {"id", "business_key", "created_at", "updated_at", "event_hash"}
        fields = [f.attname for f in Run._meta.concrete_fields if f.attname not in skip]
        assert {f: getattr(fast, f) for f in fields} == {f: getattr(slow, f) for f in fields}
        assert (fast.event_seq, fast.event_hash) == (1, event.hash)
        assert fast.created_at == fast.updated_at == event.at
        assert event.data == {
            "workflow": "test.timer",
            "version": fast.workflow_version,
            "business_key": "k-1",
            "input_digest": fast.input_digest,
            "principal": "agent:x",
        }
        assert verify_chain(TimelineEvent.objects.filter(run=fast).order_by("seq")) == (True, "ok")
        assert run.event_hash == event.hash and not run._state.adding

    def test_a_start_refused_by_its_business_key_writes_nothing(self):
        engine.start_run("test.timer", {"a": 1}, business_key="order-8")
        with pytest.raises(engine.BusinessKeyConflict):
            engine.start_run("test.reply", REPLY_INPUT, business_key="order-8")
        assert Run.objects.count() == 1 and TimelineEvent.objects.count() == 1

    @pytest.mark.parametrize(("workflow", "input"), [("nope", {}), ("test.timer", [1, 2])])
    def test_a_bad_start_writes_nothing(self, workflow, input):
        with pytest.raises(engine.StartError):
            engine.start_run(workflow, input)
        assert Run.objects.count() == 0 and TimelineEvent.objects.count() == 0

    def test_a_lost_message_is_found_by_the_sweeper(self):
        run = start("test.timer", {})
        assert engine.sweep().stale_runs == 0
        report = engine.sweep(now=later(seconds=settings.TASKPILOTS["STALE_RUN_SECONDS"] + 1))
        assert report.stale_runs == 1 and run.pk in report.enqueued

    def test_the_timeline_chain_of_a_run_verifies(self, sandbox):
        from runs.audit import verify_chain

        run = drive(start("test.reply", REPLY_INPUT))
        assert verify_chain(TimelineEvent.objects.filter(run=run).order_by("seq")) == (True, "ok")


def test_workflow_definitions_are_validated():
    with pytest.raises(workflows.WorkflowError):
        workflows.Workflow("x", 1, [])
    with pytest.raises(workflows.WorkflowError):
        workflows.side_effect("s", "", params=lambda ctx: {})


def test_heavy_registrations_load_on_first_use():
    # The demo agent pulls in openai-agents and mcp; processes import it only when a run of it
    # (or one of its tools) is first needed.
    import subprocess
    import sys

    code = (
        "import os, sys, django; os.environ['DJANGO_SETTINGS_MODULE'] = 'taskpilots.settings'; "
        "django.setup(); assert 'taskpilots.demo.agent' not in sys.modules; "
        "from runs import tools, workflows; workflows.get('demo.agent'); "
        "tools.get('mcp.sandbox.send_mail'); print('loaded')"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=settings.BASE_DIR)  # fmt: skip
    assert result.stdout.strip() == "loaded", result.stderr[-2000:]

"""Issue 18's figures, through the engine and the console: recoveries stopped by missing
metadata (by cause), takeover cost (handling time, actions, the person's answer to "did this
need an engineer?"), and duplicates after a resume."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from approvals import actions
from approvals.metrics import sketch
from approvals.metrics.dashboard import compute, seed_figures
from approvals.metrics.store import rollup
from approvals.metrics.window import parse_window
from approvals.models import ApprovalRequest, HumanDecision, Takeover
from runs import engine
from runs.models import Run, SideEffect, Step, TimelineEvent, Wait
from runs.verbs import Verb
from tests.approvals.console_helpers import approval_run, fast_passwords, fresh, start  # noqa: F401
from tests.approvals.test_metrics import parse_prometheus
from tests.factories import SideEffectFactory, SnapshotFactory

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "run-main"}


def seed(*runs) -> dict:
    return seed_figures([run.pk for run in runs])


def test_recoveries_stopped_by_missing_metadata_are_counted_by_cause():
    # The deployment no longer has the run's workflow version when its timer fires.
    gone = start("test.timer", {})
    Run.objects.filter(pk=gone.pk).update(workflow_version=99)
    engine.sweep(now=timezone.now() + timedelta(minutes=6))
    gone = engine.run_until_quiet(gone.pk)
    # The run's recorded step is no longer in the workflow (renamed in a new deployment).
    renamed = start("test.timer", {})
    Step.objects.filter(run=renamed, name="pause").update(name="pause_v0", status="pending")
    Wait.objects.filter(run=renamed).update(status="cancelled")
    Run.objects.filter(pk=renamed.pk).update(status="running")
    renamed = engine.run_until_quiet(renamed.pk)
    # The run is runnable but its step waits on a wait that no longer exists.
    orphan = start("test.timer", {})
    Wait.objects.filter(run=orphan).update(status="cancelled")
    Run.objects.filter(pk=orphan.pk).update(status="running")
    orphan = engine.run_until_quiet(orphan.pk)
    # A person needed for an ordinary reason (an approval) is not a missing-metadata failure.
    ordinary = approval_run()

    for run in (gone, renamed, orphan, ordinary):
        assert fresh(run).status == "needs_human"
    causes = [
        e.data.get("cause")
        for e in TimelineEvent.objects.filter(verb=Verb.RUN_NEEDS_HUMAN).order_by("at")
    ]
    assert causes == [
        "workflow_not_registered",
        "step_not_in_workflow",
        "nothing_to_wait_for",
        None,
    ]

    figure = seed(gone, renamed, orphan, ordinary)["recovery_failed_missing_metadata"]
    assert figure["value"] == 3
    assert figure["extra"] == {
        "total": 3,
        "by_cause": {
            "workflow_not_registered": 1,
            "step_not_in_workflow": 1,
            "nothing_to_wait_for": 1,
        },
    }
    # Stored by the rollup, the same.
    rollup(now=timezone.now() + timedelta(minutes=2))
    window = compute(parse_window({"window": "24h"}))
    stored = {f.key: f for f in window.figures}["recovery_failed_missing_metadata"]
    assert stored.extra["by_cause"] == figure["extra"]["by_cause"]


def _post(client, run, action, **data):
    run = fresh(run)
    body = {"expected_version": run.lock_version, **data}
    return client.post(reverse("console:run-action", args=[run.pk, action]), body, **HTMX)


def test_a_takeover_released_with_yes_shows_in_every_metrics_view(
    client, support_user, admin_user, monkeypatch
):
    run = approval_run()
    client.force_login(support_user)
    assert _post(client, run, "take_over").status_code == 200
    approval = ApprovalRequest.objects.get(run=run, status="pending")
    assert _post(client, run, "approve", approval=approval.pk).status_code == 200
    # The answer is required: a release without it is refused and changes nothing.
    refused = _post(client, run, "release")
    assert refused.status_code == 422
    assert "Say whether this run needed an engineer." in refused.content.decode()
    assert fresh(run).status == "taken_over"
    answered = _post(client, run, "release", needed_engineer="yes", engineer_note="db fix")
    assert answered.status_code == 200

    takeover = Takeover.objects.get(run=run)
    assert takeover.needed_engineer is True and takeover.engineer_note == "db fix"
    decision = HumanDecision.objects.get(run=run, verb="release")
    assert decision.after == {"needed_engineer": True, "engineer_note": "db fix"}
    ended = TimelineEvent.objects.get(run=run, verb=Verb.TAKEOVER_ENDED)
    assert ended.data["needed_engineer"] is True and ended.data["engineer_note"] == "db fix"

    handling = (takeover.ended_at - takeover.started_at).total_seconds()
    data = client.get("/console/metrics.json?window=24h").json()["figures"]
    time = data["takeover_handling_time"]
    assert time["value"] == pytest.approx(sketch.quantile([handling], 0.5), rel=1e-3)
    # One action during the takeover: the approval (take over and release are not counted).
    assert time["extra"]["count"] == 1 and time["extra"]["actions"] == 1
    assert time["extra"]["p90"] == pytest.approx(sketch.quantile([handling], 0.9), rel=1e-3)
    engineer = data["takeovers_needing_engineer"]
    assert engineer["value"] == 1.0 and engineer["counts"] == [1, 1]
    assert engineer["extra"]["count"] == 1
    page = client.get("/console/metrics/").content.decode()
    assert 'id="m-takeover_handling_time"' in page
    assert 'id="m-takeovers_needing_engineer"' in page and "1 of 1" in page

    client.force_login(admin_user)
    families = parse_prometheus(client.get("/metrics").content.decode())
    released = {
        labels["needed_engineer"]: value
        for labels, value in families["taskpilots_takeovers_released_total"]["samples"]
    }
    assert released == {"yes": 1, "no": 0}
    assert families["taskpilots_takeovers_ended_total"]["samples"] == [({}, 1.0)]
    assert families["taskpilots_takeover_actions_total"]["samples"] == [({}, 1.0)]
    assert families["taskpilots_takeover_handling_seconds_total"]["help"]


def test_the_release_answer_is_required_by_the_action_itself(support_user):
    run = approval_run()
    actions.take_over(run.pk, support_user)
    with pytest.raises(actions.ActionRefused):
        actions.release(run.pk, support_user, needed_engineer=None)
    assert fresh(run).status == "taken_over"
    assert not HumanDecision.objects.filter(run=run, verb="release").exists()


def test_duplicates_are_attributed_to_the_resume_before_them(sandbox, support_user):
    # A refund approved by a person: the approval resumes the run, and the refund is sent
    # (the run then waits for the settlement).
    run = approval_run()
    approval = ApprovalRequest.objects.get(run=run, status="pending")
    actions.decide_approval(approval.pk, support_user, "approved")
    run = engine.run_until_quiet(run.pk)
    assert run.status == "waiting"
    assert len(sandbox.ledger(system="payments", run=str(run.pk))) == 1
    resumes = TimelineEvent.objects.filter(run=run, verb=Verb.RUN_RESUMED).count()
    assert resumes >= 1
    before = seed(run)["duplicates_after_resume"]
    assert before["extra"] == {"resumes": resumes, "resumes_with_duplicate": 0, "duplicates": 0}
    # The engine never commits a step twice on its own; the ledger learns of a second effect
    # under another key (as a person's edit-and-retry issues one) after that resume.
    step = Step.objects.get(run=run, kind="side_effect")
    first = SideEffect.objects.get(step=step)
    later = first.committed_at + timedelta(seconds=1)
    snapshot = SnapshotFactory(step=step, run=run, tool=step.tool, idempotency_key="dup-1")
    second = SideEffectFactory(snapshot=snapshot, status="committed", committed_at=later)
    SideEffect.objects.filter(pk=second.pk).update(attempted_at=later)
    figure = seed(run)["duplicates_after_resume"]
    assert figure["value"] == 1
    assert figure["counts"] == [1, resumes]
    assert figure["extra"] == {"resumes": resumes, "resumes_with_duplicate": 1, "duplicates": 1}
    # The global duplicate figure sees the same step.
    assert seed(run)["duplicate_side_effect_rate"]["counts"] == [1, 1]

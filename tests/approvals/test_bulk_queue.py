"""Reassigning to a queue: runs waiting for a person handed to another team's queue, one by one
or in bulk. The run's version moves (a page showing the old queue is stale), the decision and
`run.requeued` say from where to where, and the new queue's channels are told."""

from __future__ import annotations

import pytest

from approvals import actions, bulk, notifications
from approvals.models import HumanDecision, NotificationChannel, NotificationDelivery
from approvals.models.bulk import BulkAction
from runs.api.models import ApiScope, PersonalToken
from runs.models import Run, TimelineEvent
from tests.approvals.bulk_helpers import outage_parked_runs
from tests.approvals.console_helpers import fresh
from tests.runs.test_api import Api, bearer

pytestmark = pytest.mark.django_db


@pytest.fixture
def support_channel(db):
    return NotificationChannel.objects.create(
        queue="support", kind="email", target="support@example.com"
    )


def test_bulk_reassign_to_a_queue_moves_waiting_runs_and_tells_that_queue(
    sandbox, support_user, support_channel
):
    first, second, taken = outage_parked_runs(sandbox, 3)
    actions.take_over(taken.pk, support_user)
    before = {r.pk: fresh(r).lock_version for r in (first, second)}
    job = bulk.preview(
        support_user, "reassign", {}, {"to_queue": "support", "comment": "mail team"}
    )
    items = {i.run_id: i for i in job.items.all()}
    assert items[first.pk].status == "pending"
    assert "Move it from queue ops to support" in items[first.pk].plan
    assert items[taken.pk].status == "skipped"
    assert "does not wait for a person" in items[taken.pk].reason

    bulk.start(job, support_user)
    assert bulk.execute(job.pk) == 2
    for run in (first, second):
        run = fresh(run)
        assert run.queue == "support" and run.status == "needs_human"
        assert run.lock_version == before[run.pk] + 1
        decision = HumanDecision.objects.get(run=run, verb="reassign")
        assert (decision.before, decision.after) == ({"queue": "ops"}, {"queue": "support"})
        assert decision.bulk_action_id == job.pk
        event = TimelineEvent.objects.get(run=run, verb="run.requeued")
        assert event.data == {"from_queue": "ops", "to_queue": "support", "reason": "mail team"}
    assert fresh(taken).queue == "ops"

    notifications.scan_timeline()
    told = NotificationDelivery.objects.filter(channel=support_channel, event="escalated")
    assert sorted(d.run_id for d in told) == sorted([first.pk, second.pk])

    # A second bulk action to the same queue finds them there already.
    again = bulk.preview(support_user, "reassign", {"queue": "support"}, {"to_queue": "support"})
    assert {i.status for i in again.items.all()} == {"skipped"}
    assert "in support already" in again.items.first().reason


@pytest.mark.parametrize(
    ("params", "field", "says", "code"),
    [
        ({"to_queue": "nowhere"}, "to_queue", "Unknown queue nowhere", "unknown_queue"),
        ({"to_queue": "support", "to": "sam-support"}, "to", "one of the two", "invalid"),
        ({}, "to", "one of the two", "invalid"),
    ],
)
def test_bad_reassign_targets_write_nothing(
    sandbox, support_user, support_channel, params, field, says, code
):
    outage_parked_runs(sandbox, 1)
    with pytest.raises(bulk.BulkError) as refused:
        bulk.preview(support_user, "reassign", {}, params)
    assert refused.value.field == field and says in str(refused.value)
    assert refused.value.code == code
    assert not BulkAction.objects.exists()


def test_the_single_action_refuses_what_it_cannot_do(sandbox, support_user, support_channel):
    (run,) = outage_parked_runs(sandbox, 1)
    with pytest.raises(actions.ActionRefused, match="in ops already"):
        actions.move_to_queue(run.pk, support_user, queue="ops")
    with pytest.raises(actions.ActionRefused, match="Unknown queue"):
        actions.move_to_queue(run.pk, support_user, queue="<b>x</b>")
    stale = fresh(run).lock_version
    actions.move_to_queue(run.pk, support_user, queue="support", expected_version=stale)
    with pytest.raises(actions.DecisionConflict):  # the page still showed the old version
        actions.move_to_queue(run.pk, support_user, queue="ops", expected_version=stale)
    actions.take_over(run.pk, support_user)
    with pytest.raises(actions.ActionRefused, match="waits for a person"):
        actions.move_to_queue(run.pk, support_user, queue="ops")
    assert HumanDecision.objects.filter(run=run, verb="reassign").count() == 1
    assert Run.objects.get(pk=run.pk).queue == "support"


def test_over_the_api(sandbox, support_user, support_channel):
    outage_parked_runs(sandbox, 2)
    _, issued = PersonalToken.issue(support_user, "ops scripts", ApiScope.values)
    api = Api(bearer(issued.token))
    body = {"action": "reassign", "to_queue": "support"}
    status, preview = api.post("/bulk-actions/preview", body)
    assert status == 200 and preview["counts"]["pending"] == 2, preview
    status, body = api.post("/bulk-actions/preview", {**body, "to_queue": "nowhere"})
    assert status == 422 and body["error"]["field"] == "to_queue", body
    # queues are data, as people are: a code of its own, which the schema check lets through
    assert body["error"]["code"] == "unknown_queue" and "support" in body["error"]["message"]


def test_the_run_page_hands_a_run_to_another_queue_or_person(
    client, sandbox, support_user, admin_user, support_channel
):
    from django.urls import reverse

    (run,) = outage_parked_runs(sandbox, 1)
    client.force_login(support_user)
    page = client.get(reverse("console:run-detail", args=[run.pk])).content.decode()
    assert 'data-action="reassign"' in page and '<option value="support">' in page
    url = reverse("console:run-action", args=[run.pk, "reassign"])
    version = fresh(run).lock_version
    both = client.post(url, {"expected_version": version, "to_queue": "support", "to": "x"})
    assert both.status_code == 422 and "one of the two" in both.content.decode()
    moved = client.post(url, {"expected_version": version, "to_queue": "support"})
    assert moved.status_code == 302
    assert fresh(run).queue == "support"
    # Taken over, it can be handed to another person instead.
    actions.take_over(run.pk, support_user)
    version = fresh(run).lock_version
    handed = client.post(url, {"expected_version": version, "to": admin_user.get_username()})
    assert handed.status_code == 302
    assert fresh(run).owner == admin_user
    assert HumanDecision.objects.filter(run=run, verb="reassign").count() == 2

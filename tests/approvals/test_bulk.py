"""Bulk actions (approvals/bulk.py): the preview freezes the set and says what happens to each
run or why it is skipped; execution acts once per run, skips a run that changed since the
preview, names the bulk action on every decision and timeline event; the console and API pages
validate their input and write nothing on bad input."""

from __future__ import annotations

import pytest
from django.urls import reverse

from approvals import actions, bulk
from approvals.models import HumanDecision, SoftClaim
from approvals.models.bulk import BulkAction, BulkActionItem
from runs import engine
from runs.api.models import ApiClient, ApiScope, PersonalToken
from runs.models import Run, TimelineEvent
from tests.approvals.bulk_helpers import outage_parked_runs
from tests.approvals.console_helpers import approval_run, fresh, unknown_outcome_run
from tests.factories import UserFactory
from tests.runs.test_api import Api, bearer

pytestmark = pytest.mark.django_db


def applied(run) -> int:
    return TimelineEvent.objects.filter(run=run, verb="bulk_action.applied").count()


def test_preview_freezes_the_set_and_execution_retries_each_run_once(sandbox, support_user):
    runs = outage_parked_runs(sandbox, 3)
    other = approval_run()
    job = bulk.preview(support_user, "retry", {"status": "inbox", "reason": "outage"}, {})
    items = list(job.items.order_by("position"))
    assert [i.run_id for i in items] == [r.pk for r in runs]  # the approval is not matched
    assert all(i.status == "pending" and "send_reply" in i.plan for i in items)
    assert [i.expected_version for i in items] == [r.lock_version for r in runs]
    assert not job.items.filter(run=other).exists()

    bulk.start(job, support_user)
    assert bulk.execute(job.pk) == 3
    assert bulk.execute(job.pk) == 0  # again: nothing left to do
    job.refresh_from_db()
    assert job.status == "done" and job.counts()["done"] == 3
    for run in runs:
        decision = HumanDecision.objects.get(run=run)
        assert decision.verb == "retry" and decision.bulk_action_id == job.pk
        assert applied(run) == 1
        event = TimelineEvent.objects.get(run=run, verb="bulk_action.applied")
        assert event.data["bulk_action"] == job.pk and event.data["decision"] == decision.pk
        assert engine.run_until_quiet(run.pk).status == "succeeded"
        assert len(sandbox.ledger(system="mail", run=str(run.pk))) == 1


def test_a_run_changed_since_the_preview_is_skipped_not_overwritten(sandbox, support_user):
    first, second = outage_parked_runs(sandbox, 2)
    job = bulk.preview(support_user, "retry", {"reason": "outage"}, {"comment": "provider back"})
    actions.take_over(first.pk, support_user)  # the run moves on after the preview
    bulk.start(job, support_user)
    bulk.execute(job.pk)
    item = job.items.get(run=first)
    assert item.status == "skipped" and "Changed since the preview" in item.reason
    assert fresh(first).status == "taken_over"
    assert not HumanDecision.objects.filter(run=first, bulk_action=job).exists()
    assert applied(first) == 0 and applied(second) == 1


def test_skip_reasons_in_the_preview(sandbox, support_user, admin_user):
    parked, taken = outage_parked_runs(sandbox, 2)
    actions.take_over(taken.pk, admin_user)
    approval = approval_run()
    job = bulk.preview(support_user, "retry", {"status": "inbox"}, {})
    reasons = {i.run_id: (i.status, i.reason) for i in job.items.all()}
    assert reasons[parked.pk] == ("pending", "")
    assert (
        reasons[taken.pk][0] == "skipped"
        and "alex-admin has taken this run over" in reasons[taken.pk][1]
    )
    assert reasons[approval.pk][0] == "skipped" and "approval" in reasons[approval.pk][1]


def test_cancel_is_for_admins_only(sandbox, support_user, admin_user):
    outage_parked_runs(sandbox, 1)
    with pytest.raises(actions.ActionForbidden):
        bulk.preview(support_user, "cancel", {}, {"comment": "outage"})
    assert not BulkAction.objects.exists()
    job = bulk.preview(admin_user, "cancel", {"reason": "outage"}, {"comment": "outage"})
    bulk.start(job, admin_user)
    bulk.execute(job.pk)
    assert job.items.get().status == "done"
    assert Run.objects.get(pk=job.items.get().run_id).status == "cancelled"


def test_bad_filters_and_parameters_write_nothing(support_user, auditor_user):
    for filters, params, action, field in [
        ({"colour": "red"}, {}, "retry", "colour"),
        ({"status": "succeeded"}, {}, "retry", "status"),
        ({"reason": "gremlins"}, {}, "retry", "reason"),
        ({"date_from": "yesterday"}, {}, "retry", "date_from"),
        ({}, {}, "explode", "action"),
        ({}, {}, "confirm_happened", "comment"),
        ({}, {}, "release", "needed_engineer"),
        ({}, {"to": "nobody"}, "reassign", "to"),
    ]:
        with pytest.raises(bulk.BulkError) as caught:
            bulk.preview(support_user, action, filters, params)
        assert caught.value.field == field
    with pytest.raises(actions.ActionForbidden):
        bulk.preview(auditor_user, "retry", {}, {})
    assert not BulkAction.objects.exists() and not BulkActionItem.objects.exists()


def test_confirm_happened_uses_the_systems_evidence_by_key(sandbox, support_user):
    from tests.runs.test_changed_result import key_of, parked_on_a_changed_result

    run, external_id = parked_on_a_changed_result(sandbox)  # payments can be asked by key
    filters = {"status": "needs_human", "tool": "payments.refund"}
    job = bulk.preview(support_user, "confirm_happened", filters, {"comment": "checked"})
    item = job.items.get()
    assert item.status == "pending", item.reason
    assert item.evidence == {"system": "payments", "key": key_of(run), "tool": "payments.refund",
                             "found": True, "id": external_id, "source": "lookup"}  # fmt: skip
    assert external_id in item.plan
    no = bulk.preview(support_user, "confirm_not_happened", filters, {"comment": "checked"})
    assert "it happened" in no.items.get().reason and no.items.get().status == "skipped"
    bulk.start(job, support_user)
    bulk.execute(job.pk)
    decision = HumanDecision.objects.get(run=run)
    assert decision.verb == "confirm_happened" and decision.proof == external_id
    assert decision.bulk_action_id == job.pk
    assert len(sandbox.ledger(system="payments", key=key_of(run))) == 1


def test_without_a_lookup_there_is_no_evidence_and_the_run_is_skipped(sandbox, support_user):
    unknown_outcome_run(sandbox)  # crm: lookup off by default
    job = bulk.preview(support_user, "confirm_not_happened", {}, {"comment": "checked"})
    item = job.items.get()
    assert item.status == "skipped" and "No evidence" in item.reason


def test_reassign_hands_taken_over_runs_to_another_person(sandbox, support_user, admin_user):
    (run,) = outage_parked_runs(sandbox, 1)
    actions.take_over(run.pk, support_user)
    job = bulk.preview(admin_user, "reassign", {"owner": ""}, {"to": "sam-support"})
    assert "already has it" in job.items.get().reason
    job = bulk.preview(support_user, "reassign", {}, {"to": "alex-admin"})
    bulk.start(job, support_user)
    bulk.execute(job.pk)
    run = fresh(run)
    assert run.status == "taken_over" and run.owner == admin_user
    assert HumanDecision.objects.get(run=run, verb="reassign").bulk_action_id == job.pk


def test_console_preview_then_execute(client, sandbox, support_user, settings):
    outage_parked_runs(sandbox, 2)
    client.force_login(support_user)
    page = client.get(reverse("console:bulk-new") + "?status=inbox&reason=outage&q=x")
    assert page.status_code == 200 and 'value="outage"' in page.content.decode()
    bad = client.post(reverse("console:bulk-preview"), {"action": "retry", "reason": "nope"})
    assert bad.status_code == 422 and "Unknown failure class" in bad.content.decode()
    assert not BulkAction.objects.exists()
    response = client.post(reverse("console:bulk-preview"), {"action": "retry", "reason": "outage"})
    job = BulkAction.objects.get()
    assert response.url == reverse("console:bulk-detail", args=[job.pk])
    text = client.get(response.url).content.decode()
    assert "2 runs will be acted on" in text and "Do it for 2 runs" in text
    client.post(reverse("console:bulk-execute", args=[job.pk]))
    job.refresh_from_db()
    assert job.status == "running"
    assert (
        "0 of 2 runs handled"
        in client.get(reverse("console:bulk-progress", args=[job.pk])).content.decode()
    )
    bulk.execute(job.pk)
    text = client.get(reverse("console:bulk-detail", args=[job.pk])).content.decode()
    assert "2 of 2 runs handled: 2 done" in text and "bulk-item--done" in text
    # The run's own pages name the bulk action: its events and its decisions.
    run_id = job.items.first().run_id
    decisions = ("decisions", f"as part of bulk action #{job.pk}")
    for tab, marker in (("events", "bulk_action.applied"), decisions):
        url = reverse("console:run-detail", args=[run_id]) + f"?tab={tab}"
        assert marker in client.get(url).content.decode(), tab


def test_console_refuses_cancel_to_support(client, support_user):
    client.force_login(support_user)
    response = client.post(reverse("console:bulk-preview"), {"action": "cancel", "comment": "x"})
    assert response.status_code == 403 and not BulkAction.objects.exists()


def preview_body(**fields) -> dict:
    return {"action": "retry", **fields}


def as_person(user, scopes=ApiScope.values) -> Api:
    _, issued = PersonalToken.issue(user, "ops scripts", scopes)
    return Api(bearer(issued.token))


def test_api_preview_execute_and_read(sandbox, support_user):
    outage_parked_runs(sandbox, 2)
    api = as_person(support_user)
    status, body = api.post("/bulk-actions/preview", preview_body(filters={"reason": "outage"}))
    assert status == 200, body
    assert body["counts"]["pending"] == 2 and body["status"] == "previewed"
    assert body["user"] == "sam-support"
    status, body = api.post(f"/bulk-actions/{body['id']}/execute", {})
    assert status == 200 and body["status"] == "running"
    status, again = api.post(f"/bulk-actions/{body['id']}/execute", {"user": "sam-support"})
    assert status == 409
    bulk.execute(body["id"])
    status, body = api.get(f"/bulk-actions/{body['id']}")
    assert status == 200 and body["status"] == "done" and body["counts"]["done"] == 2


def test_api_bad_input_is_422_and_writes_nothing(support_user):
    api = as_person(support_user)
    status, body = api.post("/bulk-actions/preview", preview_body(filters={"reason": "gremlins"}))
    assert status == 422 and body["error"]["field"] == "filters.reason", body
    status, body = api.post(
        "/bulk-actions/preview", preview_body(filters={"date_to": "2026-02-30"})
    )
    assert status == 422 and body["error"]["field"] == "filters.date_to", body
    status, body = api.post("/bulk-actions/preview", preview_body(filters={"colour": "red"}))
    assert status == 422
    status, body = api.post("/bulk-actions/preview", preview_body(action="cancel", comment="x"))
    assert status == 403
    assert not BulkAction.objects.exists()
    assert api.get("/bulk-actions/99")[0] == 404


def test_a_bulk_action_is_a_person_s_with_the_single_action_s_scopes(
    sandbox, support_user, admin_user
):
    # A client with approvals:write only (no runs:write) once cancelled runs in bulk by naming
    # an admin in the body.
    outage_parked_runs(sandbox, 1)
    _, credentials = ApiClient.issue("approver-bot", [ApiScope.APPROVALS_WRITE])
    bot = Api(bearer(credentials.token))
    body = preview_body(action="cancel", comment="x", user=admin_user.username)
    status, data = bot.post("/bulk-actions/preview", body)
    assert (status, data["error"]["code"]) == (403, "person_required")
    admin = as_person(admin_user, [ApiScope.APPROVALS_WRITE])
    status, data = admin.post("/bulk-actions/preview", preview_body(action="cancel", comment="x"))
    assert (status, data["error"]["code"]) == (403, "missing_scope")
    assert not BulkAction.objects.exists()
    status, data = as_person(admin_user).post(
        "/bulk-actions/preview", preview_body(action="cancel", comment="x")
    )
    assert status == 200 and data["counts"]["pending"] == 1


def test_a_bulk_action_skips_runs_someone_else_claimed(sandbox, support_user):
    runs = outage_parked_runs(sandbox, 2)
    other = UserFactory(username="pat", groups=["support"])
    SoftClaim.claim(runs[0], other, minutes=15)
    job = bulk.preview(support_user, "retry", {"reason": "outage"}, {})
    items = {item.run_id: item for item in job.items.all()}
    assert items[runs[0].pk].status == "skipped"
    assert "pat is handling this run" in items[runs[0].pk].reason
    assert items[runs[1].pk].status == "pending"
    # Told up front to act anyway, it does, as the single action does when told.
    job = bulk.preview(support_user, "retry", {"reason": "outage"}, {"despite_claims": True})
    assert job.counts()["pending"] == 2
    # A claim made after the preview is respected when the job runs.
    job = bulk.preview(support_user, "retry", {"reason": "outage"}, {})
    SoftClaim.claim(runs[1], other, minutes=15)
    bulk.start(job, support_user)
    bulk.execute(job.pk)
    assert job.items.get(run=runs[1]).status == "skipped"


def test_a_stale_running_job_is_enqueued_again(sandbox, support_user):
    from datetime import timedelta

    from django.utils import timezone

    outage_parked_runs(sandbox, 1)
    job = bulk.start(bulk.preview(support_user, "retry", {}, {}), support_user)
    assert bulk.resume_stale() == []
    assert bulk.resume_stale(now=timezone.now() + timedelta(seconds=bulk.STALE_SECONDS + 1)) == [
        job.pk
    ]


def test_preview_and_pages_cost_the_same_queries_for_more_runs(
    client, sandbox, support_user, query_count
):
    def costs(n):
        filters = {"status": "needs_human", "reason": "outage"}
        with query_count() as preview_queries:
            job = bulk.preview(support_user, "retry", filters, {})
        assert job.items.count() == n
        with query_count() as page_queries:
            assert client.get(reverse("console:bulk-detail", args=[job.pk])).status_code == 200
        bulk.start(job, support_user)
        bulk.execute(job.pk)
        with query_count() as result_queries:
            assert client.get(reverse("console:bulk-detail", args=[job.pk])).status_code == 200
        return len(preview_queries), len(page_queries), len(result_queries)

    client.force_login(support_user)
    bulk.can_act(support_user)  # the user's roles, read once and kept on the user object
    outage_parked_runs(sandbox, 1)
    one = costs(1)
    outage_parked_runs(sandbox, 3)  # the first one now runs: not matched again
    assert costs(3) == one


def test_an_action_that_breaks_fails_its_run_only(sandbox, support_user, monkeypatch):
    first, second = outage_parked_runs(sandbox, 2)
    job = bulk.start(bulk.preview(support_user, "retry", {}, {}), support_user)
    real = actions.retry_step

    def breaks_on_first(run_id, *args, **kwargs):
        if run_id == first.pk:
            raise RuntimeError("the mail adapter broke")
        return real(run_id, *args, **kwargs)

    monkeypatch.setattr(actions, "retry_step", breaks_on_first)
    bulk.execute(job.pk)
    failed = job.items.get(run=first)
    assert failed.status == "failed" and "the mail adapter broke" in failed.reason
    assert fresh(first).lock_version == failed.expected_version  # untouched
    assert not HumanDecision.objects.filter(run=first).exists() and applied(first) == 0
    assert job.items.get(run=second).status == "done"
    assert BulkAction.objects.get(pk=job.pk).status == "done"


def test_a_system_that_does_not_answer_gives_no_evidence(sandbox, support_user):
    from tests.runs.test_changed_result import parked_on_a_changed_result

    parked_on_a_changed_result(sandbox)
    sandbox.inject("payments", "503", action="by-key", count=-1)
    job = bulk.preview(support_user, "confirm_happened", {}, {"comment": "checked"})
    item = job.items.get()
    assert item.status == "skipped" and "No evidence" in item.reason and "503" in item.reason
    assert item.evidence["found"] is None


@pytest.mark.django_db(transaction=True)
def test_two_workers_on_the_same_job_act_on_each_run_once(sandbox, support_user):
    import threading

    from django.db import connection

    runs = outage_parked_runs(sandbox, 12)
    job = bulk.start(bulk.preview(support_user, "retry", {}, {}), support_user)
    handled = []

    def work():
        try:
            handled.append(bulk.execute(job.pk))
        finally:
            connection.close()

    threads = [threading.Thread(target=work) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sum(handled) == 12 and len(handled) == 2
    assert BulkAction.objects.get(pk=job.pk).status == "done"
    for run in runs:
        assert HumanDecision.objects.filter(run=run).count() == 1 and applied(run) == 1

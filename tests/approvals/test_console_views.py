"""Console pages: who may see them, what they show a person, and how they scale."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from approvals import actions
from runs.models import Run, Step
from tests.approvals.console_helpers import (  # noqa: F401  (fast_passwords is autouse)
    approval_run,
    fast_passwords,
    invalid_data_run,
    start,
    unknown_outcome_run,
    visible_text,
)
from tests.factories import RunFactory, StepFactory

pytestmark = pytest.mark.django_db

INBOX = "/console/"
RUNS = "/console/runs/"


def detail(run, **params):
    query = "&".join(f"{k}={v}" for k, v in params.items())
    return reverse("console:run-detail", args=[run.pk]) + (f"?{query}" if query else "")


# -- access ---------------------------------------------------------------------------------


@pytest.mark.parametrize("persona", ["support_user", "auditor_user", "admin_user"])
def test_every_role_reads_the_console(client, request, sandbox, persona):
    run = approval_run()
    client.force_login(request.getfixturevalue(persona))
    for path in (INBOX, RUNS, detail(run), detail(run, tab="rehydration")):
        assert client.get(path).status_code == 200, path
    raw = client.get(reverse("console:run-raw", args=[run.pk, "rehydration"]))
    assert raw.status_code == 200 and raw["Content-Type"] == "application/json"


def test_outsiders_get_403_and_it_is_logged(client, sandbox, outsider, caplog):
    run = approval_run()
    client.force_login(outsider)
    with caplog.at_level("WARNING", logger="taskpilots.console"):
        for path in (INBOX, RUNS, detail(run), reverse("console:run-raw", args=[run.pk, "input"])):
            assert client.get(path).status_code == 403, path
    assert caplog.text.count("console permission denied: user=olly-outsider") == 4


def test_anonymous_is_sent_to_log_in(client):
    response = client.get(INBOX)
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


def test_missing_runs_are_404_and_pages_refuse_post(client, support_user):
    client.force_login(support_user)
    assert client.get(f"/console/runs/{uuid.uuid4()}/").status_code == 404
    assert client.get("/console/runs/not-a-uuid/").status_code == 404
    assert client.post(INBOX).status_code == 405
    assert client.post(RUNS).status_code == 405
    assert client.post(f"/console/runs/{uuid.uuid4()}/").status_code == 405


def test_raw_parts_belong_to_the_run(client, sandbox, support_user):
    run, other = approval_run(), approval_run(payment="pay_2")
    client.force_login(support_user)
    step = Step.objects.get(run=other, name="facts")
    assert (
        client.get(reverse("console:run-raw-item", args=[run.pk, "step", step.pk])).status_code
        == 404
    )
    assert client.get(reverse("console:run-raw", args=[run.pk, "bogus"])).status_code == 404


# -- inbox ----------------------------------------------------------------------------------


def test_the_inbox_lists_runs_needing_a_person_most_urgent_first(client, sandbox, support_user):
    later = approval_run(payment="pay_later")
    urgent = approval_run(payment="pay_urgent")
    Run.objects.filter(pk=urgent.pk).update(attention_due_at=timezone.now() - timedelta(hours=1))
    start("test.refund", {"amount": 50, "payment": "pay_small"})  # no approval: not in the inbox
    client.force_login(support_user)
    response = client.get(INBOX)
    page = response.context["page"]
    assert [r.pk for r in page.object_list] == [urgent.pk, later.pk]
    assert page.object_list[0].reason == "approval"
    text = response.content.decode()
    assert "overdue" in text and "test.refund" in text
    assert response.context["counts"] == {"total": 2, "overdue": 1, "mine": 0, "unassigned": 2}


def test_inbox_filters(client, sandbox, support_user):
    approval = approval_run()
    unknown = unknown_outcome_run(sandbox)
    invalid = invalid_data_run()
    actions.take_over(invalid.pk, support_user)
    client.force_login(support_user)

    def listed(**params):
        response = client.get(INBOX, params)
        assert response.status_code == 200
        return {r.pk for r in response.context["page"].object_list}

    assert listed() == {approval.pk, unknown.pk, invalid.pk}
    assert listed(reason="approval") == {approval.pk}
    assert listed(reason="unknown_outcome") == {unknown.pk}
    assert listed(reason="invalid_input") == {invalid.pk}
    assert listed(workflow="test.lead") == {unknown.pk}
    assert listed(owner="mine") == {invalid.pk}
    assert listed(owner="unassigned") == {approval.pk, unknown.pk}
    assert listed(queue="support", reason="approval") == {approval.pk}


def test_htmx_refresh_returns_only_the_live_part(client, sandbox, support_user):
    approval_run()
    client.force_login(support_user)
    response = client.get(INBOX, HTTP_HX_REQUEST="true", HTTP_HX_TARGET="inbox-live")
    text = response.content.decode()
    assert text.lstrip().startswith('<section id="inbox-live"')
    assert "<html" not in text and 'hx-trigger="every 5s"' in text


def _bulk_inbox(n):
    now = timezone.now()
    runs = Run.objects.bulk_create(
        RunFactory.build(
            status="needs_human", queue="support", attention_reason="check",
            attention_due_at=now + timedelta(minutes=i), workflow="test.refund",
        )
        for i in range(n)
    )  # fmt: skip
    Step.objects.bulk_create(
        StepFactory.build(run=run, name="approve", position=1, kind="approval",
                          status="needs_human")
        for run in runs
    )  # fmt: skip


def test_the_inbox_costs_the_same_queries_for_10_or_600_runs(client, support_user):
    # The inbox must stay fast at 100k runs: a fixed number of queries per page, whatever the
    # size (the page query uses run_inbox_idx; the current step is one subquery per row).
    client.force_login(support_user)
    _bulk_inbox(10)
    client.get(INBOX)  # warm the session and the user
    from django.db import connection

    with CaptureQueriesContext(connection) as small:
        assert client.get(INBOX).status_code == 200
    _bulk_inbox(590)
    with CaptureQueriesContext(connection) as large:
        response = client.get(INBOX, {"page": 3})
    assert response.status_code == 200
    assert len(response.context["page"].object_list) == 25
    # 8 for the page, plus the incident view: its one grouped query, and two for the health
    # of the groups' tools when there are any (tests/approvals/test_incidents.py).
    assert len(large) == len(small) <= 11


def test_the_detail_page_costs_a_bounded_number_of_queries(client, sandbox, support_user):
    from django.db import connection

    run = approval_run()
    client.force_login(support_user)
    client.get(detail(run))
    with CaptureQueriesContext(connection) as queries:
        client.get(detail(run))
    assert len(queries) <= 14


# -- run list -------------------------------------------------------------------------------


def test_run_list_searches_by_id_key_workflow_status_and_date(client, sandbox, support_user):
    keyed = start("test.refund", {"amount": 50, "payment": "p"}, business_key="order-88412")
    approval = approval_run()
    client.force_login(support_user)

    def found(**params):
        return {r.pk for r in client.get(RUNS, params).context["page"].object_list}

    assert found(q=str(approval.pk)) == {approval.pk}
    # The short id lists show ("0e911daf…") finds the run too, with or without the ellipsis.
    short = str(approval.pk)[:8]
    assert found(q=f"{short}…") == {approval.pk} and found(q=short.upper()) == {approval.pk}
    assert found(q=str(approval.pk)[:13]) == {approval.pk}
    assert found(q="0123456") == set()  # too short to be an id's beginning: a business key's
    assert found(q="order-88412") == {keyed.pk}
    assert found(q="order-") == {keyed.pk}
    assert found(status="needs_human") == {approval.pk}
    assert found(workflow="test.refund") == {keyed.pk, approval.pk}
    today = timezone.localdate().isoformat()
    assert found(date_from=today, date_to=today) == {keyed.pk, approval.pk}
    assert found(date_to="2000-01-01") == set()
    assert client.get(RUNS, {"date_from": "nonsense"}).status_code == 200


# -- what a person sees on a paused run -----------------------------------------------------


def test_an_approval_shows_what_will_be_done_and_the_actions(client, sandbox, support_user):
    run = approval_run()
    client.force_login(support_user)
    response = client.get(detail(run))
    text = response.content.decode()
    assert "What will be done if you approve" in text
    assert "payments.refund" in text and "payment:pay_1" in text
    assert "Check the proposed payments.refund call" in visible_text(response)
    for action in ("approve", "approve_edits", "reject", "take_over", "cancel"):
        assert reverse("console:run-action", args=[run.pk, action]) in text
    assert f'name="expected_version" value="{run.lock_version}"' in text
    assert 'name="param__amount"' in text  # the edit form, built from params_schema
    # Steps: done, current, and the declared ones still to come.
    assert text.count("tl--done") == 1 and text.count("tl--current") == 1
    assert text.count("tl--upcoming") == 2 and "settlement" in text


def test_an_unknown_outcome_explains_what_to_check(client, sandbox, support_user):
    run = unknown_outcome_run(sandbox)
    client.force_login(support_user)
    text = client.get(detail(run)).content.decode()
    step = Step.objects.get(run=run, name="create_contact")
    assert "The CRM may have created this record" in text
    assert step.idempotency_key in text
    assert "Unknown outcome: a person confirms" in text  # the rule that routed it
    assert "confirm_happened" in text and "confirm_not_happened" in text
    assert reverse("console:run-action", args=[run.pk, "skip"]) not in text


def test_invalid_data_offers_fix_and_retry(client, sandbox, support_user):
    run = invalid_data_run()
    client.force_login(support_user)
    text = client.get(detail(run)).content.decode()
    assert "rejected the data it was given" in text
    for action in ("retry", "retry_edits", "skip", "complete"):
        assert reverse("console:run-action", args=[run.pk, action]) in text
    assert 'name="param__ticket_id"' in text


def test_an_outage_that_outlasted_its_window_suggests_retrying(client, sandbox, support_user):
    from runs import engine
    from runs.models import Wait

    sandbox.inject("mail", "outage", seconds=600)
    run = start("test.reply", {"message": "hi", "email": "a@example.com", "ticket": "T-1"})
    Wait.objects.filter(run=run, status="pending").update(due_at=timezone.now())
    engine.sweep(now=timezone.now() + timedelta(seconds=61))
    run = engine.run_until_quiet(run.pk)
    assert run.status == "needs_human"
    client.force_login(support_user)
    text = client.get(detail(run)).content.decode()
    assert "stayed down longer than rule" in text
    assert reverse("console:run-action", args=[run.pk, "retry"]) in text


def test_receipts_of_committed_side_effects_are_shown(client, sandbox, support_user):
    run = start("test.refund", {"amount": 50, "payment": "pay_9"})
    client.force_login(support_user)
    effect = run.side_effects.get()
    text = client.get(detail(run)).content.decode()
    assert "receipt--committed" in text and effect.external_id in text
    assert effect.idempotency_key in text


def test_auditors_see_everything_but_no_action_forms(client, sandbox, auditor_user):
    run = approval_run()
    client.force_login(auditor_user)
    text = client.get(detail(run)).content.decode()
    assert "your role cannot act on it" in text
    assert "/actions/" not in text


def test_others_see_who_took_a_run_over(client, sandbox, support_user, admin_user):
    run = approval_run()
    actions.take_over(run.pk, admin_user)
    client.force_login(support_user)
    response = client.get(detail(run))
    assert "alex-admin has taken this run over" in visible_text(response)
    assert "/actions/" not in response.content.decode()


def test_tabs_render_as_fragments(client, sandbox, support_user):
    run = approval_run()
    client.force_login(support_user)
    for tab, marker in (("rehydration", "input_snapshot_ref"), ("events", "run.created"),
                        ("decisions", "No person has acted")):  # fmt: skip
        response = client.get(detail(run, tab=tab), HTTP_HX_REQUEST="true",
                              HTTP_HX_TARGET="tab-panel")  # fmt: skip
        text = response.content.decode()
        assert text.lstrip().startswith('<section id="tab-panel"') and marker in text, tab


def test_a_running_run_polls_and_a_paused_one_does_not(client, sandbox, support_user):
    run = approval_run()
    client.force_login(support_user)
    # A paused run refreshes only when its live bar asks it to (tp-refresh); a running one polls.
    assert 'hx-trigger="tp-refresh"' in client.get(detail(run)).content.decode()
    Run.objects.filter(pk=run.pk).update(status="running")
    assert 'hx-trigger="every 2s, tp-refresh"' in client.get(detail(run)).content.decode()


def test_a_refund_shows_its_amount_with_the_currency(client, sandbox, support_user):
    run = start("refund.approval", {"payment_id": "pay_1", "amount": 1250})
    client.force_login(support_user)
    response = client.get(detail(run))
    assert "Amount 1,250.00 USD" in visible_text(response)
    assert '<label for="id_param__amount">amount (USD)</label>' in response.content.decode()
    # A call without a currency (the test workflow's) says so rather than letting a bare
    # number pass for money.
    bare = approval_run(payment="pay_2")
    text = visible_text(client.get(detail(bare)))
    assert "Amount 150.00 (no currency in the call: the payment system applies its default)" in (
        text
    )


def test_the_demo_refund_names_its_currency(sandbox, support_user):
    from approvals.models import ApprovalRequest

    run = start("refund.approval", {"payment_id": "pay_3", "amount": 250, "currency": "eur"})
    approval = ApprovalRequest.objects.get(run=run)
    assert approval.reason == "Refund of 250.00 EUR is above the 100 threshold"
    assert approval.proposed_params["currency"] == "EUR"

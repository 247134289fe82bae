"""The incident desk: the inbox's "Bulk action…" link carries the filters applied in place,
the inbox groups runs stopped by one cause (with the tool's health), and the bulk form opened
from a group or a filter previews exactly those runs."""

from __future__ import annotations

from datetime import timedelta
from urllib.parse import parse_qsl, urlparse

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals import bulk, incidents
from approvals.models import SoftClaim, ToolPause
from runs.models import Run, Step, Wait
from tests.approvals.bulk_helpers import outage_parked_runs
from tests.approvals.console_helpers import (  # noqa: F401  (fast_passwords is autouse)
    approval_run,
    fast_passwords,
    invalid_data_run,
    visible_text,
)
from tests.factories import RunFactory, StepFactory

pytestmark = pytest.mark.django_db

INBOX = "/console/"


def bulk_link(response) -> dict[str, str]:
    html = response.content.decode()
    start = html.index('class="btn btn--ghost bulk-link" href="') + len(
        'class="btn btn--ghost bulk-link" href="'
    )
    href = html[start : html.index('"', start)].replace("&amp;", "&")
    return dict(parse_qsl(urlparse(href).query))


def test_the_bulk_link_follows_filters_applied_in_place(client, sandbox, support_user):
    # The filters change by htmx (the form swaps #inbox-live): the link is inside the swapped
    # fragment, so it carries what the person now sees, not what the page was loaded with.
    outage = outage_parked_runs(sandbox, 2)
    approval_run()
    invalid_data_run()
    client.force_login(support_user)
    assert bulk_link(client.get(INBOX)) == {"status": "inbox"}
    response = client.get(
        INBOX, {"reason": "outage"}, HTTP_HX_REQUEST="true", HTTP_HX_TARGET="inbox-live"
    )
    filters = bulk_link(response)
    assert filters == {"status": "inbox", "reason": "outage"}

    form = client.get("/console/bulk/new/", filters)
    assert 'value="outage" selected' in form.content.decode()
    job = bulk.preview(support_user, "retry", filters, {})
    assert job.matched == 2
    assert sorted(i.run_id for i in job.items.all()) == sorted(r.pk for r in outage)


def test_the_bulk_link_keeps_the_unclaimed_filter(client, sandbox, support_user, admin_user):
    first, second = outage_parked_runs(sandbox, 2)
    SoftClaim.claim(first, admin_user, minutes=15)
    client.force_login(support_user)
    response = client.get(
        INBOX, {"owner": "unclaimed"}, HTTP_HX_REQUEST="true", HTTP_HX_TARGET="inbox-live"
    )
    filters = bulk_link(response)
    assert filters == {"status": "inbox", "owner": "unclaimed"}
    job = bulk.preview(support_user, "retry", filters, {})
    assert [i.run_id for i in job.items.all()] == [second.pk]


def test_a_bad_owner_filter_is_refused_and_writes_nothing(support_user):
    from approvals.models.bulk import BulkAction

    with pytest.raises(bulk.BulkError, match="owner is mine, unassigned or unclaimed"):
        bulk.preview(support_user, "retry", {"status": "inbox", "owner": "everyone"}, {})
    assert not BulkAction.objects.exists()


def test_the_inbox_groups_runs_stopped_by_one_cause(client, sandbox, support_user):
    outage = outage_parked_runs(sandbox, 3)
    approval_run()
    approval_run()
    invalid_data_run()
    client.force_login(support_user)
    response = client.get(INBOX)
    groups = response.context["incidents"]
    assert [(g.reason, g.tool, g.runs) for g in groups] == [("outage", "mail.send", 3)]
    text = visible_text(response)
    assert "3 runs stopped: mail.send System outage since" in text
    # Nothing has called mail.send since the runs gave up on it: the preview will ask.
    assert "Nothing has called the tool since" in text

    query = dict(parse_qsl(groups[0].bulk_query()))
    assert query == {"status": "inbox", "reason": "outage", "tool": "mail.send", "action": "retry"}
    query.pop("action")
    job = bulk.preview(support_user, "retry", query, {})
    assert sorted(i.run_id for i in job.items.all()) == sorted(r.pk for r in outage)


def test_tool_health_from_recovery_waits_and_pauses(sandbox, admin_user):
    run = RunFactory(status="waiting")
    step = StepFactory(run=run, kind="side_effect", tool="mail.send", status="waiting")
    wait = Wait.open(step, Wait.Kind.TOOL_RECOVERY, event_type="mail.send")
    health = incidents.tool_health(["mail.send", "crm.create"])
    assert health["mail.send"].state == "down" and health["mail.send"].since == wait.created_at
    assert health["crm.create"].state == "unknown"

    wait.resolve(None, by="probe")
    assert incidents.tool_health(["mail.send"])["mail.send"].state == "up"
    ToolPause.objects.create(tool="mail.send", reason="drill", paused_by=admin_user)
    assert incidents.tool_health(["mail.send"])["mail.send"].state == "paused"


def test_a_group_whose_tool_answered_again_offers_the_retry(client, sandbox, support_user):
    outage_parked_runs(sandbox, 2)
    # Another run probed mail.send after these failed and found it answering.
    later = RunFactory(status="running")
    step = StepFactory(run=later, kind="side_effect", tool="mail.send", status="running")
    wait = Wait.open(step, Wait.Kind.TOOL_RECOVERY, event_type="mail.send")
    Wait.objects.filter(pk=wait.pk).update(created_at=timezone.now() + timedelta(seconds=1))
    wait.resolve(None, by="probe")
    Wait.objects.filter(pk=wait.pk).update(resolved_at=timezone.now() + timedelta(seconds=2))
    client.force_login(support_user)
    text = visible_text(client.get(INBOX))
    assert "The tool answers again" in text and "Preview retry" in text


def test_the_live_check_asks_the_tool(sandbox):
    assert incidents.check_tool("mail.send").state == "up"
    sandbox.inject("mail", "outage", seconds=60)
    checked = incidents.check_tool("mail.send")
    assert checked.state == "down" and checked.detail
    sandbox.clear_faults()


def _parked(n, tool):
    runs = Run.objects.bulk_create(
        RunFactory.build(status="needs_human", workflow="test.reply") for _ in range(n)
    )
    Step.objects.bulk_create(
        StepFactory.build(run=run, name="send_reply", position=1, kind="side_effect",
                          tool=tool, status="needs_human", error_class="outage",
                          started_at=timezone.now())
        for run in runs
    )  # fmt: skip


def test_the_incident_view_costs_the_same_queries_for_any_number_of_runs_or_groups(
    client, support_user
):
    client.force_login(support_user)
    _parked(3, "mail.send")
    client.get(INBOX)
    with CaptureQueriesContext(connection) as small:
        client.get(INBOX)
    _parked(300, "mail.send")
    _parked(40, "crm.create")
    _parked(20, "tickets.update")
    with CaptureQueriesContext(connection) as large:
        response = client.get(INBOX)
    assert [g.runs for g in response.context["incidents"]] == [303, 40, 20]
    assert len(large) == len(small)


def test_the_grouping_reads_the_parked_steps_index(support_user):
    _parked(5, "mail.send")
    with connection.cursor() as cursor:
        cursor.execute("SET enable_seqscan = off")
        try:
            groups = Step.objects.filter(status__in=["needs_human", "unknown_outcome"])
            plan = groups.values("error_class", "tool").explain()
        finally:
            cursor.execute("SET enable_seqscan = on")
    assert "runs_step_parked_cause_idx" in plan


def test_outsiders_do_not_see_the_incident_view(client, outsider):
    client.force_login(outsider)
    assert client.get(INBOX).status_code == 403


def test_an_auditor_sees_incidents_without_the_bulk_links(client, sandbox, auditor_user):
    outage_parked_runs(sandbox, 2)
    client.force_login(auditor_user)
    response = client.get(INBOX)
    assert response.status_code == 200
    assert "bulk-link" not in response.content.decode()


def test_names_in_a_group_are_escaped(client, support_user):
    _parked(2, "<script>alert(1)</script>")
    client.force_login(support_user)
    html = client.get(INBOX).content.decode()
    assert "<script>alert(1)</script>" not in html and "&lt;script&gt;" in html

"""The consistency check compares committed side effects with the systems that hold them (asked
by key), not only with the ledger's own invariants: a record changed or removed out there is
recorded once, counted as `external_mismatches`, and alerted."""

from __future__ import annotations

import io
import json
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse
from django.utils import timezone

from approvals import notifications
from approvals.models import NotificationChannel, NotificationDelivery
from runs.engine.consistency import check_consistency
from runs.models import ConsistencyCursor, ExternalMismatch, SideEffect, TimelineEvent
from tests.approvals.console_helpers import fast_passwords  # noqa: F401  (autouse)
from tests.runs.test_engine import drive, start

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fast_tools(settings):
    settings.TASKPILOTS = {**settings.TASKPILOTS, "TOOL_TIMEOUT_SECONDS": 2.0}


def reply_runs(n):
    runs = []
    for i in range(n):
        run = drive(
            start(
                "test.reply",
                {"message": "Where is my refund?", "email": f"c{i}@example.com", "ticket": "T-1"},
            )
        )
        assert run.status == "succeeded"
        runs.append(run)
    return runs


def mail_key(run) -> str:
    return SideEffect.objects.get(run=run, tool="mail.send").idempotency_key


def mismatches_metric(client) -> int:
    return client.get(reverse("console:metrics-json")).json()["external_mismatches"]


def test_a_changed_record_is_recorded_once_counted_and_alerted(client, sandbox, admin_user):
    NotificationChannel.objects.create(queue="support", kind="email", target="oncall@example.com")
    runs = reply_runs(3)
    key = mail_key(runs[1])
    [record] = sandbox.ledger(system="mail", key=key)
    sandbox.alter("mail", key, response={**record["response"], "status": "bounced<b>"})

    report = check_consistency()
    # Three mails asked (the ticket system cannot be asked by key), one different.
    assert (report.checked, report.different, report.missing, report.recorded) == (3, 1, 0, 1)
    assert report.not_askable == 3 and report.wrapped
    mismatch = ExternalMismatch.objects.get()
    assert mismatch.run_id == runs[1].pk and mismatch.kind == "different"
    event = TimelineEvent.objects.get(verb="side_effect.external_mismatch")
    assert event.run_id == runs[1].pk and event.data["key"] == key
    assert event.data["recorded"]["digest"] != event.data["now"]["digest"]
    assert "bounced<b>" in event.data["now"]["shown"]

    assert notifications.scan_timeline() == 1
    delivery = NotificationDelivery.objects.get()
    assert delivery.event == "external_mismatch" and delivery.run_id == runs[1].pk
    assert key in delivery.payload["text"]

    client.force_login(admin_user)
    assert mismatches_metric(client) == 1
    page = client.get(reverse("console:metrics")).content.decode()
    item = page[page.index('data-kind="external_mismatches"') :]
    assert '<span class="now-count">1</span>' in item[: item.index("</div>")]
    scrape = client.get("/metrics").content.decode()
    assert "taskpilots_external_mismatches 1.0" in scrape
    assert 'taskpilots_state_inconsistencies{kind="external_mismatches"} 1.0' in scrape

    # A second pass sees the same mismatch: nothing new is recorded, counted or alerted.
    again = check_consistency()
    assert (again.checked, again.different, again.recorded) == (3, 1, 0)
    assert ExternalMismatch.objects.count() == 1
    assert TimelineEvent.objects.filter(verb="side_effect.external_mismatch").count() == 1
    assert notifications.scan_timeline() == 0
    assert mismatches_metric(client) == 1


def test_a_deleted_record_is_missing(sandbox):
    runs = reply_runs(2)
    sandbox.alter("mail", mail_key(runs[0]), delete=True)
    report = check_consistency()
    assert (report.missing, report.different, report.recorded) == (1, 0, 1)
    assert ExternalMismatch.objects.get().kind == "missing"


def test_a_mismatch_resolves_when_the_system_agrees_again(sandbox):
    [run] = reply_runs(1)
    key = mail_key(run)
    [record] = sandbox.ledger(system="mail", key=key)
    sandbox.alter("mail", key, response={"id": "msg_someone_else", "status": "sent"})
    assert check_consistency().recorded == 1
    sandbox.alter("mail", key, response=record["response"])
    report = check_consistency()
    assert report.resolved == 1 and report.different == 0
    assert ExternalMismatch.objects.get().resolved_at is not None
    assert TimelineEvent.objects.filter(verb="side_effect.external_matched").count() == 1


def test_a_pass_is_bounded_and_the_next_one_goes_on_from_the_cursor(sandbox):
    reply_runs(3)
    first = check_consistency(limit=2)
    assert first.checked + first.not_askable == 2 and not first.wrapped
    cursor = ConsistencyCursor.objects.get()
    assert cursor.position_id > 0
    rest = check_consistency(limit=10)
    assert rest.checked + rest.not_askable == 4 and rest.wrapped
    assert ConsistencyCursor.objects.get().position_id == 0  # the next pass starts over


def test_a_lookup_that_fails_records_nothing(sandbox):
    reply_runs(1)
    sandbox.inject("mail", "503", action="by-key")
    report = check_consistency()
    assert report.unanswered == 1 and report.recorded == 0
    assert not ExternalMismatch.objects.exists()


def test_the_command_reports_progress_and_refuses_bad_input(sandbox):
    reply_runs(1)
    out, err = io.StringIO(), io.StringIO()
    call_command("check_consistency", "--since", "2h", stdout=out, stderr=err)
    assert json.loads(out.getvalue())["checked"] == 1
    assert "checked 1:" in err.getvalue()
    with pytest.raises(CommandError, match="--since"):
        call_command("check_consistency", "--since", "yesterday-ish")
    with pytest.raises(CommandError, match="--limit"):
        call_command("check_consistency", "--limit", "0")
    # Outside the window: nothing older than --since is asked.
    later = (timezone.now() + timedelta(minutes=1)).isoformat()
    out = io.StringIO()
    call_command("check_consistency", "--since", later, stdout=out, stderr=io.StringIO())
    assert json.loads(out.getvalue())["checked"] == 0

"""Times on the console and audit pages: one format, in the viewer's time zone, with the zone.

The zone is the browser's (sent with the login form, or posted once by static/js/console.js),
kept in the session; UTC without it."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import pytest
from django.conf import settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from approvals import actions
from approvals.models import ApprovalRequest
from runs.models import Run
from tests.approvals.console_helpers import (  # noqa: F401  (fast_passwords is autouse)
    approval_run,
    fast_passwords,
    fresh,
)

pytestmark = pytest.mark.django_db

MOMENT = datetime(2026, 10, 14, 12, 11, 5, tzinfo=UTC)
TIME = re.compile(r'<time datetime="([^"]+)" title="([^"]+)">([^<]+)</time>')


def _at_one_moment(run):
    """The run started and asked for approval at the same moment (the issue's example)."""
    Run.objects.filter(pk=run.pk).update(created_at=MOMENT)
    ApprovalRequest.objects.filter(run=run).update(created_at=MOMENT)


def _times(html: str) -> list[tuple[str, str, str]]:
    return TIME.findall(html)


def test_the_same_moment_reads_the_same_everywhere_in_the_viewers_zone(
    client, sandbox, support_user
):
    run = approval_run()
    _at_one_moment(run)
    client.force_login(support_user)
    assert client.post(reverse("time-zone"), {"time_zone": "Asia/Shanghai"}).status_code == 204
    html = client.get(reverse("console:run-detail", args=[run.pk])).content.decode()
    shown = {text for instant, _zone, text in _times(html) if instant == "2026-10-14T12:11:05Z"}
    # "Started" and "Asked" (and the step's finish) were one moment: one text, with the zone.
    assert shown == {"2026-10-14 20:11:05 UTC+8"}
    assert 'title="Asia/Shanghai"' in html
    assert "Asia/Shanghai (UTC+8)" in html  # the top bar says which zone
    assert not re.search(r"\d[ap]\.m\.", html)  # no locale-formatted times left


def test_without_a_zone_the_console_shows_utc(client, sandbox, support_user):
    run = approval_run()
    _at_one_moment(run)
    client.force_login(support_user)
    html = client.get(reverse("console:run-detail", args=[run.pk])).content.decode()
    assert ("2026-10-14T12:11:05Z", "UTC", "2026-10-14 12:11:05 UTC") in _times(html)


def test_the_login_form_brings_the_browsers_zone(client, support_user):
    response = client.post(
        reverse("login"),
        {"username": "sam-support", "password": "correct horse battery",
         "time_zone": "America/Sao_Paulo"},
    )  # fmt: skip
    assert response.status_code == 302
    assert client.session["viewer_time_zone"] == "America/Sao_Paulo"
    assert "America/Sao_Paulo (UTC-3)" in client.get("/console/").content.decode()


def test_an_unknown_zone_is_refused_and_the_console_stays_in_utc(client, support_user):
    client.force_login(support_user)
    response = client.post(reverse("time-zone"), {"time_zone": "Mars/Olympus_Mons"})
    assert response.status_code == 422
    assert "viewer_time_zone" not in client.session
    # What the browser said is kept, so the page does not post it again and again.
    assert client.session["viewer_time_zone_reported"] == "Mars/Olympus_Mons"
    assert 'data-time-zone-reported="Mars/Olympus_Mons"' in client.get("/console/").content.decode()


def test_the_zone_endpoint_needs_a_login_and_a_post(client, support_user):
    assert client.post(reverse("time-zone"), {"time_zone": "UTC"}).status_code == 302
    client.force_login(support_user)
    assert client.get(reverse("time-zone")).status_code == 405


def test_the_audit_pages_use_the_same_format(client, sandbox, auditor_user, support_user):
    run = approval_run()
    actions.take_over(run.pk, support_user)
    client.force_login(auditor_user)
    client.post(reverse("time-zone"), {"time_zone": "Europe/Paris"})
    for path in (
        reverse("console:run-timeline", args=[run.pk]),
        reverse("console:audit") + "?workflow=test.refund",
        reverse("console:run-detail", args=[run.pk]) + "?tab=events",
        reverse("console:run-detail", args=[run.pk]) + "?tab=decisions",
        reverse("console:run-list"),
    ):
        html = client.get(path).content.decode()
        times = _times(html)
        assert times, path
        for _instant, zone, text in times:
            assert zone == "Europe/Paris", path
            assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\+[12]", text), (path, text)


def test_the_zone_costs_no_query(client, sandbox, support_user):
    from django.db import connection

    run = fresh(approval_run())
    client.force_login(support_user)
    path = reverse("console:run-detail", args=[run.pk])
    client.get(path)
    with CaptureQueriesContext(connection) as in_utc:
        client.get(path)
    client.post(reverse("time-zone"), {"time_zone": "Asia/Kolkata"})
    with CaptureQueriesContext(connection) as in_kolkata:
        html = client.get(path).content.decode()
    assert "UTC+5:30" in html
    assert len(in_kolkata) == len(in_utc)


def test_no_template_formats_a_timestamp_by_itself():
    # One filter for every timestamp (|when), so no page can drift back to two formats.
    templates = Path(settings.BASE_DIR) / "templates"
    offenders = [
        str(path.relative_to(templates))
        for path in templates.rglob("*.html")
        if re.search(r"\|date\b|DATETIME_FORMAT|\|time\b", path.read_text(encoding="utf-8"))
    ]
    assert offenders == []

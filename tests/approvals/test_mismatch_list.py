"""The list of external mismatches the metrics page leads to: open / resolved / all, newest
first, a page found from the last row shown, one query per page, untrusted values escaped."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from runs.engine.consistency import check_consistency
from runs.models import ExternalMismatch
from tests.approvals.console_helpers import fast_passwords  # noqa: F401  (autouse)
from tests.runs.test_consistency import fast_tools, mail_key, reply_runs  # noqa: F401

pytestmark = pytest.mark.django_db

URL = reverse("console:mismatches")


def rows_of(html: str) -> int:
    return html.count("data-mismatch=")


def test_open_and_resolved_mismatches_are_listed_and_linked_from_metrics(
    client, sandbox, support_user
):
    runs = reply_runs(2)
    key = mail_key(runs[0])
    [record] = sandbox.ledger(system="mail", key=key)
    sandbox.alter("mail", key, response={**record["response"], "status": "<i>bounced</i>"})
    sandbox.alter("mail", mail_key(runs[1]), delete=True)
    check_consistency()
    client.force_login(support_user)

    page = client.get(URL).content.decode()
    assert rows_of(page) == 2
    assert key in page and str(runs[0].pk)[:8] in page
    assert "Missing externally" in page and "Different externally" in page
    # What the system answers now, escaped.
    assert "&lt;i&gt;bounced&lt;/i&gt;" in page and "<i>bounced" not in page
    metrics = client.get(reverse("console:metrics")).content.decode()
    assert f'href="{URL}"' in metrics

    # The first record is put back: a later pass resolves it.
    sandbox.alter("mail", key, response=record["response"])
    check_consistency()
    assert rows_of(client.get(URL).content.decode()) == 1
    resolved = client.get(URL, {"state": "resolved"}).content.decode()
    assert rows_of(resolved) == 1 and key in resolved
    assert rows_of(client.get(URL, {"state": "all"}).content.decode()) == 2


def test_pages_follow_the_last_row_with_one_query_each(client, sandbox, support_user):
    [run] = reply_runs(1)
    check_consistency()
    effect = run.side_effects.get(tool="mail.send")
    start = timezone.now() - timedelta(days=1)
    ExternalMismatch.objects.bulk_create(
        ExternalMismatch(
            side_effect=effect,
            run=run,
            kind="different",
            observed_digest=f"{n:064x}",
            found_at=start + timedelta(minutes=n // 2),
        )
        for n in range(120)
    )
    client.force_login(support_user)
    client.get(URL)  # the session and user, once
    seen = []
    url, pages = f"{URL}?state=open", 0
    while url:
        with CaptureQueriesContext(connection) as queries:
            response = client.get(url)
        html = response.content.decode()
        pages += 1
        listed = [int(part.split('"', 2)[1]) for part in html.split("data-mismatch=")[1:]]
        seen += listed
        mine = [q for q in queries if "runs_externalmismatch" in q["sql"]]
        assert len(mine) == 1, [q["sql"] for q in mine]
        nxt = html.split('rel="next" href="', 1)
        url = nxt[1].split('"', 1)[0].replace("&amp;", "&") if len(nxt) > 1 else ""
        if url.startswith("?"):
            url = URL + url
    assert pages == 3
    assert len(seen) == len(set(seen)) == 120
    expected = list(
        ExternalMismatch.objects.order_by("-found_at", "-pk").values_list("pk", flat=True)
    )
    assert seen == expected


@pytest.mark.parametrize("cursor", ["x", "2026-01-01T00:00:00_", "not-a-date_12", "_5"])
def test_a_page_link_that_was_not_given_out_is_400(client, support_user, cursor):
    client.force_login(support_user)
    response = client.get(URL, {"after": cursor})
    assert response.status_code == 400
    assert "not one the console gave out" in response.content.decode()


def test_people_without_a_console_role_get_403(client, django_user_model):
    user = django_user_model.objects.create_user("nobody", password="x")
    client.force_login(user)
    assert client.get(URL).status_code == 403

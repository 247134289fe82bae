"""The run timeline made for reading (issue 33 §1): a 768-event run's page is one line per
event with repeated attempts collapsed, a summary of failures and decisions on top, filters and
a search on the server, chart markers that link to their lines, a fixed number of queries and
a fast first byte with 100k runs in the table. Also the audit search's business-key filter and
its two-person miss, and the Decisions tab saying what an edit changed and where a run went."""

from __future__ import annotations

import io
import re
import time
from types import SimpleNamespace

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from approvals import actions
from approvals.models import ApprovalRequest, HumanDecision
from runs.models import TimelineEvent
from tests.approvals.console_helpers import (  # noqa: F401  (fast_passwords is autouse)
    approval_run,
    fast_passwords,
    visible_text,
)
from tests.approvals.timeline_helpers import RETRIES, TOTAL_EVENTS, long_run, seed_runs

pytestmark = pytest.mark.django_db


def timeline_url(run, **params):
    url = reverse("console:run-timeline", args=[run.pk])
    return url + ("?" + "&".join(f"{k}={v}" for k, v in params.items()) if params else "")


@pytest.fixture
def long(sandbox, support_user):
    return long_run(support_user)


def page_text(client, url) -> str:
    response = client.get(url)
    assert response.status_code == 200
    return response.content.decode()


def read(html: str) -> str:
    """The text as a person reads it (untrusted values sit in <bdi>)."""
    return visible_text(SimpleNamespace(content=html.encode()))


def line_ids(text: str) -> list[str]:
    return re.findall(r'<li id="((?:event|attempts)-\d+)"', text)


def test_the_long_run_is_read_in_lines_with_its_repeats_collapsed(client, long, auditor_user):
    assert long.event_seq == TOTAL_EVENTS
    client.force_login(auditor_user)
    text = page_text(client, timeline_url(long))
    # One collapsed line for attempts 2–110, expandable through the range view.
    assert "attempts 2–110: 503 from mail.send" in read(text)
    assert f"{(RETRIES - 1) * 5} events, identical each time" in read(text)
    # The payload is on demand: no event's JSON is printed in the list.
    assert ERROR_JSON not in text and "tl-body" in text
    # The summary: failures grouped by step and error, and who decided what, with the edit.
    summary = read(text[text.index("tl-summary") : text.index("lanes-card")])
    assert "send_reply" in summary and "503" in summary and "111 times" in summary
    assert "sam-support" in summary and "approved with edits" in summary
    assert "amount 150 → 120" in summary
    # Lines, not events: the 768 events fit on a few pages of at most 80 lines.
    assert len(line_ids(text)) == 80
    assert 'class="pager"' in text


ERROR_JSON = '"error": "POST /mail/send answered 503'


def test_the_collapsed_attempts_and_one_payload_open_on_demand(client, long, auditor_user):
    client.force_login(auditor_user)
    text = page_text(client, timeline_url(long))
    first, last = re.search(r"#(\d+)–(\d+)</span>", text).groups()
    url = reverse("console:run-timeline-range", args=[long.pk])
    response = client.get(f"{url}?from={first}&to={last}", HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    part = response.content.decode()
    assert part.lstrip().startswith('<ol class="tl-lines')
    assert len(line_ids(part)) == int(last) - int(first) + 1
    seq = TimelineEvent.objects.get(run=long, verb="step.retry_scheduled", data__attempt=50).seq
    event_url = reverse("console:run-timeline-event", args=[long.pk, seq])
    part = client.get(event_url, HTTP_HX_REQUEST="true").content.decode()
    assert "503" in part and "retry_in_s" in part and "<html" not in part
    assert client.get(event_url).status_code == 200  # without JavaScript: a page of its own
    missing = reverse("console:run-timeline-event", args=[long.pk, 9999])
    assert client.get(missing).status_code == 404
    assert client.post(event_url).status_code == 405


def test_support_staff_cannot_read_the_parts_either(client, long, support_user):
    client.force_login(support_user)
    url = reverse("console:run-timeline-range", args=[long.pk])
    assert client.get(f"{url}?from=1&to=5").status_code == 403
    assert client.get(reverse("console:run-timeline-event", args=[long.pk, 1])).status_code == 403


def test_failures_only_and_the_next_failure_links(client, long, auditor_user):
    client.force_login(auditor_user)
    text = page_text(client, timeline_url(long, failures=1))
    ids = line_ids(text)
    failures = TimelineEvent.objects.filter(
        run=long, verb__in=["step.retry_scheduled", "step.escalated"]
    )
    # Only failures; the 109 identical retries after the first are one line.
    assert 0 < len(ids) < 10
    assert f"event-{failures.order_by('seq').first().seq}" in ids
    assert "failure-next" in text and "failure-prev" in text
    # The summary's link reaches the first failure on its page.
    everything = page_text(client, timeline_url(long))
    first = failures.order_by("seq").first().seq
    assert re.search(rf'href="(\?page=\d+)?#event-{first}" class="failure-first"', everything)


def test_filters_by_verb_actor_and_step_and_the_search(client, long, auditor_user):
    client.force_login(auditor_user)
    by_actor = page_text(client, timeline_url(long, actor="user:sam-support"))
    people = TimelineEvent.objects.filter(run=long, actor="user:sam-support").count()
    assert people and len(line_ids(by_actor)) == people
    by_verb = page_text(client, timeline_url(long, verb="approval.requested"))
    assert len(line_ids(by_verb)) == 1
    by_step = page_text(client, timeline_url(long, step="enrich_3"))
    enrich = TimelineEvent.objects.filter(run=long, data__step="enrich_3").count()
    assert enrich > 2 and len(line_ids(by_step)) == min(enrich, 80)
    # The search reads payloads, verbs and actors on the server.
    found = page_text(client, timeline_url(long, q="partial+refund"))
    assert 1 <= len(line_ids(found)) <= 3 and "events match" in found or "event matches" in found
    none = page_text(client, timeline_url(long, q="%3Cscript%3Ex"))
    assert "No event matches these filters." in none
    assert "<script>x" not in none and "&lt;script&gt;x" in none  # the query, escaped


def test_chart_markers_link_to_the_page_and_line_of_their_event(client, long, auditor_user):
    client.force_login(auditor_user)
    text = page_text(client, timeline_url(long))
    decision = TimelineEvent.objects.filter(run=long, actor="user:sam-support").first()
    # On the page being read, a jump to the anchor; from another page, that page and anchor.
    assert f'<a href="#event-{decision.seq}" class="marker-link">' in text
    later = page_text(client, timeline_url(long, page=2))
    assert f'<a href="?page=1#event-{decision.seq}" class="marker-link">' in later
    # A retry inside the collapsed line links to that line.
    inside = TimelineEvent.objects.get(run=long, verb="step.retry_scheduled", data__attempt=60)
    group = re.search(r'<li id="(attempts-\d+)"', text).group(1)
    assert f'href="#{group}" class="marker-link"' in text
    assert inside.seq > int(group.split("-")[1])


def test_the_page_costs_the_same_queries_short_or_long(
    client, sandbox, long, auditor_user, django_assert_max_num_queries
):
    short = approval_run(payment="pay_2")
    client.force_login(auditor_user)
    with CaptureQueriesContext(connection) as few:
        page_text(client, timeline_url(short))
    with django_assert_max_num_queries(len(few)):
        page_text(client, timeline_url(long, failures=1, q="503"))
    with django_assert_max_num_queries(len(few)):
        page_text(client, timeline_url(long))


def _fastest_of_three(client, url) -> float:
    timings = []
    for _ in range(3):
        started = time.perf_counter()
        page_text(client, url)
        timings.append(time.perf_counter() - started)
    return min(timings)


def test_first_byte_under_300_ms_with_100k_runs_and_indexed_reads(client, long, auditor_user):
    client.force_login(auditor_user)
    url = timeline_url(long)
    page_text(client, url)  # warm: templates compiled, caches filled
    alone = _fastest_of_three(client, url)  # the same page with no other run in the table
    seed_runs(100_000)
    page_text(client, url)
    crowded = _fastest_of_three(client, url)
    # Under 300 ms; on a host slow enough that the page alone takes longer (a shared machine's
    # speed moves twofold), 100,000 more runs may add no more than half of that.
    assert crowded < max(0.3, 1.5 * alone), (crowded, alone)
    # Every read of the big tables goes through an index (no sequential scan of the runs or
    # of the 200k events of other runs).
    with CaptureQueriesContext(connection) as queries:
        page_text(client, url)
    with connection.cursor() as cursor:
        for query in queries.captured_queries:
            sql = query["sql"]
            if not sql.lstrip().upper().startswith("SELECT"):
                continue
            cursor.execute("EXPLAIN " + sql)
            plan = "\n".join(row[0] for row in cursor.fetchall())
            assert "Seq Scan on runs_run" not in plan, (sql, plan)
            assert "Seq Scan on runs_timelineevent" not in plan, (sql, plan)


# --------------------------------------------------------------------------------------------
# Audit search


def search(client, **params) -> set[str]:
    response = client.get(reverse("console:audit"), params)
    assert response.status_code == 200
    return {str(run.pk) for run in response.context["page"].object_list}


def test_the_first_of_two_approvers_is_found_as_approving(client, auditor_user):
    # Issue 33: mei's first approval of a two-person decision was not found, because the search
    # asked who *decided* the request (the second approver) and nothing else.
    from approvals.models import EscalationRule
    from tests.approvals import test_two_person
    from tests.factories import UserFactory

    # test.twoperson stands in for refund.approval: a high-risk refund that two must approve.
    EscalationRule.objects.create(
        position=1,
        name="two",
        risk="high",
        action="escalate",
        queue="support",
        approvers_required=2,
    )
    mei = UserFactory(username="mei", groups=["support"])
    li = UserFactory(username="li", groups=["support"])
    first_by_mei = test_two_person.waiting(amount=40)
    request = ApprovalRequest.objects.get(run=first_by_mei)
    actions.decide_approval(request.pk, mei, "approved")
    actions.decide_approval(request.pk, li, "approved")
    waiting_for_second = test_two_person.waiting(amount=41)
    actions.decide_approval(ApprovalRequest.objects.get(run=waiting_for_second).pk, mei, "approved")
    only_li = test_two_person.waiting(amount=42)
    actions.decide_approval(ApprovalRequest.objects.get(run=only_li).pk, li, "approved")
    assert HumanDecision.objects.filter(user=mei).count() == 2
    client.force_login(auditor_user)
    found = search(client, workflow="test.twoperson", actor="mei", outcome="approved")
    assert found == {str(first_by_mei.pk), str(waiting_for_second.pk)}
    assert search(client, workflow="test.twoperson", actor="li", outcome="approved") == {
        str(first_by_mei.pk),
        str(only_li.pk),
    }
    assert search(client, actor="mei", outcome="rejected") == set()


def test_search_by_business_key(client, sandbox, auditor_user, tmp_path):
    keyed = approval_run(payment="pay_9")
    from runs.models import Run

    Run.objects.filter(pk=keyed.pk).update(business_key="order-88412/refund")
    approval_run(payment="pay_8")
    client.force_login(auditor_user)
    assert search(client, business_key="order-88412/refund") == {str(keyed.pk)}
    assert search(client, business_key="order-00000") == set()
    text = client.get(reverse("console:audit")).content.decode()
    assert 'name="business_key"' in text
    # The shell's export takes the same filter.
    out = tmp_path / "keyed.csv"
    call_command(
        "export_audit",
        "--business-key",
        "order-88412/refund",
        "--format",
        "csv",
        "-o",
        str(out),
        stderr=io.StringIO(),
    )
    exported = {line.split(",", 1)[0] for line in out.read_text().splitlines()[1:]}
    assert exported == {str(keyed.pk)}


# --------------------------------------------------------------------------------------------
# The run page's Decisions tab


def test_the_decisions_tab_says_what_an_edit_changed_and_where_a_run_went(
    client, sandbox, support_user, admin_user
):
    run = approval_run()
    approval = ApprovalRequest.objects.get(run=run)
    actions.decide_approval(
        approval.pk,
        support_user,
        "approved_with_edits",
        edited_params={"payment_id": "pay_1", "amount": 120},
    )
    from tests.factories import EscalationRuleFactory

    EscalationRuleFactory(position=9, queue="ops")  # makes "ops" a known queue
    other = approval_run(payment="pay_3")
    actions.move_to_queue(other.pk, admin_user, queue="ops", comment="night shift")
    client.force_login(admin_user)
    url = reverse("console:run-detail", args=[run.pk]) + "?tab=decisions"
    text = page_text(client, url)
    assert "approved with edits" in text and "amount 150 → 120" in read(text)
    text = page_text(client, reverse("console:run-detail", args=[other.pk]) + "?tab=decisions")
    assert re.search(r"reassigned the run to queue <bdi[^>]*>ops</bdi>", text), text


def test_what_agents_and_tools_wrote_stays_text_on_every_line(client, sandbox, auditor_user):
    run = approval_run(payment="pay_4")
    hostile = '<img src=x onerror="alert(1)">'
    for attempt in (1, 2, 3):
        TimelineEvent.append(run.pk, "step.started", {"step": hostile, "attempt": attempt})
        TimelineEvent.append(
            run.pk, "step.retry_scheduled", {"step": hostile, "error": hostile, "attempt": attempt}
        )
    client.force_login(auditor_user)
    for url in (timeline_url(run), timeline_url(run, failures=1, q="onerror")):
        text = page_text(client, url)
        assert hostile not in text and "&lt;img src=x onerror=" in text
    assert "attempts 2–3" in read(text)

"""The audit pages: the timeline of a run (auditors and admins; support 403), search across
runs with a fixed query count, streaming exports that verify offline, and read-only roles:
an auditor's POST to any console URL is refused and changes nothing."""

from __future__ import annotations

import json
import uuid

import pytest
from django.urls import URLPattern, get_resolver, reverse

from approvals import actions, views
from approvals.models import ApprovalRequest, EscalationRule, HumanDecision
from runs import audit
from runs.models import Run, TimelineEvent
from tests.approvals.console_helpers import (  # noqa: F401  (fast_passwords is autouse)
    approval_run,
    fast_passwords,
    fresh,
    start,
    unknown_outcome_run,
)

pytestmark = pytest.mark.django_db


def timeline_url(run):
    return reverse("console:run-timeline", args=[run.pk])


@pytest.fixture
def decided(sandbox, support_user):
    """A refund approved with edits by sam-support, then refunded and settled."""
    from runs import engine
    from runs.models import SideEffect

    run = approval_run()
    approval = ApprovalRequest.objects.get(run=run)
    actions.decide_approval(approval.pk, support_user, "approved_with_edits",
                            edited_params={"payment_id": "pay_1", "amount": 120})  # fmt: skip
    run = engine.run_until_quiet(run.pk)
    refund = SideEffect.objects.get(run=run, tool="payments.refund")
    engine.deliver_event("evt-1", "payment.settled", refund.external_id, {"ok": True})
    return engine.run_until_quiet(run.pk)


# --------------------------------------------------------------------------------------------
# Timeline


@pytest.mark.parametrize("persona", ["auditor_user", "admin_user"])
def test_auditors_and_admins_read_the_whole_story(client, request, decided, persona):
    client.force_login(request.getfixturevalue(persona))
    response = client.get(timeline_url(decided))
    assert response.status_code == 200
    text = response.content.decode()
    for event in TimelineEvent.objects.filter(run=decided):
        assert f'id="event-{event.seq}"' in text and event.verb in text
    assert "Chain verified" in text
    assert '<svg class="lanes"' in text and "bar--human" in text and "marker--decision" in text
    # Who decided what, on top; the payloads are fetched when a line is opened (issue 33: the
    # page printed every event's JSON and evidence inline).
    assert "approved with edits" in text and "sam-support" in text
    assert '"payment_id"' not in text
    # The snapshot of the refund beside its receipt and the approval decision before it.
    snapshot = TimelineEvent.objects.get(
        run=decided, verb="snapshot.written", data__tool="payments.refund"
    )
    url = reverse("console:run-timeline-event", args=[decided.pk, snapshot.seq])
    text = client.get(url, HTTP_HX_REQUEST="true").content.decode()
    assert "Snapshot (before the call)" in text and "Receipt (what happened)" in text
    requested = TimelineEvent.objects.get(run=decided, verb="approval.requested")
    url = reverse("console:run-timeline-event", args=[decided.pk, requested.seq])
    text = client.get(url, HTTP_HX_REQUEST="true").content.decode()
    assert "Approved with edits" in text and "sam-support" in text
    assert decided.status == "succeeded"


def test_support_outsiders_and_anonymous_are_refused(client, decided, support_user, outsider):
    assert client.get(timeline_url(decided)).status_code == 302  # to the login page
    for user in (support_user, outsider):
        client.force_login(user)
        assert client.get(timeline_url(decided)).status_code == 403
        assert client.get(reverse("console:audit")).status_code == 403
        export = reverse("console:run-timeline-export", args=[decided.pk, "jsonl"])
        assert client.get(export).status_code == 403


def test_missing_run_and_wrong_method(client, decided, auditor_user):
    client.force_login(auditor_user)
    missing = reverse("console:run-timeline", args=[uuid.uuid4()])
    assert client.get(missing).status_code == 404
    assert client.post(timeline_url(decided)).status_code == 405
    bad_format = reverse("console:run-timeline-export", args=[decided.pk, "xml"])
    assert client.get(bad_format).status_code == 404


def test_the_kind_filter_and_the_htmx_partial(client, decided, auditor_user):
    client.force_login(auditor_user)
    response = client.get(timeline_url(decided) + "?kind=approval",
                          HTTP_HX_REQUEST="true", HTTP_HX_TARGET="timeline-events")  # fmt: skip
    text = response.content.decode()
    assert text.lstrip().startswith('<section id="timeline-events"')
    lines = text[text.index('<ol class="tl-lines') :]  # the filter's lists name every verb
    assert "approval.requested" in lines and "snapshot.written" not in lines


def test_a_broken_chain_is_shown_on_the_page(client, decided, auditor_user):
    from tests.runs.test_audit_verify import trigger_disabled

    with trigger_disabled() as cursor:
        cursor.execute(
            "UPDATE runs_timelineevent SET actor = 'user:mallory' WHERE run_id = %s AND seq = 2",
            [decided.pk],
        )
    client.force_login(auditor_user)
    text = client.get(timeline_url(decided)).content.decode()
    assert "Chain broken" in text and "first broken event: #2" in text


def test_untrusted_data_stays_text(client, sandbox, auditor_user):
    run = start("test.reply", {"message": "<script>alert(1)</script>", "ticket": "T-1",
                               "email": "<img src=x onerror=alert(1)>@example.com"})  # fmt: skip
    client.force_login(auditor_user)
    text = client.get(timeline_url(run)).content.decode()
    assert "<script>alert(1)" not in text and "<img src=x" not in text
    assert "&lt;img src=x onerror=alert(1)&gt;" in text


def test_the_nav_and_the_run_detail_link_to_the_audit_pages(client, decided, auditor_user,
                                                            support_user):  # fmt: skip
    client.force_login(auditor_user)
    text = client.get(reverse("console:run-detail", args=[decided.pk])).content.decode()
    assert reverse("console:audit") in text and timeline_url(decided) in text
    client.force_login(support_user)
    text = client.get(reverse("console:run-detail", args=[decided.pk])).content.decode()
    assert timeline_url(decided) not in text and reverse("console:audit") not in text


# --------------------------------------------------------------------------------------------
# Search


def search(client, **params):
    response = client.get(reverse("console:audit"), params)
    assert response.status_code == 200
    return {str(run.pk) for run in response.context["page"].object_list}


def test_search_by_workflow_tool_target_actor_and_outcome(
    client, sandbox, decided, auditor_user, admin_user
):
    other = approval_run(payment="pay_2")
    actions.decide_approval(ApprovalRequest.objects.get(run=other).pk, admin_user, "approved")
    lead = unknown_outcome_run(sandbox)
    client.force_login(auditor_user)
    assert search(client, workflow="test.refund") == {str(decided.pk), str(other.pk)}
    assert search(client, tool="crm.create") == {str(lead.pk)}
    # "All refunds approved by this user" — the approver, not anyone who touched the run.
    assert search(client, actor="sam-support", outcome="approved_with_edits") == {str(decided.pk)}
    assert search(client, actor="alex-admin", outcome="approved") == {str(other.pk)}
    assert search(client, actor="sam-support", outcome="approved") == set()
    assert search(client, outcome="unknown_outcome") == {str(lead.pk)}
    assert search(client, outcome="succeeded") == {str(decided.pk)}
    today = decided.created_at.date().isoformat()
    assert len(search(client, date_from=today, date_to=today)) == 3
    assert search(client, date_from="2001-01-01", date_to="2001-01-31") == set()
    response = client.get(reverse("console:audit"), {"date_from": "2030-01-02",
                                                     "date_to": "2030-01-01"})  # fmt: skip
    assert "The start date is after the end date." in response.content.decode()


def test_search_by_target_prefix(client, sandbox, auditor_user):
    run = start("test.reply", {"message": "hi", "email": "zoe@example.com", "ticket": "T-9"})
    target = run.side_effects.order_by("pk").first().target
    client.force_login(auditor_user)
    assert search(client, target=target[: max(len(target) - 3, 1)]) == {str(run.pk)}


def test_search_costs_the_same_queries_for_few_or_many_runs(client, auditor_user, query_count):
    from tests.factories import RunFactory

    client.force_login(auditor_user)
    params = {"workflow": "test.flow", "actor": "system", "outcome": "open"}

    def measure():
        with query_count() as ctx:
            assert client.get(reverse("console:audit"), params).status_code == 200
        return len(ctx)

    for _ in range(3):
        run = RunFactory()
        run.record("run.note", {})
    few = measure()
    for _ in range(40):
        run = RunFactory()
        run.record("run.note", {})
    assert measure() == few


# --------------------------------------------------------------------------------------------
# Export


def _body(response) -> str:
    assert response.streaming
    return b"".join(response.streaming_content).decode()


def test_a_run_exports_as_jsonl_that_verifies_offline(client, decided, auditor_user):
    client.force_login(auditor_user)
    response = client.get(reverse("console:run-timeline-export", args=[decided.pk, "jsonl"]))
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/x-ndjson")
    assert "attachment" in response["Content-Disposition"]
    lines = _body(response).splitlines()
    header = json.loads(lines[0])
    assert header["exported_by"] == "user:ada-auditor" and header["query"] == {
        "run": str(decided.pk)
    }
    report = audit.verify_export(lines)
    assert report.ok and report.runs == 1
    assert report.events == TimelineEvent.objects.filter(run=decided).count()


def test_a_search_exports_as_jsonl_and_csv(client, sandbox, decided, auditor_user):
    start("test.reply", {"message": "hi", "email": "=cmd|' /C calc'!A0", "ticket": "T-1"})
    client.force_login(auditor_user)
    url = reverse("console:audit-export", args=["jsonl"])
    report = audit.verify_export(_body(client.get(url, {"workflow": "test.refund"})).splitlines())
    assert report.ok and report.runs == 1
    text = _body(client.get(reverse("console:audit-export", args=["csv"])))
    rows = text.splitlines()
    assert rows[0].startswith("run,workflow,seq,at,actor,verb,data")
    assert len(rows) - 1 == TimelineEvent.objects.count()
    assert "\n=" not in text and ",=" not in text  # formulas neutralised


# --------------------------------------------------------------------------------------------
# Auditors cannot change anything


def _console_post_urls(run) -> list[str]:
    """Every console URL, with each action name for the action route."""
    urls = []
    for pattern in _patterns():
        route = pattern.pattern
        converters = route.converters
        names = list(converters)
        groups = list(route.regex.groupindex)
        if not names and groups:  # a regex route (bulk-control): an id and its first choice
            values = {name: "1" if name.endswith("id") else "pause" for name in groups}
            urls.append(reverse(f"console:{pattern.name}", kwargs=values))
            continue
        if not names:
            urls.append(reverse(f"console:{pattern.name}"))
            continue
        values = {}
        for name, converter in converters.items():
            kind = type(converter).__name__
            values[name] = {"UUIDConverter": run.pk, "IntConverter": 1}.get(kind, "x")
        if "action" in names:
            for action in views.ACTIONS:
                urls.append(reverse(f"console:{pattern.name}", kwargs={**values, "action": action}))
        else:
            if "fmt" in names:
                values["fmt"] = "jsonl"
            if "part" in names:
                values["part"] = "input"
            urls.append(reverse(f"console:{pattern.name}", kwargs=values))
    return urls


def _patterns() -> list[URLPattern]:
    resolver = get_resolver()
    console = next(p for p in resolver.url_patterns if getattr(p, "namespace", "") == "console")
    return [p for p in console.url_patterns if isinstance(p, URLPattern)]


def test_every_console_post_is_refused_for_auditors(client, sandbox, auditor_user):
    run = approval_run()
    before = (HumanDecision.objects.count(), TimelineEvent.objects.count(),
              EscalationRule.objects.count(), fresh(run).lock_version)  # fmt: skip
    client.force_login(auditor_user)
    urls = _console_post_urls(run)
    assert len(urls) >= len(views.ACTIONS) + 5
    # Every role manages its own API tokens (approvals/token_views.py: an auditor's may read
    # runs, nothing more) and unlinks its own Slack accounts (approvals/slack_link.py: another's
    # is 404); those pages write no decision, event or rule.
    own = {
        reverse("console:tokens"),
        reverse("console:token-revoke", args=["x"]),
        reverse("console:slack-unlink", args=[1]),
    }
    for url in urls:
        body = {"expected_version": run.lock_version, "comment": "x", "name": "x"}
        status = client.post(url, body).status_code
        allowed = (403, 405) if url not in own else (403, 404, 405, 422)
        assert status in allowed, f"{url}: {status}"
    after = (HumanDecision.objects.count(), TimelineEvent.objects.count(),
             EscalationRule.objects.count(), fresh(run).lock_version)  # fmt: skip
    assert after == before
    assert Run.objects.get(pk=run.pk).status == "needs_human"

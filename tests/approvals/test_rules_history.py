"""Rules tested against history (approvals/rules_history.py and the form's preview): failures
the real engine produced, replayed through the engine's routing with an unsaved rule set."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.urls import reverse
from django.utils import timezone, translation

from approvals import rules_history
from approvals.models import EscalationRule, RuleVersion
from runs import engine
from runs.models import Step
from tests.approvals.console_helpers import fast_passwords  # noqa: F401  (autouse)
from tests.approvals.test_rules_views import form_data
from tests.runs import flows
from tests.runs.test_audit_verify import trigger_disabled

pytestmark = pytest.mark.django_db


def failing_run(fail_times: int):
    """A run of test.flaky whose write fails `fail_times` times (transient) before it works,
    driven by the real engine, backoffs made due, until it is done or with a person."""
    flows.CALLS["flaky"] = 0
    run, created = engine.start_run("test.flaky", {"fail_times": fail_times})
    assert created
    for _ in range(12):
        run = engine.run_until_quiet(run.pk)
        if run.status != "running":
            break
        Step.objects.filter(run=run, status="retry_scheduled").update(
            next_attempt_at=timezone.now() - timedelta(hours=1)
        )
    return run


@pytest.fixture
def history():
    """Three runs that recovered after 2 failed attempts, one the default retry rule (5
    attempts) gave up on and handed to a person."""
    recovered = [failing_run(2) for _ in range(3)]
    given_up = failing_run(10)
    for run in recovered:
        assert run.status == "succeeded"
    assert given_up.status == "needs_human"
    steps = Step.objects.filter(run__in=[*recovered, given_up], name="write")
    assert {(s.status, s.attempts) for s in steps} == {("succeeded", 3), ("needs_human", 5)}
    return recovered, given_up


def edited(name: str, **changes) -> EscalationRule:
    """A rule as the form would leave it: changed in memory, not saved."""
    rule = EscalationRule.objects.get(name=name)
    for field, value in changes.items():
        setattr(rule, field, value)
    return rule


def test_the_rules_in_force_replay_what_the_engine_did(history):
    recovered, given_up = history
    result = rules_history.preview(edited("Retry transient errors"), 7)
    # 3 × 2 retried attempts, 4 retried and the 5th given up on.
    assert result.scanned == 11 and result.steps == 4 and not result.capped
    assert result.current.actions == {"retry": 11}
    assert result.current.person == 1  # the run the engine really handed to a person
    assert result.current.cannot_tell == 0
    assert result.proposed.actions == result.current.actions and result.changed == 0


def test_retry_turned_escalate_sends_every_transient_failure_to_a_person(history):
    recovered, given_up = history
    result = rules_history.preview(edited("Retry transient errors", action="escalate"), 7)
    assert result.current.person == 1 and result.proposed.person == 4
    # The first failure of each step goes to a person: the later ones would not have happened.
    assert result.proposed.actions == {"escalate": 4}
    assert result.changed == 4
    to_person, sooner = result.change_rows()
    assert (to_person["before"], to_person["after"], to_person["count"]) == (
        "Retry with backoff", "Escalate to a person", 3
    )  # fmt: skip
    assert set(to_person["runs"]) == {r.pk for r in recovered}
    assert sooner["count"] == 1 and sooner["runs"] == [given_up.pk]  # a person, 4 tries sooner
    # Nothing was saved.
    rule = EscalationRule.objects.get(name="Retry transient errors")
    assert rule.action == "retry" and rule.version == 1


def test_fewer_attempts_reach_a_person_sooner_without_changing_the_route(history):
    result = rules_history.preview(edited("Retry transient errors", max_attempts=2), 7)
    # The second failure of every step reaches 2 attempts: given up, a person.
    assert result.proposed.actions == {"retry": 8}
    assert result.current.person == 1 and result.proposed.person == 4
    assert result.changed == 4
    sooner, given_up = result.change_rows()
    assert (sooner["before"], sooner["after"], sooner["count"]) == (
        "Retry with backoff", "Escalate to a person", 3
    )  # fmt: skip
    assert given_up["count"] == 1  # a person either way, three attempts sooner


def test_a_new_rule_before_the_others_takes_the_failures_it_matches(history):
    new = EscalationRule(
        name="Flaky writes fail", position=1, enabled=True, workflow="test.flaky", action="fail"
    )
    result = rules_history.preview(new, 30)
    assert result.proposed.actions == {"fail": 4} and result.proposed.person == 0
    assert not EscalationRule.objects.filter(name="Flaky writes fail").exists()


def test_a_disabled_rule_leaves_the_failures_to_the_next_match(history):
    result = rules_history.preview(edited("Retry transient errors", enabled=False), 7)
    # "Anything else: operations" escalates.
    assert result.proposed.actions == {"escalate": 4} and result.proposed.person == 4


def test_the_window_and_the_cap(history):
    recovered, _given_up = history
    # The timeline is append-only: one run's events are made older with its trigger off.
    with trigger_disabled() as cursor:
        cursor.execute(
            "UPDATE runs_timelineevent SET at = at - interval '10 days' WHERE run_id = %s",
            [recovered[0].pk],
        )
    current = rules_history.rules_in_force()
    assert rules_history.compare(current, current, 7).steps == 3
    assert rules_history.compare(current, current, 30).steps == 4
    capped = rules_history.compare(current, current, 30, cap=2)
    assert capped.scanned == 2 and capped.capped


def test_the_preview_reads_a_constant_number_of_queries(history, django_assert_num_queries):
    rule = edited("Retry transient errors", action="escalate")
    with django_assert_num_queries(2):  # the rules in force, the failures
        rules_history.preview(rule, 30)
    for _ in range(3):
        failing_run(1)
    with django_assert_num_queries(2):
        assert rules_history.preview(rule, 30).steps == 7


def test_the_scan_can_use_the_failure_index(history, query_count):
    """The index's verb list (migrations approvals 0016, 0019) and FAILURE_VERBS must agree, or the
    scan walks the whole timeline: the index's predicate names exactly those verbs, and with
    sequential scans off and fresh statistics the plan names the index. (With statistics left
    from whatever ran before, the planner once preferred another index with a filter.)"""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexdef FROM pg_indexes WHERE indexname = 'runs_timeline_failure_idx'"
        )
        (definition,) = cursor.fetchone()
    assert sorted(re.findall(r"'([a-z_.]+)'::(?:text|character varying)", definition)) == sorted(
        str(verb) for verb in rules_history.FAILURE_VERBS
    )
    with query_count() as ctx:
        rules_history.failures(30, 100)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE runs_timelineevent")
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN " + ctx.captured_queries[-1]["sql"])
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "runs_timeline_failure_idx" in plan, plan


# -- the preview in the form -----------------------------------------------------------------


def preview_url(rule):
    return reverse("console:rule-preview", args=[rule.pk])


def test_admins_preview_an_edit_without_saving_it(client, admin_user, history):
    rule = EscalationRule.objects.get(name="Retry transient errors")
    versions = RuleVersion.objects.filter(rule=rule).count()
    client.force_login(admin_user)
    data = {**form_data(rule, action="escalate"), "days": "7"}
    response = client.post(preview_url(rule), data)
    assert response.status_code == 200
    comparison = response.context["comparison"]
    assert comparison.current.person == 1 and comparison.proposed.person == 4
    assert b"4 failing steps take another route." in response.content
    assert reverse("console:run-detail", args=[history[1].pk]).encode() in response.content
    rule.refresh_from_db()
    assert rule.action == "retry" and rule.version == 1
    assert RuleVersion.objects.filter(rule=rule).count() == versions


def test_a_new_rule_is_previewed_too(client, admin_user, history):
    client.force_login(admin_user)
    data = {**form_data(None, name="Flaky fails", position=1, workflow="test.flaky",
                        action="fail"), "days": "30"}  # fmt: skip
    response = client.post(reverse("console:rule-preview-new"), data)
    assert response.status_code == 200
    assert response.context["comparison"].proposed.actions == {"fail": 4}
    assert response.context["comparison"].proposed.person == 0
    assert not EscalationRule.objects.filter(name="Flaky fails").exists()


def test_an_invalid_form_shows_its_errors_escaped(client, admin_user):
    rule = EscalationRule.objects.get(name="Retry transient errors")
    client.force_login(admin_user)
    data = {**form_data(rule, workflow="<b>nope</b>"), "days": "7"}
    response = client.post(preview_url(rule), data)
    assert response.status_code == 422
    assert "comparison" not in response.context
    assert b"&lt;b&gt;nope&lt;/b&gt;" in response.content and b"<b>nope" not in response.content


@pytest.mark.parametrize("persona", ["support_user", "auditor_user"])
def test_others_cannot_preview(client, request, persona):
    rule = EscalationRule.objects.get(name="Retry transient errors")
    client.force_login(request.getfixturevalue(persona))
    assert client.post(preview_url(rule), form_data(rule)).status_code == 403


def test_the_preview_needs_the_csrf_token(admin_user):
    rule = EscalationRule.objects.get(name="Retry transient errors")
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin_user)
    assert client.post(preview_url(rule), form_data(rule)).status_code == 403


def test_a_capped_preview_says_so(client, admin_user, history, monkeypatch):
    monkeypatch.setattr(rules_history, "SCAN_CAP", 3)
    rule = EscalationRule.objects.get(name="Retry transient errors")
    client.force_login(admin_user)
    response = client.post(preview_url(rule), {**form_data(rule), "days": "30"})
    assert response.status_code == 200 and response.context["comparison"].scanned == 3
    assert b"Only the newest 3 were read" in response.content


def test_a_missing_rule_is_404_and_get_is_405(client, admin_user):
    client.force_login(admin_user)
    assert client.post(reverse("console:rule-preview", args=[999999]), {}).status_code == 404
    rule = EscalationRule.objects.get(name="Retry transient errors")
    assert client.get(preview_url(rule)).status_code == 405


# -- API drift: the engine pauses the tool instead of asking a person -------------------------


def test_drift_is_replayed_as_a_paused_tool_not_a_person():
    from tests.runs.test_failure_classes import SERVER, drive

    SERVER.answers.clear()
    SERVER.answers["/profile/get"] = (406, {"error": "application/vnd.v1+json is retired"})
    run = drive("test.classes_profile")
    assert Step.objects.get(run=run, name="fetch").error_class == "api_drift"

    current = rules_history.rules_in_force()
    kept = rules_history.compare(current, current, 7)
    assert kept.scanned == 1 and kept.steps == 1
    assert kept.current.actions == {"escalate": 1}
    assert kept.current.person == 0 and kept.changed == 0

    # A rule that fails drifted calls instead: the step ends failed, still no person.
    fail = EscalationRule(name="drift fails", position=0, enabled=True, action="fail",
                          failure_class="api_drift", queue="ops")  # fmt: skip
    changed = rules_history.compare(current, rules_history.with_change(current, fail), 7)
    assert changed.proposed.actions == {"fail": 1} and changed.changed == 1
    [row] = changed.change_rows()
    with translation.override("en"):  # the labels are lazy: read them in one language
        before, after = str(row["before"]), str(row["after"])
    assert (before, after) == ("Pause the tool (API drift)", "Fail the run")
    assert row["runs"] == [run.pk]


def test_a_wait_window_that_closed_on_a_person_counts_as_reaching_a_person(sandbox):
    # The engine records the hand-over when an outage outlasts its wait window as
    # `step.escalated` whose routing's action is `wait` (the route that matched): the baseline
    # must count those steps as reaching a person, as they did (issue 33: the 263 runs that
    # really sat in the ops inbox were counted as "no person", overstating a change).
    from tests.approvals.bulk_helpers import outage_parked_runs

    outage_parked_runs(sandbox, 2)
    name = EscalationRule.objects.get(failure_class="outage", action="wait").name
    same = rules_history.preview(edited(name), 7)
    assert same.steps == 2
    assert same.current.person == 2 and same.current.no_person == 0
    assert same.current.cannot_tell == 0
    assert same.changed == 0 and same.proposed.person == 2

    failed = rules_history.preview(edited(name, action="fail"), 7)
    assert failed.current.person == 2
    assert failed.proposed.person == 0 and failed.proposed.no_person == 2
    assert failed.changed == 2


def test_failures_and_steps_are_in_separate_labelled_tables(client, admin_user, history):
    rule = EscalationRule.objects.get(name="Retry transient errors")
    client.force_login(admin_user)
    data = {**form_data(rule, max_attempts=2), "days": "7"}
    response = client.post(preview_url(rule), data)
    html = response.content.decode()
    routes = html[html.index('class="runs preview-routes"') : html.index("</table>")]
    assert "Failures routed to" in routes and "reached a person" not in routes
    steps = html[html.index('class="runs preview-steps"') :]
    steps = steps[: steps.index("</table>")]
    assert "reached a person" in steps and "Steps, rules in force" in steps

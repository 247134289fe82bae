"""The admin rules pages: who may use them, validation, versioning and the rule tester."""

from __future__ import annotations

import pytest
from django.urls import reverse

from approvals.models import EscalationRule, RuleVersion
from runs import engine
from runs.models import Step, TimelineEvent
from tests.approvals.console_helpers import fast_passwords  # noqa: F401  (autouse)

pytestmark = pytest.mark.django_db

RULES = "/console/rules/"
NEW = "/console/rules/new/"


def edit_url(rule):
    return reverse("console:rule-edit", args=[rule.pk])


def form_data(rule: EscalationRule | None = None, **changes):
    base = {
        "name": "Refund tool failing: fail fast", "position": 3, "enabled": "on", "workflow": "",
        "step": "", "tool": "", "failure_class": "", "risk": "", "action": "escalate",
        "queue": "ops", "escalate_to": "", "max_attempts": 5, "backoff_base_seconds": 1,
        "backoff_cap_seconds": 60, "wait_window_seconds": 900, "probe_interval_seconds": 30,
        "approval_sla_seconds": 14400, "escalate_after_seconds": 0,
    }  # fmt: skip
    if rule is not None:
        base.update({k: v for k, v in rule.data().items() if k in base})
        base["enabled"] = "on" if rule.enabled else ""
        base["expected_version"] = rule.version
    base.update(changes)
    return {k: v for k, v in base.items() if v is not None and v != "" or k == "name"}


# -- access ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url", [RULES, NEW, "/console/rules/tools/", "/console/rules/channels/"]
)  # fmt: skip
def test_admins_see_the_admin_pages(client, admin_user, url):
    client.force_login(admin_user)
    response = client.get(url)
    assert response.status_code == 200
    assert b"Escalation rules" in response.content or b"Tools" in response.content


@pytest.mark.parametrize("persona", ["support_user", "auditor_user", "outsider"])
@pytest.mark.parametrize("url", [RULES, NEW, "/console/rules/tools/", "/console/rules/channels/"])
def test_other_roles_get_403(client, request, persona, url):
    client.force_login(request.getfixturevalue(persona))
    assert client.get(url).status_code == 403


def test_others_cannot_change_a_rule(client, support_user):
    rule = EscalationRule.objects.get(name="Retry transient errors")
    client.force_login(support_user)
    response = client.post(edit_url(rule), form_data(rule, action="fail"))
    assert response.status_code == 403
    assert client.post(reverse("console:rule-toggle", args=[rule.pk])).status_code == 403
    rule.refresh_from_db()
    assert (rule.action, rule.version, rule.enabled) == ("retry", 1, True)


def test_anonymous_is_sent_to_login(client):
    response = client.get(RULES)
    assert response.status_code == 302 and "/login" in response["Location"]


def test_missing_rule_is_404(client, admin_user):
    client.force_login(admin_user)
    assert client.get("/console/rules/999999/").status_code == 404
    assert client.post("/console/rules/999999/toggle/").status_code == 404


def test_wrong_methods_are_405(client, admin_user):
    rule = EscalationRule.objects.first()
    client.force_login(admin_user)
    assert client.get(reverse("console:rule-toggle", args=[rule.pk])).status_code == 405
    assert client.get(reverse("console:rule-move", args=[rule.pk, "up"])).status_code == 405
    assert client.get("/console/rules/tools/pause/").status_code == 405
    assert client.delete(RULES).status_code == 405


def test_the_nav_link_shows_for_admins_only(client, admin_user, support_user):
    client.force_login(support_user)
    assert b'href="/console/rules/"' not in client.get("/console/").content
    client.force_login(admin_user)
    assert b'href="/console/rules/"' in client.get("/console/").content


# -- create, edit, validation, versions ------------------------------------------------------


def test_creating_a_rule_records_version_1(client, admin_user):
    client.force_login(admin_user)
    response = client.post(NEW, form_data(workflow="test.reply", tool="mail.send"))
    assert response.status_code == 302
    rule = EscalationRule.objects.get(name="Refund tool failing: fail fast")
    assert (rule.version, rule.workflow, rule.tool) == (1, "test.reply", "mail.send")
    version = RuleVersion.objects.get(rule=rule)
    assert (version.version, version.change, version.changed_by) == (1, "created", admin_user)
    assert version.before is None and version.data["tool"] == "mail.send"


def test_an_edit_is_a_new_version_with_before_and_after(client, admin_user):
    rule = EscalationRule.objects.get(name="Retry transient errors")
    client.force_login(admin_user)
    response = client.post(edit_url(rule), form_data(rule, max_attempts=3))
    assert response.status_code == 302
    rule.refresh_from_db()
    assert (rule.max_attempts, rule.version) == (3, 2)
    latest = rule.versions.get(version=2)
    assert latest.change == "updated" and latest.changed_by == admin_user
    assert latest.changes == [("max_attempts", 5, 3)]
    # The history is on the edit page.
    page = client.get(edit_url(rule)).content.decode()
    assert "max_attempts" in page and "v2" in page


def test_saving_an_unchanged_rule_writes_no_version(client, admin_user):
    rule = EscalationRule.objects.get(name="Retry transient errors")
    client.force_login(admin_user)
    client.post(edit_url(rule), form_data(rule))
    rule.refresh_from_db()
    assert rule.version == 1 and rule.versions.count() == 1


def test_an_edit_from_a_stale_page_is_refused(client, admin_user):
    rule = EscalationRule.objects.get(name="Retry transient errors")
    stale = form_data(rule, max_attempts=9)
    client.force_login(admin_user)
    client.post(edit_url(rule), form_data(rule, max_attempts=3))
    response = client.post(edit_url(rule), stale)
    assert response.status_code == 409
    assert "Someone else changed this rule first" in response.content.decode()
    rule.refresh_from_db()
    assert (rule.max_attempts, rule.version) == (3, 2)


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"backoff_base_seconds": 10, "backoff_cap_seconds": 5}, "backoff_cap_seconds",
         "must be at least the base"),
        ({"action": "degrade", "tool": ""}, "tool", "kb.search → kb.faq"),
        ({"action": "degrade", "tool": "mail.send"}, "action", "mail.send has no fallback tool"),
        ({"action": "degrade", "tool": "test.mail_down", "failure_class": "unknown_outcome"},
         "failure_class", "An unknown outcome cannot degrade"),
        ({"action": "degrade", "tool": "test.write_read_fallback"}, "action",
         "its fallback kb.faq is not: the fallback could not do the write"),
        ({"workflow": "test.replly"}, "workflow", "Did you mean test.reply"),
        ({"tool": "mail.sned"}, "tool", "Did you mean mail.send"),
        ({"workflow": "test.reply", "step": "send_replyy"}, "step", "send_reply"),
        ({"failure_class": "timeout", "action": "retry"}, "action", "cannot be retried"),
        ({"action": "wait", "wait_window_seconds": 10, "probe_interval_seconds": 60},
         "probe_interval_seconds", "never be probed"),
        ({"max_attempts": 0}, "max_attempts", "at least 1"),
        ({"action": "launch"}, "action", "not one of the available choices"),
    ],
)  # fmt: skip
def test_invalid_rules_are_refused_with_a_clear_message(client, admin_user, changes, field,
                                                        message):  # fmt: skip
    client.force_login(admin_user)
    count = EscalationRule.objects.count()
    response = client.post(NEW, form_data(**changes))
    assert response.status_code == 422
    assert message in response.context["form"].errors[field][0]
    assert EscalationRule.objects.count() == count
    assert RuleVersion.objects.filter(rule__name="Refund tool failing: fail fast").count() == 0


def test_an_unknown_name_is_saved_when_the_admin_says_so(client, admin_user):
    client.force_login(admin_user)
    response = client.post(NEW, form_data(tool="erp.post", allow_unknown="on"))
    assert response.status_code == 302
    assert EscalationRule.objects.filter(tool="erp.post").exists()


def test_disable_enable_and_move_are_versioned(client, admin_user):
    retry = EscalationRule.objects.get(name="Retry transient errors")  # position 10
    kb = EscalationRule.objects.get(name="Knowledge base failing: answer from the FAQ")  # 5
    client.force_login(admin_user)
    toggle = reverse("console:rule-toggle", args=[retry.pk])
    assert client.post(toggle, {"enabled": "0"}).status_code == 302
    assert client.post(toggle, {"enabled": "0"}).status_code == 302  # a repeat changes nothing
    retry.refresh_from_db()
    assert (retry.enabled, retry.version) == (False, 2)
    client.post(toggle, {"enabled": "1"})
    client.post(reverse("console:rule-move", args=[retry.pk, "up"]))
    retry.refresh_from_db()
    kb.refresh_from_db()
    assert retry.position < kb.position
    assert list(retry.versions.values_list("change", flat=True)) == [
        "moved", "enabled", "disabled", "created"
    ]  # fmt: skip
    assert kb.versions.first().change == "moved"


def test_a_rule_edited_in_the_console_routes_the_next_failure_and_names_its_version(
    client, admin_user, sandbox
):
    rule = EscalationRule.objects.get(name="Retry transient errors")
    client.force_login(admin_user)
    client.post(edit_url(rule), form_data(rule, action="escalate", queue="mail-desk"))
    sandbox.inject("mail", "429", action="send")
    run, _ = engine.start_run(
        "test.reply", {"message": "Hi", "email": "ann@example.com", "ticket": "T-1"}
    )
    run = engine.run_until_quiet(run.pk)
    assert run.status == "needs_human" and run.queue == "mail-desk"
    step = Step.objects.get(run=run, name="send_reply")
    assert step.routing["version"] == 2 and step.routing["action"] == "escalate"
    event = TimelineEvent.objects.get(run=run, verb="step.escalated")
    assert event.data["routing"]["rule"] == "Retry transient errors"
    assert event.data["routing"]["version"] == 2


# -- the tester ------------------------------------------------------------------------------


def test_the_tester_names_the_rule_and_what_it_does(client, admin_user):
    client.force_login(admin_user)
    response = client.get(RULES, {"workflow": "test.reply", "tool": "mail.send",
                                  "failure_class": "transient"})  # fmt: skip
    verdict = response.context["verdict"]
    assert verdict.rule.name == "Retry transient errors"
    assert "retries up to 5 attempts" in verdict.sentence
    assert "“ops” queue" in verdict.sentence
    assert verdict.risk == "medium"  # taken from mail.send
    assert [r.name for r in verdict.also_matching] == ["Anything else: operations"]


def test_the_tester_answers_htmx_with_the_result_only(client, admin_user):
    client.force_login(admin_user)
    response = client.get(
        RULES, {"tool": "kb.search", "failure_class": "outage"},
        HTTP_HX_REQUEST="true", HTTP_HX_TARGET="tester-result",
    )  # fmt: skip
    body = response.content.decode()
    assert body.lstrip().startswith('<div id="tester-result"')
    assert "kb.faq" in body


def test_the_tester_takes_a_past_failure(client, admin_user, sandbox):
    sandbox.inject("mail", "429", action="send")
    run, _ = engine.start_run(
        "test.reply", {"message": "Hi", "email": "ann@example.com", "ticket": "T-1"}
    )
    engine.run_until_quiet(run.pk)
    step = Step.objects.get(run=run, name="send_reply")
    client.force_login(admin_user)
    response = client.get(RULES, {"failure": step.pk})
    assert response.context["query"]["failure_class"] == "transient"
    assert response.context["verdict"].rule.name == "Retry transient errors"


def test_the_tester_says_when_nothing_matches(client, admin_user):
    EscalationRule.objects.update(enabled=False)
    client.force_login(admin_user)
    response = client.get(RULES, {"failure_class": "outage"})
    assert "No enabled rule matches" in response.context["verdict"].sentence


def test_the_tester_lists_each_past_failure_once(client, admin_user, sandbox):
    # Three runs hit the same failure (same workflow, step, tool and class): they route the same
    # way, so the tester lists it once, newest first, saying how often it happened.
    sandbox.inject("mail", "429", action="send", count=6)
    steps = []
    for n in range(3):
        run, _ = engine.start_run(
            "test.reply", {"message": "Hi", "email": f"ann{n}@example.com", "ticket": "T-1"}
        )
        engine.run_until_quiet(run.pk)
        steps.append(Step.objects.get(run=run, name="send_reply"))
    client.force_login(admin_user)
    response = client.get(RULES)
    choices = [label for value, label in response.context["tester"].fields["failure"].choices
               if value]  # fmt: skip
    same = [label for label in choices if label.startswith("test.reply · send_reply · mail.send")]
    assert len(same) == 1, choices
    assert "3 times, last " in same[0] and same[0].endswith(" UTC")
    assert response.context["tester"].fields["failure"].choices[1][0] == steps[-1].pk
    text = response.content.decode()
    assert text.count("test.reply · send_reply · mail.send") == 1


def test_the_testers_last_time_is_when_it_failed_not_when_it_was_resolved(
    client, admin_user, sandbox
):
    """Issue 33 §6: the "last" time was when a person resolved the failure."""
    from datetime import timedelta

    from approvals.rules import _failure_label, recent_failures
    from approvals.viewer_time import format_timestamp

    sandbox.inject("mail", "429", action="send", count=6)
    run, _ = engine.start_run(
        "test.reply", {"message": "Hi", "email": "late@example.com", "ticket": "T-1"}
    )
    engine.run_until_quiet(run.pk)
    step = Step.objects.get(run=run, name="send_reply")
    failed = step.started_at
    resolved = failed + timedelta(hours=3)
    Step.objects.filter(pk=step.pk).update(finished_at=resolved)
    label = _failure_label(next(s for s in recent_failures() if s.pk == step.pk))
    assert f"last failed {format_timestamp(failed)}" in label
    assert format_timestamp(resolved) not in label

"""Empty results and API drift: two failures that each need their own recovery.

A read that finds nothing goes to a person (or to its fallback, when a rule says degrade); a
tool whose API drifted is paused for every run, its admins are told, and the runs go on when an
admin resumes it. Real engine, real HTTP (a scripted endpoint that counts what it receives).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.utils import timezone, translation

from approvals import console, notifications, rules
from approvals.metrics.dashboard import compute as compute_dashboard
from approvals.metrics.window import parse_window
from approvals.models import EscalationRule, NotificationChannel, NotificationDelivery, ToolPause
from runs import engine, tools, workflows
from runs.models import FailureClass, Run, SideEffect, Step, TimelineEvent
from runs.tools import CallContext, ToolError, http_tool, python_tool
from runs.workflows import Workflow, compute, read, side_effect
from tests.approvals.console_helpers import fast_passwords  # noqa: F401  (autouse)
from tests.factories import EscalationRuleFactory

pytestmark = pytest.mark.django_db


class Scripted:
    """An HTTP/JSON endpoint answering each path as scripted, counting the requests it gets."""

    def __init__(self) -> None:
        self.answers: dict[str, tuple[int, object]] = {}
        self.calls: dict[str, int] = {}
        scripted = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                path = self.path.split("?")[0]
                scripted.calls[path] = scripted.calls.get(path, 0) + 1
                status, body = scripted.answers.get(path, (404, {"error": "not found"}))
                payload = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = _answer

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


SERVER = Scripted()


def at(path):
    return lambda: SERVER.url + path


def _profile_shape(response):
    if not isinstance(response, dict) or "email" not in response:
        return f"no email in {sorted(response) if isinstance(response, dict) else response!r}"
    return None


tools.register(http_tool("test.order_get", "GET", at("/orders/get")), replace=True)
tools.register(
    http_tool("test.orders_list", "GET", at("/orders/list"), expects_result=True,
              fallback_tool="test.orders_cache"),
    replace=True,
)  # fmt: skip
tools.register(
    python_tool("test.orders_cache", lambda params, ctx: [{"id": "o-cached"}]), replace=True
)
tools.register(
    http_tool("test.profile_get", "GET", at("/profile/get"), response_check=_profile_shape),
    replace=True,
)
tools.register(
    http_tool("test.profile_put", "POST", at("/profile/put"), side_effect=True,
              target=lambda p: f"profile:{p['id']}"),
    replace=True,
)  # fmt: skip


def _workflow(name, tool):
    return workflows.register(
        Workflow(name, 1, [read("fetch", tool, params=lambda ctx: {"id": ctx.input["id"]}),
                           compute("done", lambda ctx: {"got": ctx.results["fetch"]})]),
        replace=True,
    )  # fmt: skip


workflows.register(
    Workflow("test.classes_profile_put", 1,
             [side_effect("put", "test.profile_put", params=lambda ctx: {"id": ctx.input["id"]})]),
    replace=True,
)  # fmt: skip
_workflow("test.classes_order", "test.order_get")
_workflow("test.classes_orders", "test.orders_list")
_workflow("test.classes_profile", "test.profile_get")


@pytest.fixture(autouse=True)
def fresh_server():
    SERVER.answers.clear()
    SERVER.calls.clear()
    return SERVER


def drive(workflow, id="1"):
    run, _ = engine.start_run(workflow, {"id": id})
    return engine.run_until_quiet(run.pk)


def fetch_step(run):
    return Step.objects.get(run=run, name="fetch")


# -- the mapping ------------------------------------------------------------------------------


def call(tool_name):
    ctx = CallContext(idempotency_key="k-1", run_id="r", step="s", attempt=1, timeout=2.0)
    with pytest.raises(ToolError) as caught:
        tools.get(tool_name).invoke({"id": "1"}, ctx)
    return caught.value.failure_class


@pytest.mark.parametrize(
    ("status", "body", "read_class", "write_class"),
    [
        (404, {"error": "not found"}, "empty_result", "invalid_input"),
        (410, {"error": "gone"}, "empty_result", "invalid_input"),
        (406, {"error": "not acceptable"}, "api_drift", "api_drift"),
        (422, {"error": "unknown field 'nickname'"}, "api_drift", "api_drift"),
        (400, {"detail": "Unsupported parameter: expand"}, "api_drift", "api_drift"),
        (422, {"error": "Additional properties are not allowed ('x' was unexpected)"},
         "api_drift", "api_drift"),
        (422, {"error": {"code": "unknown_field", "message": "tier is not a known field."}},
         "api_drift", "api_drift"),
        (422, {"error": "email is required", "field": "email"}, "invalid_input",
         "invalid_input"),
        (400, "bad request", "invalid_input", "invalid_input"),
        (400, {"error": "unknown API key"}, "invalid_input", "invalid_input"),
        (409, {"error": "unknown field"}, "invalid_input", "invalid_input"),
    ],
)  # fmt: skip
def test_error_answers_map_to_their_class(status, body, read_class, write_class):
    SERVER.answers["/profile/get"] = SERVER.answers["/profile/put"] = (status, body)
    assert call("test.profile_get") == read_class
    # A write's 404 keeps invalid_input: its refusal is for a person to check, never a retry.
    assert call("test.profile_put") == write_class


def test_an_empty_answer_is_only_a_failure_for_a_tool_that_expects_one():
    tool = tools.get("test.orders_list")
    for empty in (None, [], {}, ""):
        with pytest.raises(ToolError) as caught:
            tool.check_read(empty)
        assert caught.value.failure_class == FailureClass.EMPTY_RESULT
    tool.check_read([{"id": "o-1"}])
    tools.get("test.order_get").check_read([])  # expects_result is off by default
    with pytest.raises(ToolError) as caught:
        tools.get("test.profile_get").check_read({"name": "Ann"})
    assert caught.value.failure_class == FailureClass.API_DRIFT
    assert "no email" in caught.value.message
    tools.get("test.profile_put").check_read({})  # a write's answer is its proof: never checked


# -- empty results ----------------------------------------------------------------------------


def test_a_read_answering_404_goes_to_a_person_as_an_empty_result():
    run = drive("test.classes_order")
    assert run.status == Run.Status.NEEDS_HUMAN
    assert run.queue == "support"
    step = fetch_step(run)
    assert step.status == "needs_human"
    assert step.error_class == FailureClass.EMPTY_RESULT
    assert "404" in step.last_error
    event = TimelineEvent.objects.get(run=run, verb="step.escalated")
    assert event.data["routing"]["rule"] == "Empty result: a person checks the data"
    assert event.data["routing"]["failure_class"] == "empty_result"
    assert SERVER.calls == {"/orders/get": 1}  # not retried: the data is missing, not the system


def test_an_empty_list_from_a_tool_that_expects_a_result_is_an_empty_result():
    SERVER.answers["/orders/list"] = (200, [])
    run = drive("test.classes_orders")
    assert run.status == Run.Status.NEEDS_HUMAN
    assert fetch_step(run).error_class == FailureClass.EMPTY_RESULT
    assert not Step.objects.filter(run=run, name="done").exists()


def test_an_empty_result_degrades_to_the_fallback_under_a_degrade_rule():
    SERVER.answers["/orders/list"] = (200, [])
    EscalationRuleFactory(position=0, name="orders empty: use the cache",
                          tool="test.orders_list", failure_class="empty_result",
                          action="degrade", queue="support")  # fmt: skip
    run = drive("test.classes_orders")
    assert run.status == Run.Status.SUCCEEDED
    step = fetch_step(run)
    assert step.status == "degraded" and step.error_class == "empty_result"
    assert step.result["fallback_tool"] == "test.orders_cache"
    assert step.result["response"] == [{"id": "o-cached"}]
    event = TimelineEvent.objects.get(run=run, verb="step.degraded")
    assert event.data["failure_class"] == "empty_result"


def test_a_reads_fallback_that_writes_is_never_called(monkeypatch):
    # Routing decides every degrade before anything is called: a read's fallback must read too
    # (a side-effect tool would be called without its snapshot and key).
    from runs import tools

    SERVER.answers["/orders/list"] = (200, [])
    EscalationRuleFactory(position=0, name="orders empty: use the cache",
                          tool="test.orders_list", failure_class="empty_result",
                          action="degrade", queue="support")  # fmt: skip
    calls = []
    real_get = tools.get

    def writing_cache(name):
        tool = real_get(name)
        if name != "test.orders_cache":
            return tool
        return tools.Tool(
            **{**tool.__dict__, "side_effect": True, "invoke": lambda p, c: calls.append(p)}
        )

    monkeypatch.setattr(tools, "get", writing_cache)
    run = drive("test.classes_orders")
    assert run.status == Run.Status.NEEDS_HUMAN
    step = fetch_step(run)
    assert step.status != "degraded"
    assert "its fallback test.orders_cache is a side-effect tool" in step.last_error
    assert calls == []


# -- API drift --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "drifted",
    [(406, {"error": "application/vnd.v1+json is no longer served"}), (200, {"name": "Ann"})],
    ids=["406", "response-check"],
)
def test_api_drift_pauses_the_tool_tells_the_admins_and_holds_every_run(
    client, admin_user, drifted
):
    channel = NotificationChannel.objects.create(queue="admin", kind="email",
                                                 target="admins@example.com")  # fmt: skip
    SERVER.answers["/profile/get"] = drifted
    run = drive("test.classes_profile")

    # The tool is paused by TaskPilots, naming the drift; the step is held by it, not failed.
    pause = ToolPause.objects.get(tool="test.profile_get", resumed_at__isnull=True)
    assert pause.paused_by is None and pause.reason.startswith("API drift: ")
    assert run.status == Run.Status.WAITING
    step = fetch_step(run)
    assert step.status == "waiting" and step.error_class == FailureClass.API_DRIFT
    assert step.routing["pause"] == pause.pk and step.routing["paused_tool"] == pause.tool
    opened = TimelineEvent.objects.get(run=run, verb="tool.paused")
    assert opened.data["pause"] == pause.pk and opened.data["queue"] == "admin"
    assert opened.data["routing"]["rule"] == "API drift: pause the tool, admins fix it"
    held = TimelineEvent.objects.get(run=run, verb="step.tool_paused")
    assert held.data["pause"] == pause.pk
    assert held.data["routing"]["failure_class"] == "api_drift"
    assert run.failure_count == 1 and step.attempts == 1

    # The admins are notified (the sweeper records it from the timeline).
    notifications.scan_timeline()
    delivery = NotificationDelivery.objects.get(run=run, event="tool_paused")
    assert delivery.channel == channel
    assert "paused test.profile_get" in delivery.payload["text"]

    # A second run that needs the tool is held too, and the tool is not called for it.
    other = drive("test.classes_profile", id="2")
    assert other.status == Run.Status.WAITING
    assert fetch_step(other).routing["pause"] == pause.pk
    assert fetch_step(other).attempts == 0 and other.failure_count == 0
    assert not TimelineEvent.objects.filter(run=other, verb="tool.paused").exists()
    assert SERVER.calls == {"/profile/get": 1}

    # The tools page says who paused it and what waits.
    client.force_login(admin_user)
    page = client.get("/console/rules/tools/").content.decode()
    assert "by TaskPilots (API drift)" in page and "2 steps waiting" in page

    # The adapter is fixed, an admin resumes the tool: both runs go on.
    SERVER.answers["/profile/get"] = (200, {"email": "ann@example.com"})
    assert client.post("/console/rules/tools/resume/", {"tool": pause.tool}).status_code == 302
    engine.sweep()
    for held_run in (run, other):
        held_run = engine.run_until_quiet(held_run.pk)
        assert held_run.status == Run.Status.SUCCEEDED
        assert fetch_step(held_run).result == {"email": "ann@example.com"}
    assert SERVER.calls == {"/profile/get": 3}
    assert ToolPause.objects.get(pk=pause.pk).resumed_by == admin_user


def test_a_write_refused_for_drift_is_held_and_made_once_after_the_resume(admin_user):
    # A 406 is a refusal: nothing landed, so the held write may be made again after the resume,
    # under the same key, and lands exactly once.
    SERVER.answers["/profile/put"] = (406, {"error": "v1 retired"})
    run, _ = engine.start_run("test.classes_profile_put", {"id": "7"})
    run = engine.run_until_quiet(run.pk)
    assert run.status == Run.Status.WAITING
    step = Step.objects.get(run=run, name="put")
    assert step.status == "waiting" and step.error_class == FailureClass.API_DRIFT
    effect = SideEffect.objects.get(step=step)
    assert effect.status == "not_committed"
    assert SERVER.calls == {"/profile/put": 1}

    SERVER.answers["/profile/put"] = (200, {"id": "p-7"})
    rules.resume_tool("test.profile_put", admin_user)
    engine.sweep()
    run = engine.run_until_quiet(run.pk)
    assert run.status == Run.Status.SUCCEEDED
    assert SERVER.calls == {"/profile/put": 2}
    effects = [(e.status, e.idempotency_key) for e in SideEffect.objects.filter(step=step)]
    assert effects == [("committed", effect.idempotency_key)]
    # Replaying the finished step (reset to pending) sends nothing more: the key is committed.
    Step.objects.filter(run=run).update(status="pending", result=None)
    Run.objects.filter(pk=run.pk).update(status="running", finished_at=None)
    assert engine.run_until_quiet(run.pk).status == Run.Status.SUCCEEDED
    assert SERVER.calls == {"/profile/put": 2}


def test_drift_under_a_fail_rule_fails_and_pauses_nothing():
    # The pause is the escalate route's handling of drift; an admin's fail rule still fails.
    EscalationRuleFactory(position=0, failure_class="api_drift", action="fail")
    SERVER.answers["/profile/get"] = (406, {"error": "gone to v2"})
    run = drive("test.classes_profile")
    assert run.status == Run.Status.FAILED
    assert not ToolPause.objects.exists()


# -- rules ------------------------------------------------------------------------------------


def test_the_default_rules_route_the_new_classes_before_the_catch_all():
    by_class = {r.failure_class: r for r in EscalationRule.objects.all()}
    catch_all = EscalationRule.objects.get(name="Anything else: operations")
    assert by_class["empty_result"].action == "escalate"
    assert by_class["empty_result"].queue == "support"
    assert by_class["api_drift"].action == "escalate" and by_class["api_drift"].queue == "admin"
    assert by_class["empty_result"].position < catch_all.position
    assert by_class["api_drift"].position < catch_all.position
    assert by_class["api_drift"].versions.count() == 1


def test_the_rules_form_offers_the_new_classes_and_lets_empty_result_degrade(client, admin_user):
    client.force_login(admin_user)
    form = client.get("/console/rules/new/").context["form"]
    choices = dict(form.fields["failure_class"].choices)
    # the one vocabulary (approvals/console/labels.py)
    assert choices["empty_result"] == "Nothing found"
    assert choices["api_drift"] == "API changed"
    data = {
        "name": "Search found nothing: answer from the FAQ", "position": 4, "enabled": "on",
        "tool": "kb.search", "failure_class": "empty_result", "action": "degrade",
        "queue": "support", "max_attempts": 5, "backoff_base_seconds": 1,
        "backoff_cap_seconds": 60, "wait_window_seconds": 900, "probe_interval_seconds": 30,
        "approval_sla_seconds": 0, "escalate_after_seconds": 0,
    }  # fmt: skip
    assert client.post("/console/rules/new/", data).status_code == 302
    rule = EscalationRule.objects.get(name=data["name"])
    assert (rule.failure_class, rule.action) == ("empty_result", "degrade")
    # A tool without a fallback cannot degrade, whatever the class.
    response = client.post("/console/rules/new/", {**data, "name": "x", "tool": "crm.lookup"})
    assert response.status_code == 422


def test_the_rule_tester_names_the_drift_rule(client, admin_user):
    client.force_login(admin_user)
    response = client.get("/console/rules/", {"tool": "test.profile_get",
                                              "failure_class": "api_drift"})  # fmt: skip
    verdict = response.context["verdict"]
    assert verdict.rule.name == "API drift: pause the tool, admins fix it"
    assert "pauses test.profile_get for every run and tells the “admin” queue" in verdict.sentence


def test_the_new_classes_read_in_chinese():
    with translation.override("zh-hans"):
        assert str(FailureClass.EMPTY_RESULT.label) == "结果为空"
        assert str(FailureClass.API_DRIFT.label) == "API 版本漂移"
        assert str(console.REASON_LABELS[FailureClass.API_DRIFT]) == "API 已变更"


def test_the_metrics_count_a_drift_once_and_not_the_runs_it_holds():
    SERVER.answers["/profile/get"] = (406, {"error": "v1 retired"})
    drive("test.classes_profile")
    drive("test.classes_profile", id="2")  # held by the pause: not a failure of its own
    now = timezone.now()
    data = compute_dashboard(parse_window({"window": "24h"}, now=now), now=now).as_json()
    figure = data["figures"]["tool_failure_rate"]
    assert figure["counts"] == [1, 1]  # one failed attempt of one made
    assert figure["extra"]["by_class"] == {"api_drift": {"failures": 1, "rate": 1.0}}


def test_the_sandbox_reads_check_their_answers_shape():
    crm, kb = tools.get("crm.lookup"), tools.get("kb.search")
    crm.check_read({"found": False, "contact": None, "matches": 0})
    kb.check_read({"results": []})
    for tool, drifted in ((crm, {"contacts": []}), (kb, ["an", "array"])):
        with pytest.raises(ToolError) as caught:
            tool.check_read(drifted)
        assert caught.value.failure_class == FailureClass.API_DRIFT

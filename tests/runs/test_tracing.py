"""OpenTelemetry traces of runs (taskpilots/otel, docs/deploy.md "Traces"): real workflows driven
through the engine in-process with the spans registered on its hook points and kept in memory,
and a process with tracing off that imports nothing of OpenTelemetry."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from agents import Agent, function_tool
from agents.testing import ScriptedModel, assistant_message, function_call
from django.db import connection
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import TraceIdRatioBased
from opentelemetry.trace import StatusCode

from approvals import actions
from approvals.models import ApprovalRequest
from runs import engine, hooks, tools, traceids, workflows
from runs.agents.sdk import ToolPolicy, register_agent
from runs.models import SideEffect, Step
from runs.workflows import Workflow, side_effect
from taskpilots.env import format_database_url
from taskpilots.otel import setup
from taskpilots.otel import spans as otel_spans
from tests.runs import flows

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
REPLY_INPUT = {"message": "Where is my refund?", "email": "ann@example.com", "ticket": "T-1"}


@pytest.fixture
def exported(django_capture_on_commit_callbacks):
    """The spans this process makes while the test runs, kept in memory. The test's own
    transaction never commits: the on-commit callbacks (committed events) run as the test ends
    each `with committing():` block."""
    exporter = InMemorySpanExporter()
    registered = otel_spans.register(setup.make_provider(SimpleSpanProcessor(exporter)))
    exporter.committing = lambda: django_capture_on_commit_callbacks(execute=True)
    yield exporter
    otel_spans.unregister(registered)
    assert not (hooks.tracers or hooks.tool_wrappers or hooks.event_observers)


def drive(run):
    return engine.run_until_quiet(run.pk)


def by_name(exporter, prefix: str) -> list:
    return [s for s in exporter.get_finished_spans() if s.name.startswith(prefix)]


def one(exporter, name: str):
    (span,) = [s for s in exporter.get_finished_spans() if s.name == name]
    return span


def parent_id(span) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def ns(moment) -> int:
    return int(moment.timestamp() * 1_000_000) * 1000


def test_a_run_is_one_trace_with_a_span_per_step_and_per_tool_call(exported, sandbox):
    with exported.committing():
        run, _ = engine.start_run("test.reply", REPLY_INPUT)
        run = drive(run)
    assert run.status == "succeeded"
    trace_id, run_span_id = traceids.ids(run.pk)
    spans = exported.get_finished_spans()
    assert {s.context.trace_id for s in spans} == {trace_id}

    # The run's own span is the root, with the ids every process derives from the run's id.
    root = one(exported, "run test.reply")
    assert root.parent is None and root.context.span_id == run_span_id
    assert root.attributes["taskpilots.run.id"] == str(run.pk)
    assert root.attributes["taskpilots.run.status"] == "succeeded"
    assert root.start_time == ns(run.created_at) and root.end_time >= root.start_time

    # A span per step, children of the run's; the two that change nothing went ahead.
    steps = {s.attributes["taskpilots.step.name"]: s for s in by_name(exported, "step ")}
    assert list(steps) == ["classify", "customer", "send_reply", "close_ticket"]
    assert {parent_id(s) for s in steps.values()} == {run_span_id}
    assert all(s.attributes["taskpilots.outcome"] == "succeeded" for s in steps.values())
    assert steps["classify"].attributes["taskpilots.step.kind"] == "compute"
    assert steps["classify"].attributes.get("taskpilots.step.ahead") is True
    assert steps["send_reply"].attributes.get("taskpilots.step.ahead") is None

    # A span per tool call, a child of its step's span, with the call's key and receipt.
    tools = {s.attributes["taskpilots.tool.name"]: s for s in by_name(exported, "tool ")}
    assert list(tools) == ["crm.lookup", "mail.send", "tickets.update"]
    assert parent_id(tools["crm.lookup"]) == steps["customer"].context.span_id
    assert "taskpilots.idempotency_key" not in tools["crm.lookup"].attributes
    for step_name, tool_name in (("send_reply", "mail.send"), ("close_ticket", "tickets.update")):
        effect = SideEffect.objects.get(run=run, tool=tool_name)
        call, step = tools[tool_name], steps[step_name]
        assert parent_id(call) == step.context.span_id
        assert call.attributes["taskpilots.run.id"] == str(run.pk)
        assert call.attributes["taskpilots.step.name"] == step_name
        assert call.attributes["taskpilots.step.kind"] == "side_effect"
        assert call.attributes["taskpilots.idempotency_key"] == effect.idempotency_key
        assert step.attributes["taskpilots.idempotency_key"] == effect.idempotency_key
        assert call.attributes["taskpilots.external_id"] == effect.external_id
        assert call.attributes["taskpilots.outcome"] == "succeeded"


def test_a_failed_attempt_says_its_failure_class_and_the_retry_is_a_second_span(exported):
    flows.CALLS.clear()
    run, _ = engine.start_run("test.flaky", {"fail_times": 1})
    run = drive(run)
    assert run.status != "succeeded"
    Step.objects.filter(run=run).update(next_attempt_at=run.created_at)
    run = drive(run)
    assert run.status == "succeeded"

    first, second = by_name(exported, "step write")
    assert [
        first.attributes["taskpilots.step.attempt"],
        second.attributes["taskpilots.step.attempt"],
    ] == [1, 2]
    assert first.attributes["taskpilots.outcome"] == "failed"
    assert first.attributes["taskpilots.failure_class"] == "transient"
    assert first.status.status_code == StatusCode.ERROR
    assert second.attributes["taskpilots.outcome"] == "succeeded"
    assert second.status.status_code == StatusCode.UNSET
    failed_call, call = by_name(exported, "tool test.flaky")
    assert failed_call.attributes["error.type"] == "transient"
    assert failed_call.status.status_code == StatusCode.ERROR
    assert parent_id(failed_call) == first.context.span_id
    assert parent_id(call) == second.context.span_id
    # Both attempts, and both calls, under the one key.
    key = SideEffect.objects.get(run=run).idempotency_key
    assert {
        s.attributes["taskpilots.idempotency_key"] for s in (first, second, failed_call, call)
    } == {key}


def test_a_persons_decision_is_a_span_of_the_runs_trace(exported, sandbox, support_user):
    with exported.committing():
        run, _ = engine.start_run("test.refund", {"payment": "p-1", "amount": 250})
        run = drive(run)
        assert run.status == "needs_human"
        approval = ApprovalRequest.objects.get(run=run)
        actions.decide_approval(approval.pk, support_user, "approved")
        drive(run)
    trace_id, run_span_id = traceids.ids(run.pk)
    decision = one(exported, "decision approve")
    assert decision.context.trace_id == trace_id and parent_id(decision) == run_span_id
    assert decision.attributes["taskpilots.decision.verb"] == "approve"
    assert decision.attributes["taskpilots.decision.actor"] == f"user:{support_user.username}"
    assert decision.attributes["taskpilots.step.name"] == "approve"
    assert decision.attributes["taskpilots.approval.id"] == approval.pk
    # Asking for the approval, then the call it allowed, in the same trace.
    asked = by_name(exported, "step approve")
    assert [s.attributes["taskpilots.outcome"] for s in asked] == ["approval_requested"]
    refund = one(exported, "tool payments.refund")
    assert refund.context.trace_id == trace_id
    assert refund.attributes["taskpilots.idempotency_key"].startswith(f"tp-{run.pk}-refund")


def test_a_run_a_person_ends_elsewhere_gets_its_span_from_the_run_row(
    request, sandbox, support_user
):
    run, _ = engine.start_run("test.refund", {"payment": "p-2", "amount": 250})
    assert drive(run).status == "needs_human"  # its steps were executed by an untraced process
    exported = request.getfixturevalue("exported")
    with exported.committing():
        actions.cancel_run(run.pk, support_user, reason="the customer withdrew")
    run.refresh_from_db()
    assert run.status == "cancelled"
    root = one(exported, "run test.refund")
    assert root.parent is None and root.context.span_id == traceids.ids(run.pk)[1]
    assert root.start_time == ns(run.created_at)
    assert root.attributes["taskpilots.run.status"] == "cancelled"
    assert root.attributes["taskpilots.actor"] == f"user:{support_user.username}"
    assert parent_id(one(exported, "decision cancel")) == root.context.span_id


@function_tool
def look_up_order(order_id: str) -> dict:
    """Look an order up."""
    return {"order_id": order_id, "total": 80.0}


def test_an_agents_model_requests_are_spans_of_their_turns(exported):
    model = ScriptedModel(
        [
            [function_call("look_up_order", {"order_id": "o-1"}, call_id="c-1")],
            [assistant_message("It is on its way.")],
        ]
    )
    agent = Agent(name="order-desk", instructions="Help.", model=model, tools=[look_up_order])
    register_agent(
        "test.traced_agent", agent, tools={"look_up_order": ToolPolicy(side_effect=False)}
    )
    run, _ = engine.start_run("test.traced_agent", {"message": "Where is o-1?"})
    assert drive(run).status == "succeeded"

    steps = {s.attributes["taskpilots.step.name"]: s for s in by_name(exported, "step ")}
    requests = by_name(exported, "chat")
    assert len(requests) == len(model.calls) == 2
    assert [parent_id(r) for r in requests] == [
        steps["turn:1"].context.span_id,
        steps["turn:2"].context.span_id,
    ]
    for request in requests:
        assert request.attributes["gen_ai.operation.name"] == "chat"
        assert request.attributes["gen_ai.agent.name"] == "order-desk"
        assert request.attributes["taskpilots.run.id"] == str(run.pk)
        assert request.attributes["taskpilots.outcome"] == "succeeded"
    (call,) = by_name(exported, "tool ")
    assert parent_id(call) == steps["call:1.0:look_up_order"].context.span_id


class _Broken:
    def start(self, what, subject):
        raise RuntimeError("cannot start")

    def end(self, token, result, error):
        raise RuntimeError("cannot end")


def test_a_tracer_that_fails_changes_neither_the_result_nor_the_error():
    broken = _Broken()
    hooks.trace(broken)
    try:
        assert hooks.traced("step", None, lambda: 42) == 42
        with pytest.raises(KeyError):
            hooks.traced("step", None, lambda: {}["missing"])
    finally:
        hooks.tracers.remove(broken)


def test_trace_ids_follow_from_the_run_and_sample_runs_evenly():
    run_id = uuid.uuid4()
    assert traceids.ids(run_id) == traceids.ids(str(run_id))
    assert traceids.trace_id_hex(run_id) == f"{traceids.ids(run_id)[0]:032x}"
    assert traceids.trace_id_hex(run_id) != run_id.hex
    # A ratio sampler keeps about the share it is asked for (with the UUIDs themselves as trace
    # ids, it would keep none: their variant bits put the low 64 bits above half the range).
    sampler = TraceIdRatioBased(0.25)
    runs = [uuid.uuid4() for _ in range(4000)]
    kept = sum(
        sampler.should_sample(None, traceids.ids(r)[0], "run").decision.is_sampled() for r in runs
    )
    assert 800 < kept < 1200
    assert not any(sampler.should_sample(None, r.int, "run").decision.is_sampled() for r in runs)


# -- a process of its own: the switch, the instrumentation and what is imported -------------

PROCESS = """
import json, os, sys
os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
import django
django.setup()
from django.conf import settings
from django.db import transaction
from django.test import Client
from runs import engine, hooks, tasks, tools, workflows
from runs.tools import python_tool
from runs.workflows import Workflow, compute, read, side_effect

tools.register(python_tool("otel.read", lambda p, c: {"n": 1}), replace=True)
tools.register(python_tool("otel.write", lambda p, c: {"id": "w-1"}, side_effect=True,
                           dedupes_by_key=True, target=lambda p: "thing:1"), replace=True)
workflows.register(Workflow("otel.check", 1, [
    compute("plan", lambda ctx: 1),
    read("fetch", "otel.read", params=lambda ctx: {}),
    side_effect("write", "otel.write", params=lambda ctx: {"x": 1}),
]), replace=True)
exporter = None
if settings.OTEL:
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from taskpilots.otel import setup
    exporter = InMemorySpanExporter()
    setup.installed.provider.add_span_processor(SimpleSpanProcessor(exporter))
# The task as a worker runs it, through Celery's tracing (its signals), in a transaction this
# process rolls back: the test database stays as it was.
tasks.close_old_connections = lambda: None
with transaction.atomic():
    run, _ = engine.start_run("otel.check", {})
    tasks.advance_run.apply(args=[str(run.pk)])
    run.refresh_from_db()
    status, run_id = run.status, str(run.pk)
    transaction.set_rollback(True)
http = Client().get("/console/").status_code
spans = [
    {"name": s.name, "trace": f"{s.context.trace_id:032x}", "span": s.context.span_id,
     "parent": s.parent.span_id if s.parent else None,
     "links": [link.context.span_id for link in s.links]}
    for s in (exporter.get_finished_spans() if exporter else [])
]
print(json.dumps({
    "status": status, "run": run_id, "http": http, "spans": spans,
    "middleware": settings.MIDDLEWARE[0],
    "hooks": [len(hooks.tracers), len(hooks.tool_wrappers), len(hooks.event_observers)],
    "opentelemetry": sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry"),
}))
"""


def _process(**env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("TASKPILOTS_OTEL", "OTEL_"))}
    clean.update(DATABASE_URL=format_database_url(connection.settings_dict), **env)
    result = subprocess.run(
        [sys.executable, "-c", PROCESS],
        cwd=ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_tracing_off_imports_nothing_of_opentelemetry_and_registers_nothing():
    seen = _process()
    assert seen["status"] == "succeeded" and seen["http"] == 302
    assert seen["opentelemetry"] == []
    assert seen["hooks"] == [0, 0, 0]
    assert seen["middleware"] == "runs.api.middleware.ApiErrorShapeMiddleware"


def test_tracing_on_traces_the_engine_django_and_celery_in_every_process():
    # The same process with TASKPILOTS_OTEL=1: what the test above sees is what it would see.
    seen = _process(TASKPILOTS_OTEL="1", OTEL_TRACES_EXPORTER="none")
    assert seen["status"] == "succeeded" and seen["http"] == 302
    assert "opentelemetry.sdk.trace" in seen["opentelemetry"]
    assert seen["hooks"] == [1, 1, 1]
    assert seen["middleware"].startswith("opentelemetry.instrumentation.django")
    spans = seen["spans"]
    names = [s["name"] for s in spans]
    assert "GET console/" in names, names  # the request, traced by Django's middleware
    (task,) = [s for s in spans if s["name"] == "run/runs.tasks.advance_run"]
    steps = [s for s in spans if s["name"].startswith("step ")]
    assert [s["name"] for s in steps] == ["step plan", "step fetch", "step write"]
    # The steps are the run's trace, each linked to the Celery task that executed it.
    trace_id, run_span_id = traceids.ids(seen["run"])
    assert {s["trace"] for s in steps} == {f"{trace_id:032x}"}
    assert {s["parent"] for s in steps} == {run_span_id}
    assert all(s["links"] == [task["span"]] for s in steps)


class _Receiver:
    """An HTTP service on a free local port that keeps the headers of every request it gets."""

    def __init__(self):
        self.headers: list[dict[str, str]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                receiver.headers.append({k.lower(): v for k, v in self.headers.items()})
                body = json.dumps({"id": f"msg-{len(receiver.headers)}"}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/send"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def receiver():
    service = _Receiver()
    yield service
    service.server.shutdown()
    service.server.server_close()


def _http_mail_run(url: str):
    tools.register(
        tools.http_tool(
            "test.traced_http_mail",
            "POST",
            url,
            side_effect=True,
            target=lambda p: f"mailbox:{p['to']}",
        ),
        replace=True,
    )
    step = side_effect("send", "test.traced_http_mail", params=lambda ctx: {"to": "ann"})
    workflows.register(Workflow("test.traced_http", 1, [step]), replace=True)
    return engine.start_run("test.traced_http", {})[0]


def test_an_http_tools_request_carries_the_trace_context_of_its_call(exported, receiver):
    with exported.committing():
        run = drive(_http_mail_run(receiver.url))
    assert run.status == "succeeded"
    (headers,) = receiver.headers
    # W3C trace context: version-trace id-parent span id-flags; the parent is the call's span.
    version, trace_id, parent, flags = headers["traceparent"].split("-")
    call = one(exported, "tool test.traced_http_mail")
    assert (version, flags) == ("00", "01")
    assert int(trace_id, 16) == traceids.ids(run.pk)[0] == call.context.trace_id
    assert int(parent, 16) == call.context.span_id
    assert headers["idempotency-key"] == SideEffect.objects.get(run=run).idempotency_key


def test_without_tracing_an_http_tool_sends_no_trace_context(receiver):
    assert not hooks.propagators
    run = drive(_http_mail_run(receiver.url))
    assert run.status == "succeeded"
    (headers,) = receiver.headers
    assert "traceparent" not in headers and "tracestate" not in headers

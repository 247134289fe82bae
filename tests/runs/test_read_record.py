"""A read step keeps what it was asked and a bounded summary of what came back, with its stage:
on its step row (written with its outcome, on the hot path and the ordinary one alike), in the
rehydration document, and on the run page (escaped)."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.test import Client
from django.urls import reverse

from runs import engine, tools, workflows
from runs.engine import inline
from runs.engine.outcomes import Succeeded
from runs.models import READ_PREVIEW_CHARS, Run, Step, digest
from runs.rehydration import rehydration_document
from runs.tools import python_tool
from runs.workflows import Workflow, compute, read

pytestmark = pytest.mark.django_db

CALLS: list[dict] = []


def _lookup(params, ctx):
    CALLS.append(params)
    return {"name": "<b>Ann</b>", "notes": "n" * 5000, "tags": ["a", "b"]}


tools.register(python_tool("test.inputs_lookup", _lookup), replace=True)
workflows.register(
    Workflow(
        "test.inputs_read",
        1,
        [
            read("lookup", "test.inputs_lookup",
                 params=lambda ctx: {"q": ctx.input["q"], "limit": 3}, stage="research"),
            compute("use", lambda ctx: {"name": ctx.results["lookup"]["name"]}, stage="answer"),
        ],
    ),
    replace=True,
)  # fmt: skip

QUERY = "<script>alert(1)</script>"


@pytest.fixture(params=[True, False], ids=["hot_path", "ordinary"])
def hot(request):
    previous = settings.TASKPILOTS["HOT_PATH"]
    settings.TASKPILOTS["HOT_PATH"] = request.param
    yield request.param
    settings.TASKPILOTS["HOT_PATH"] = previous


@pytest.fixture
def inline_records(monkeypatch):
    """Which steps the hot path recorded (record_and_continue answered something, or a read
    went ahead of its claim)."""
    recorded = []
    original = inline.record_and_continue

    def spy(claim, outcome, *, go_on):
        answer = original(claim, outcome, go_on=go_on)
        if answer is not None:
            recorded.append(claim.step.name)
        return answer

    def ahead_spy(run, step, *args):
        answer = original_ahead(run, step, *args)
        if isinstance(answer, Succeeded):  # a read recorded ahead of its claim
            recorded.append(step.name)
        return answer

    original_ahead = inline._ahead
    monkeypatch.setattr(inline, "record_and_continue", spy)
    monkeypatch.setattr(inline, "_ahead", ahead_spy)
    return recorded


def run_read() -> Run:
    CALLS.clear()
    run, _ = engine.start_run("test.inputs_read", {"q": QUERY})
    run = engine.run_until_quiet(run.pk)
    assert run.status == Run.Status.SUCCEEDED
    assert CALLS == [{"q": QUERY, "limit": 3}]
    return run


def test_the_read_step_records_params_summary_and_stage(hot, inline_records):
    run = run_read()
    assert ("lookup" in inline_records) is hot  # both paths are the ones under test
    step = Step.objects.get(run=run, name="lookup")
    assert step.stage == "research"
    assert step.read_record["params"] == {"q": QUERY, "limit": 3}
    output = step.read_record["output"]
    response = step.result
    assert output["type"] == "object" and output["length"] == 3
    assert output["sha256"] == digest(response)
    assert output["size"] > 5000 and len(output["preview"]) == READ_PREVIEW_CHARS
    assert output["preview"].startswith('{"name":"<b>Ann</b>"')
    # Not a read: nothing kept.
    assert Step.objects.get(run=run, name="use").read_record == {}


def test_both_paths_record_the_same(inline_records):
    records = []
    for hot in (True, False):
        settings.TASKPILOTS["HOT_PATH"] = hot
        try:
            records.append(Step.objects.get(run=run_read(), name="lookup").read_record)
        finally:
            settings.TASKPILOTS["HOT_PATH"] = True
    assert records[0] == records[1] and records[0]
    assert inline_records.count("lookup") == 1


def test_large_params_are_kept_as_a_digest_and_a_preview(hot):
    big = "q" * 10_000
    run, _ = engine.start_run("test.inputs_read", {"q": big})
    run = engine.run_until_quiet(run.pk)
    params = Step.objects.get(run=run, name="lookup").read_record["params"]
    assert params["truncated"] is True
    assert params["sha256"] == digest({"q": big, "limit": 3})
    assert len(params["preview"]) == READ_PREVIEW_CHARS


def test_the_rehydration_document_lists_the_reads(hot):
    run = run_read()
    reads = rehydration_document(run)["reads"]
    assert [(r["step"], r["stage"], r["tool"]) for r in reads] == [
        ("lookup", "research", "test.inputs_lookup")
    ]
    assert reads[0]["params"] == {"q": QUERY, "limit": 3}
    assert reads[0]["output"]["type"] == "object"


def test_the_run_page_shows_them_escaped(hot, support_user):
    run = run_read()
    http = Client()
    http.force_login(support_user)
    url = reverse("console:run-detail", args=[run.pk])
    page = http.get(f"{url}?tab=steps").content.decode()
    assert "What the read was asked" in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<script>alert(1)" not in page
    assert "&lt;b&gt;Ann&lt;/b&gt;" in page and "<b>Ann</b>" not in page
    assert digest(Step.objects.get(run=run, name="lookup").result)[:12] in page

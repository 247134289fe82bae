"""A message that hints several runs (runs.engine.dispatch.hint_soon, runs.tasks.advance_runs):
its task advances them one after another while each is quick, and hands the rest on the moment
one waits on the outside world or its turn is over, so no run waits behind another's call."""

from __future__ import annotations

import sys
import time
import uuid

import pytest
from django.conf import settings

import runs.engine.execute  # noqa: F401  (the module: runs.engine.execute is also a function)
from runs import engine, tools, workflows
from runs.models import Run
from runs.tools import python_tool
from runs.workflows import Workflow, compute, read
from taskpilots.celery import app as celery_app
from tests.worker import reading_queue

execute = sys.modules["runs.engine.execute"]

pytestmark = pytest.mark.django_db


def _sleep_then_answer(params, ctx):
    time.sleep(params["seconds"])
    return {"slept": params["seconds"]}


tools.register(python_tool("test.batch.sleep", _sleep_then_answer), replace=True)
workflows.register(
    Workflow(
        "test.batch.one_call",
        1,
        [read("call", "test.batch.sleep", params=lambda ctx: {"seconds": ctx.input["seconds"]})],
    ),
    replace=True,
)
workflows.register(
    Workflow(
        "test.batch.quick", 1, [compute("add", lambda ctx: {"sum": ctx.input["seconds"] + 1})]
    ),
    replace=True,
)


@pytest.fixture
def hints():
    """What this test's hints send, read from a queue of its own on the configured broker."""
    name = f"tp-test-{uuid.uuid4().hex[:10]}"
    previous = celery_app.conf.task_default_queue, settings.TASKPILOTS["DISPATCH"]
    celery_app.conf.task_default_queue = name
    try:
        with reading_queue(name) as simple:
            yield simple
    finally:
        celery_app.conf.task_default_queue, settings.TASKPILOTS["DISPATCH"] = previous


def _runs(count: int, seconds: float = 0, workflow: str = "test.batch.quick") -> list[str]:
    settings.TASKPILOTS["DISPATCH"] = "none"  # created quietly; the test hands them over
    ids = [str(engine.start_run(workflow, {"seconds": seconds})[0].pk) for _ in range(count)]
    settings.TASKPILOTS["DISPATCH"] = "celery"
    return ids


def _statuses(ids) -> list[str]:
    by_id = dict(Run.objects.filter(pk__in=ids).values_list("pk", "status"))
    return [by_id[uuid.UUID(run_id)] for run_id in ids]


def test_quick_runs_of_a_batch_are_all_advanced_by_its_task(hints):
    # Quick runs: computed, no call (a call counts as waiting past 2 ms, which a loaded host may
    # take for a call that returns at once; the tests below make their runs quick the same way).
    ids = _runs(3)
    engine.advance_each(ids)
    assert _statuses(ids) == ["succeeded"] * 3
    assert hints.qsize() == 0  # nothing handed on


def test_the_rest_of_a_batch_is_handed_on_when_a_run_waits(hints):
    # The first run's call does not return at once (runs.tools: past 2 ms it counts as waiting):
    # the two runs behind it leave as one message for any worker before it returns.
    ids = _runs(3, 0.05, "test.batch.one_call")
    engine.advance_each(ids)
    assert _statuses(ids) == ["succeeded", "pending", "pending"]
    message = hints.get(timeout=10)
    message.ack()
    assert message.headers["task"] == "runs.tasks.advance_runs"
    assert message.decode()[0] == [ids[1:]]


def test_the_rest_is_handed_on_when_the_turn_is_over(hints, monkeypatch):
    monkeypatch.setattr(execute, "BATCH_TURN_SECONDS", 0.0)
    ids = _runs(2)
    engine.advance_each(ids)
    assert _statuses(ids) == ["succeeded", "pending"]
    message = hints.get(timeout=10)
    message.ack()
    assert message.headers["task"] == "runs.tasks.advance_run"  # one left: the plain hint
    assert message.decode()[0] == [ids[1]]


def test_what_an_error_leaves_undone_is_handed_on(hints, monkeypatch):
    ids = _runs(3)
    real = execute.advance

    def second_fails(run_id, *args, **kwargs):
        if run_id == ids[1]:
            raise RuntimeError("the database went away")
        return real(run_id, *args, **kwargs)

    monkeypatch.setattr(execute, "advance", second_fails)
    with pytest.raises(RuntimeError):
        engine.advance_each(ids)
    assert _statuses(ids) == ["succeeded", "pending", "pending"]
    message = hints.get(timeout=10)
    message.ack()
    assert message.decode()[0] == [ids[2]]

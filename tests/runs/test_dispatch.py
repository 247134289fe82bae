"""The advance hint's short path sends what `send_task` sends, through the configured broker,
and steps aside where `send_task`'s extras are in use (its signals, protocol 1)."""

from __future__ import annotations

import uuid

import pytest
from celery import signals
from django.conf import settings

from runs.engine import dispatch
from taskpilots.celery import app as celery_app
from tests.worker import reading_queue

pytestmark = pytest.mark.django_db


@pytest.fixture
def queue():
    """A queue of this test's own on the configured broker, hints on, and what was sent to it."""
    name = f"tp-test-{uuid.uuid4().hex[:10]}"
    previous_queue, previous_dispatch = (
        celery_app.conf.task_default_queue,
        settings.TASKPILOTS["DISPATCH"],
    )
    celery_app.conf.task_default_queue = name
    settings.TASKPILOTS["DISPATCH"] = "celery"
    try:
        with reading_queue(name) as simple:
            yield simple
    finally:
        settings.TASKPILOTS["DISPATCH"] = previous_dispatch
        celery_app.conf.task_default_queue = previous_queue


def _received(queue, count: int) -> list:
    messages = [queue.get(timeout=10) for _ in range(count)]
    for message in messages:
        message.ack()
    return messages


def test_a_hint_is_the_message_send_task_would_send(queue):
    # As in a worker, which sends hints too: the app finalized and the task registered, so
    # send_task puts the task's own options (its time limits) in the message. (Where the app
    # is not finalized yet, send_task leaves them out and the worker reads the same values
    # from its registry.)
    import runs.tasks  # noqa: F401

    assert dispatch.ADVANCE_TASK in celery_app.tasks

    run_id = str(uuid.uuid4())
    celery_app.send_task(dispatch.ADVANCE_TASK, (run_id,))
    dispatch.hint(run_id)
    by_celery, by_hint = _received(queue, 2)

    varies = {"id", "root_id"}
    assert {k: v for k, v in by_hint.headers.items() if k not in varies} == {
        k: v for k, v in by_celery.headers.items() if k not in varies
    }
    assert by_hint.headers["id"] == by_hint.headers["root_id"] != by_celery.headers["id"]
    assert by_hint.properties["correlation_id"] == by_hint.headers["id"]
    assert by_hint.decode() == by_celery.decode()
    assert by_hint.content_type == by_celery.content_type == "application/json"
    assert by_hint.properties.get("delivery_mode") == by_celery.properties.get("delivery_mode")


def test_the_sender_follows_a_change_of_queue(queue):
    """tests/worker.py gives each test a queue of its own by changing the default at run time:
    a sender worked out for the queue before must not keep sending there."""
    dispatch.hint(str(uuid.uuid4()))
    _received(queue, 1)
    other = f"tp-test-{uuid.uuid4().hex[:10]}"
    celery_app.conf.task_default_queue = other
    try:
        dispatch.hint("a-run")
        with reading_queue(other) as moved:
            assert _received(moved, 1)[0].decode()[0] == ["a-run"]
    finally:
        celery_app.conf.task_default_queue = queue.queue.name


def test_publish_signals_take_the_long_path(queue):
    """Tracing instrumentation (and anything else) listening to Celery's publish signals sees
    every hint: with a receiver connected, hints go through `send_task`."""
    seen = []

    def receiver(sender=None, headers=None, **kwargs):
        seen.append((sender, headers["argsrepr"]))

    signals.before_task_publish.connect(receiver)
    try:
        dispatch.hint("run-with-listener")
    finally:
        signals.before_task_publish.disconnect(receiver)
    assert seen == [(dispatch.ADVANCE_TASK, "('run-with-listener',)")]
    assert _received(queue, 1)[0].decode()[0] == ["run-with-listener"]


def test_a_hint_with_a_countdown_or_expiry_is_sent_by_celery(queue):
    dispatch.hint("later", expires=60)
    (message,) = _received(queue, 1)
    assert message.headers["expires"] and message.decode()[0] == ["later"]


# -- hints sent together (runs.engine.dispatch.hint_soon) ---------------------------------------


@pytest.fixture
def linger(settings):
    """Hints linger long enough here for every hint a test sends to fall within one linger."""
    settings.TASKPILOTS = {**settings.TASKPILOTS, "HINT_LINGER_MS": 300.0, "HINT_BATCH": 16}
    yield settings.TASKPILOTS
    dispatch.flush_hints()


def test_hints_sent_meanwhile_leave_as_one_message(queue, linger):
    # The app finalized, as in a worker (see the first test): send_task puts the registered
    # task's time limits in its message only then, and the hint always does.
    import runs.tasks  # noqa: F401

    assert dispatch.ADVANCE_MANY_TASK in celery_app.tasks

    ids = [str(uuid.uuid4()) for _ in range(3)]
    for run_id in ids:
        dispatch.hint_soon(run_id)
    celery_app.send_task(dispatch.ADVANCE_MANY_TASK, (ids,))
    # send_task's message leaves at once, the hints after their 300 ms linger.
    by_celery, by_hint = _received(queue, 2)
    assert by_hint.headers["task"] == dispatch.ADVANCE_MANY_TASK
    assert by_hint.decode()[0] == [ids]
    assert by_hint.decode() == by_celery.decode()
    varies = {"id", "root_id"}
    assert {k: v for k, v in by_hint.headers.items() if k not in varies} == {
        k: v for k, v in by_celery.headers.items() if k not in varies
    }


def test_a_lone_hint_is_the_plain_one_and_a_burst_is_cut_into_batches(queue, linger):
    dispatch.hint_soon("alone")
    (message,) = _received(queue, 1)
    assert message.headers["task"] == dispatch.ADVANCE_TASK
    assert message.decode()[0] == ["alone"]

    linger["HINT_BATCH"] = 2
    for n in range(5):
        dispatch.hint_soon(f"run-{n}")
    bodies = sorted(str(m.decode()[0]) for m in _received(queue, 3))  # no order between them
    assert bodies == sorted(["[['run-0', 'run-1']]", "[['run-2', 'run-3']]", "['run-4']"])


def test_without_a_linger_each_hint_leaves_at_once(queue, settings):
    settings.TASKPILOTS = {**settings.TASKPILOTS, "HINT_LINGER_MS": 0.0}
    dispatch.hint_soon("now")
    assert dispatch._coalescer._held == {}
    assert _received(queue, 1)[0].decode()[0] == ["now"]


def test_a_hint_held_when_the_process_exits_is_sent():
    """The atexit flush: a process that starts a run and exits at once (a management command,
    a script) still sends its hint, with a linger far longer than the process lives."""
    import subprocess
    import sys

    from taskpilots.evidence.workers import Workers

    name = f"tp-test-{uuid.uuid4().hex[:10]}"
    env = Workers(name).env(TASKPILOTS_HINT_LINGER_MS="600000")
    code = (
        "import django; django.setup(); from runs.engine import dispatch; dispatch.hint_soon('bye')"
    )
    env["DJANGO_SETTINGS_MODULE"] = "taskpilots.settings"
    with reading_queue(name) as simple:
        subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)
        assert _received(simple, 1)[0].decode()[0] == ["bye"]

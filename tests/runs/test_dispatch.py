"""The advance hint's short path sends what `send_task` sends, through the configured broker,
and steps aside where `send_task`'s extras are in use (its signals, protocol 1)."""

from __future__ import annotations

import uuid
from contextlib import contextmanager

import pytest
from celery import signals
from django.conf import settings

from runs.engine import dispatch
from taskpilots.celery import app as celery_app

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
        with _reading(name) as simple:
            yield simple
    finally:
        settings.TASKPILOTS["DISPATCH"] = previous_dispatch
        celery_app.conf.task_default_queue = previous_queue


@contextmanager
def _reading(name: str):
    """A reader of the queue `name`, deleted afterwards."""
    with celery_app.connection_for_read() as conn:
        simple = conn.SimpleQueue(name)
        try:
            yield simple
        finally:
            simple.close()
            conn.default_channel.queue_delete(name)


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
        with _reading(other) as moved:
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

"""Reads executed ahead of their claim (runs/engine/inline.py): a read changes nothing, so the
hot path calls it while it builds the statement that records the steps before it and claims the
next one, as it does for pure compute steps. These tests hold the rules that keep that safe: a
paused tool is never called ahead; a read never goes ahead of a receipt that is not committed
yet; a read that fails ahead counts as its claim's attempt (one call, not two); a pause that
commits between the worker's last look and its statement refuses the statement; and two workers
taking one fresh run at once may both read, but the run records one read and one write."""

from __future__ import annotations

import pytest
from django.db import connection

from approvals.models import ToolPause
from runs import engine, tools, workflows
from runs.models import FailureClass, Run, SideEffect, Step
from runs.tools import ToolError, python_tool
from runs.workflows import Workflow, compute, read, side_effect

pytestmark = pytest.mark.django_db

CALLS: list[dict] = []


def _lookup(params, ctx):
    # What the read saw committed in the ledger when it was called (the call runs in a helper
    # thread, on a connection of its own): whether the write before it had its receipt.
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT status FROM runs_sideeffect WHERE run_id = %s ORDER BY id", [ctx.run_id]
            )
            ledger = [row[0] for row in cursor.fetchall()]
    finally:
        connection.close()
    CALLS.append({"step": ctx.step, "attempt": ctx.attempt, "ledger": ledger})
    if params.get("fail"):
        raise ToolError(FailureClass.INVALID_INPUT, "no such customer")
    return {"customer": params["n"]}


def _write(params, ctx):
    return {"id": ctx.idempotency_key}


tools.register(python_tool("ahead.lookup", _lookup), replace=True)
tools.register(
    python_tool(
        "ahead.write",
        _write,
        side_effect=True,
        dedupes_by_key=True,
        target=lambda p: f"ahead:{p['n']}",
    ),
    replace=True,
)

LOOKUPS = workflows.register(
    Workflow(
        "test.ahead",
        1,
        [
            compute("prepare", lambda ctx: {"n": ctx.input["n"]}),
            read(
                "first",
                "ahead.lookup",
                params=lambda ctx: {"n": ctx.input["n"], "fail": ctx.input.get("fail", False)},
            ),
            side_effect("write", "ahead.write", params=lambda ctx: {"n": ctx.input["n"]}),
            read("second", "ahead.lookup", params=lambda ctx: {"n": ctx.input["n"] + 1}),
            compute("finish", lambda ctx: {"ok": True}),
        ],
    ),
    replace=True,
)


@pytest.fixture(autouse=True)
def _calls():
    CALLS.clear()
    yield
    CALLS.clear()


def _statements(run_id) -> list[str]:
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        engine.advance(run_id, budget=60)
    return [
        q["sql"] for q in queries.captured_queries if q["sql"].startswith(("WITH", "SELECT r.id"))
    ]


def test_a_read_goes_ahead_with_the_steps_before_it():
    run, _ = engine.start_run("test.ahead", {"n": 1})
    statements = _statements(run.pk)
    # The run's read, then one statement that starts it, records `prepare` and `first` and
    # claims `write` with its snapshot and intent; the receipt with `second` claimed (it may
    # not go ahead of the receipt); `second` recorded with `finish` done ahead and the run's
    # success.
    assert len(statements) == 4
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED
    assert [c["step"] for c in CALLS] == ["first", "second"]
    first = Step.objects.get(run=run, name="first")
    assert first.status == Step.Status.SUCCEEDED and first.attempts == 1
    assert first.read_record["params"] == {"n": 1, "fail": False}


@pytest.mark.django_db(transaction=True)
def test_a_read_never_goes_ahead_of_a_receipt_not_yet_committed():
    run, _ = engine.start_run("test.ahead", {"n": 2})
    engine.advance(run.pk, budget=60)
    assert [c["step"] for c in CALLS] == ["first", "second"]
    second = CALLS[1]
    assert second["ledger"] == [SideEffect.Status.COMMITTED]


def test_a_read_that_fails_ahead_is_its_claims_attempt_called_once():
    run, _ = engine.start_run("test.ahead", {"n": 3, "fail": True})
    engine.run_until_quiet(run.pk)
    assert [c["step"] for c in CALLS] == ["first"]
    step = Step.objects.get(run=run, name="first")
    assert step.attempts == 1
    assert step.error_class == FailureClass.INVALID_INPUT
    assert step.status == Step.Status.NEEDS_HUMAN
    run.refresh_from_db()
    assert run.status == Run.Status.NEEDS_HUMAN
    # Nothing after it ran: no claim of the write, no call.
    assert not SideEffect.objects.filter(run=run).exists()


def test_a_paused_tool_is_not_called_ahead():
    ToolPause.objects.create(tool="ahead.lookup", reason="the CRM answers in another format")
    run, _ = engine.start_run("test.ahead", {"n": 4})
    engine.run_until_quiet(run.pk)
    assert CALLS == []
    step = Step.objects.get(run=run, name="first")
    assert step.routing.get("paused_tool") == "ahead.lookup"
    assert not SideEffect.objects.filter(run=run).exists()


@pytest.mark.django_db(transaction=True)
def test_a_pause_that_commits_after_the_workers_last_look_refuses_the_statement():
    from runs.engine import inline

    run, _ = engine.start_run("test.ahead", {"n": 5})
    # The worker saw no pause; an admin pauses the tool while the read is being called.
    real = tools.get("ahead.lookup")

    def pausing(params, ctx):
        try:  # committed on the helper thread's own connection, as an admin's would be
            ToolPause.objects.create(tool="ahead.lookup", reason="drift")
        finally:
            connection.close()
        return real.invoke(params, ctx)

    tools.register(python_tool("ahead.lookup", lambda p, c: pausing(p, c).response), replace=True)
    try:
        claim = inline.claim_fresh(run.pk, "test-worker")
    finally:
        tools.register(real, replace=True)
    # The statement that would have recorded the read was refused: the ordinary claim decides,
    # and it finds the pause.
    assert claim is inline.ORDINARY
    run.refresh_from_db()
    assert run.status == Run.Status.PENDING and not run.steps.exists()
    engine.run_until_quiet(run.pk)
    step = Step.objects.get(run=run, name="first")
    assert step.routing.get("paused_tool") == "ahead.lookup"
    assert step.status != Step.Status.SUCCEEDED


def test_a_read_ahead_is_called_once_when_the_approval_rules_changed_since_the_last_statement():
    # The statement that records a read ahead also writes the next call's intent, cleared by
    # the approval rules this process cached (runs.engine.gate); it checks they are still the
    # rules in force. Rules changed since the worker's last statement once refused it, and the
    # ordinary path then called the read a second time: now every statement reads the rules'
    # digest, and the first one a fresh run makes refreshes what the worker cached.
    from approvals.models import EscalationRule

    engine.run_until_quiet(engine.start_run("test.ahead", {"n": 5})[0].pk)  # rules cached
    CALLS.clear()
    EscalationRule.objects.create(
        position=1, name="every CRM export: a person", tool="crm.export", action="approve"
    )
    run, _ = engine.start_run("test.ahead", {"n": 6})
    engine.run_until_quiet(run.pk)
    assert [c["step"] for c in CALLS] == ["first", "second"]
    assert Run.objects.get(pk=run.pk).status == Run.Status.SUCCEEDED


@pytest.mark.django_db(transaction=True)
def test_two_workers_starting_one_fresh_run_at_once_may_read_twice_but_record_and_write_once():
    # Two hints for one fresh run, taken by two workers at once: each reads the run, finds it
    # fresh, and calls `first` ahead of its claim (no claim exists yet to stop the second).
    # Here the second worker runs the whole run while the first one's read is in flight. The
    # read is the one thing done twice, and a read changes nothing: the first worker's
    # statement is refused (the run moved from under it), so the run records one read, one
    # write and one success.
    import threading

    from runs.audit import verify_chain
    from runs.models import TimelineEvent

    run, _ = engine.start_run("test.ahead", {"n": 7})
    other: list[threading.Thread] = []
    original = tools.get("ahead.lookup").invoke

    def racing_lookup(params, ctx):
        if not other:  # the first call: the other worker takes the same run meanwhile
            other.append(threading.Thread(target=_advance_elsewhere, args=(run.pk,)))
            other[0].start()
            other[0].join()
        return original(params, ctx)

    tool = tools.get("ahead.lookup")
    tool.invoke = racing_lookup
    try:
        engine.run_until_quiet(run.pk)
    finally:
        tool.invoke = original
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED
    assert [c["step"] for c in CALLS].count("first") == 2  # read twice: once by each worker
    first = Step.objects.get(run=run, name="first")
    assert first.attempts == 1 and first.status == Step.Status.SUCCEEDED
    assert SideEffect.objects.filter(run=run).count() == 1
    assert SideEffect.objects.get(run=run).status == SideEffect.Status.COMMITTED
    events = TimelineEvent.objects.filter(run=run).order_by("seq")
    assert [e.verb for e in events].count("run.succeeded") == 1
    assert verify_chain(events) == (True, "ok")


def _advance_elsewhere(run_id) -> None:
    try:
        engine.run_until_quiet(run_id)
    finally:
        connection.close()

"""How the engine reads the local decisions (approvals.local_metadata): a `get` costs its caller
no statement — between checks nothing is read, and the check every REFRESH_SECONDS reads on a
connection of its own; the process that saves a change uses it at once, another process within
REFRESH_SECONDS of the commit; a copy per (tool, decision), the tool itself when none.

A timed check reads committed rows only, so the tests that need one to see a decision commit
it (`transaction=True`); the others keep the clock stopped (tests/approvals/conftest.py)."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from approvals import local_metadata
from approvals.local_metadata import CACHE, REFRESH_SECONDS, LocalMetadata, read_here
from approvals.models import ToolMetadataOverride
from runs import engine, tools
from taskpilots.evidence import bench_flows  # noqa: F401  (registers bench.five)
from tests.approvals.conftest import Clock
from tests.approvals.console_helpers import fast_passwords  # noqa: F401  (autouse)
from tests.dbroles import as_owner

pytestmark = pytest.mark.django_db
committed = pytest.mark.django_db(transaction=True)


def high(user, tool="mail.send", **change):
    row, _ = ToolMetadataOverride.decide(
        tools.registered(tool), user, "risky", **({"risk": "high"} | change)
    )
    return row


def statements(queries) -> list[str]:
    return [
        q["sql"] for q in queries.captured_queries
        if not q["sql"].startswith(("SAVEPOINT", "RELEASE", "SELECT nextval("))
    ]  # fmt: skip


def test_the_first_get_in_a_process_costs_the_caller_no_statement():
    # The engine's statement counts (tests/runs/test_inline.py) hold whatever ran before.
    with CaptureQueriesContext(connection) as queries:
        assert tools.get("mail.send") is tools.registered("mail.send")
    assert statements(queries) == []
    assert CACHE.reads == {"load": 1}


@committed
def test_no_read_between_checks_and_a_check_off_the_callers_connection(clock, admin_user):
    high(admin_user)  # (the saving process read them again, at once)
    before = CACHE.reads.copy()
    with CaptureQueriesContext(connection) as queries:
        for _ in range(100):
            assert tools.get("mail.send").risk == "high"
        tools.all_tools()
        clock.advance(REFRESH_SECONDS - 0.01)
        tools.get("crm.lookup")
        assert CACHE.reads == before
        clock.advance(0.01)
        assert tools.get("mail.send").risk == "high"
        assert tools.get("mail.send").risk == "high"
    assert CACHE.reads - before == {"stamp": 1}  # the stamp had not moved: nothing more
    assert statements(queries) == []


@committed
def test_a_change_committed_in_another_process_is_used_here_within_the_interval(
    clock, admin_user, monkeypatch
):
    assert tools.get("mail.send").risk == "medium"
    # Another process: its own connection and transaction, committed; this process is not told
    # (only the saving process reads the decisions again at once).
    monkeypatch.setattr(local_metadata, "changed", lambda: None)

    def other_process():
        try:
            high(admin_user)
        finally:
            connections.close_all()

    thread = threading.Thread(target=other_process)
    thread.start()
    thread.join()
    assert ToolMetadataOverride.objects.count() == 1
    assert tools.get("mail.send").risk == "medium"  # not yet: within the interval
    clock.advance(REFRESH_SECONDS - 0.1)
    assert tools.get("mail.send").risk == "medium"
    clock.advance(0.1)
    with CaptureQueriesContext(connection) as queries:
        assert tools.get("mail.send").risk == "high"
    assert statements(queries) == []
    assert CACHE.reads == {"load": 2, "stamp": 1}


def test_another_copy_keeps_its_decisions_until_its_next_check(admin_user):
    # The interval alone, with a second copy standing for another process (reading through
    # this test's transaction).
    worker_clock = Clock()
    worker = LocalMetadata(clock=worker_clock, read=read_here)
    assert worker.apply(tools.registered("mail.send")).risk == "medium"
    high(admin_user)
    assert tools.get("mail.send").risk == "high"  # the saving process: at once
    worker_clock.advance(REFRESH_SECONDS - 0.1)
    assert worker.apply(tools.registered("mail.send")).risk == "medium"
    worker_clock.advance(0.1)
    assert worker.apply(tools.registered("mail.send")).risk == "high"


def test_a_copy_per_tool_and_decision_and_the_tool_itself_without_one(admin_user):
    own = tools.registered("mail.send")
    assert tools.get("mail.send") is own
    first = high(admin_user)
    copy = tools.get("mail.send")
    assert copy is not own and copy.risk == "high" and own.risk == "medium"
    assert type(copy) is type(own) and copy.invoke is own.invoke and copy.lookup is own.lookup
    assert tools.get("mail.send") is copy  # kept, not made again
    ToolMetadataOverride.decide(own, admin_user, "and no dedupe", risk="high",
                                dedupes_by_key=False, expected=first.pk)  # fmt: skip
    again = tools.get("mail.send")
    assert again is not copy and again.dedupes_by_key is False
    assert tools.get("crm.lookup") is tools.registered("crm.lookup")


def test_when_the_decisions_cannot_be_read_the_last_ones_stay(clock, admin_user, monkeypatch,
                                                               caplog):  # fmt: skip
    monkeypatch.setattr(CACHE, "read", read_here)  # timed checks that see this transaction
    high(admin_user)

    def unreachable(sql):
        raise RuntimeError("database unreachable")

    monkeypatch.setattr(CACHE, "read", unreachable)
    clock.advance(REFRESH_SECONDS)
    assert tools.get("mail.send").risk == "high"
    assert "could not be read" in caplog.text and "stay in force" in caplog.text
    tools.get("mail.send")  # not tried again before the next interval
    assert caplog.text.count("could not be read") == 1
    monkeypatch.setattr(CACHE, "read", read_here)
    clock.advance(REFRESH_SECONDS)
    assert tools.get("mail.send").risk == "high"


def test_a_failed_read_in_the_saving_transaction_does_not_break_it(caplog):
    tools.get("mail.send")  # read once (on the side) before the table goes
    with transaction.atomic():
        with as_owner(), connection.cursor() as cursor:  # as before the migration
            cursor.execute("ALTER TABLE approvals_toolmetadataoverride RENAME TO moved_away")
        CACHE.refresh(here=True)
        assert "does not exist" in caplog.text and "own metadata applies" in caplog.text
        assert tools.get("mail.send") is tools.registered("mail.send")
        with connection.cursor() as cursor:  # the transaction still works
            cursor.execute("SELECT 1")
        transaction.set_rollback(True)


@committed
def test_a_run_with_a_decision_and_a_check_due_costs_no_more_statements(clock, admin_user):
    # As tests/runs/test_bench.py: bench.five's 5 steps, with its write tool decided higher,
    # and the timed check falling inside the run.
    high(admin_user, tool="bench.write")
    engine.run_until_quiet(engine.start_run("bench.five", {"n": 0})[0].pk)  # warm caches
    run, _ = engine.start_run("bench.five", {"n": 1})
    clock.advance(REFRESH_SECONDS)
    with CaptureQueriesContext(connection) as queries:
        engine.advance(run.pk, budget=60)
    assert run.__class__.objects.get(pk=run.pk).status == "succeeded"
    assert CACHE.reads["stamp"] == 1
    assert tools.get("bench.write").risk == "high"
    assert len(statements(queries)) <= 5, statements(queries)


def test_a_process_that_never_used_the_database_reads_nothing_for_it(monkeypatch, caplog):
    # A command without a database, a test without database access: no connection is opened
    # for the decisions, nothing is logged, and the next `get` tries again.
    monkeypatch.setattr(local_metadata, "_django_connected", threading.Event())
    assert tools.get("mail.send") is tools.registered("mail.send")
    assert tools.get("mail.send") is tools.registered("mail.send")
    assert CACHE.reads == {} and "could not be read" not in caplog.text
    local_metadata._django_connected.set()
    tools.get("mail.send")
    assert CACHE.reads == {"load": 1}

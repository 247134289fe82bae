"""How the engine reads the local decisions (approvals.local_metadata): no statement on a `get`
between refreshes; the process that saves a change uses it at once; another process within
REFRESH_SECONDS of the commit; a copy per (tool, decision), the tool itself when none."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext

from approvals import local_metadata
from approvals.local_metadata import REFRESH_SECONDS, LocalMetadata
from approvals.models import ToolMetadataOverride
from runs import engine, tools
from taskpilots.evidence import bench_flows  # noqa: F401  (registers bench.five)
from tests.approvals.conftest import Clock
from tests.approvals.console_helpers import fast_passwords  # noqa: F401  (autouse)

pytestmark = pytest.mark.django_db


def high(user, tool="mail.send", **change):
    row, _ = ToolMetadataOverride.decide(
        tools.registered(tool), user, "risky", **({"risk": "high"} | change)
    )
    return row


def statements(queries) -> list[str]:
    return [
        q["sql"] for q in queries.captured_queries
        if not q["sql"].startswith(("SAVEPOINT", "RELEASE"))
    ]  # fmt: skip


def test_between_refreshes_a_get_reads_nothing(clock, admin_user):
    high(admin_user)
    tools.get("mail.send")  # the first read after the change
    with CaptureQueriesContext(connection) as queries:
        for _ in range(100):
            assert tools.get("mail.send").risk == "high"
        tools.all_tools()
        clock.advance(REFRESH_SECONDS - 0.01)
        tools.get("crm.lookup")
    assert statements(queries) == []
    clock.advance(0.01)
    with CaptureQueriesContext(connection) as queries:
        tools.get("mail.send")
        tools.get("mail.send")
    assert len(statements(queries)) == 1  # the stamp, unchanged: nothing else is read
    assert "count(*)" in statements(queries)[0]


def test_a_copy_per_tool_and_decision_and_the_tool_itself_without_one(clock, admin_user):
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


def test_another_process_sees_a_change_within_the_refresh_interval(admin_user):
    # A second copy of the decisions stands for a worker in another process: it read them
    # before the change and was not told about it.
    worker_clock = Clock()
    worker = LocalMetadata(clock=worker_clock)
    assert worker.apply(tools.registered("mail.send")).risk == "medium"
    high(admin_user)
    assert tools.get("mail.send").risk == "high"  # the saving process: at once
    worker_clock.advance(REFRESH_SECONDS - 0.1)
    assert worker.apply(tools.registered("mail.send")).risk == "medium"
    worker_clock.advance(0.1)
    assert worker.apply(tools.registered("mail.send")).risk == "high"


@pytest.mark.django_db(transaction=True)
def test_a_change_committed_on_another_connection_reaches_this_process_in_time(
    clock, admin_user, monkeypatch
):
    assert tools.get("mail.send").risk == "medium"
    # Another process: its own connection and transaction, committed, and this process is not
    # told (only the saving process drops its copy).
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
    assert tools.get("mail.send").risk == "high"


@pytest.mark.django_db(transaction=True)
def test_the_saving_process_uses_a_change_once_it_commits(clock, admin_user):
    # A thread of the same process that read the decisions while the change was not yet
    # committed holds the old ones; the commit makes the whole process read them again.
    saved = threading.Event()
    go_on = threading.Event()

    def admin_saves():
        try:
            from django.db import transaction

            with transaction.atomic():
                high(admin_user)
                saved.set()
                go_on.wait(10)
        finally:
            connections.close_all()

    thread = threading.Thread(target=admin_saves)
    thread.start()
    assert saved.wait(10)
    assert tools.get("mail.send").risk == "medium"  # read while uncommitted: the old one
    go_on.set()
    thread.join()
    assert tools.get("mail.send").risk == "high"  # no clock moved: the commit reloaded it


def test_when_the_decisions_cannot_be_read_the_last_ones_stay(clock, admin_user, monkeypatch,
                                                               caplog):  # fmt: skip
    high(admin_user)
    assert tools.get("mail.send").risk == "high"

    def broken(sql):
        raise RuntimeError("database unreachable")

    monkeypatch.setattr(local_metadata, "_fetch", broken)
    clock.advance(REFRESH_SECONDS)
    assert tools.get("mail.send").risk == "high"
    assert "could not be read" in caplog.text and "stay in force" in caplog.text
    tools.get("mail.send")  # not tried again before the next interval
    assert caplog.text.count("could not be read") == 1
    monkeypatch.undo()
    clock.advance(REFRESH_SECONDS)
    assert tools.get("mail.send").risk == "high"


def test_a_failed_read_inside_a_transaction_does_not_break_it(clock, caplog):
    from django.db import transaction

    with transaction.atomic():
        with connection.cursor() as cursor:  # the table is gone, as before the migration
            cursor.execute("ALTER TABLE approvals_toolmetadataoverride RENAME TO moved_away")
        assert tools.get("mail.send").risk == "medium"  # the tool's own metadata
        assert tools.get("crm.lookup") is tools.registered("crm.lookup")
        assert "does not exist" in caplog.text and "own metadata applies" in caplog.text
        with connection.cursor() as cursor:  # the transaction still works
            cursor.execute("SELECT 1")
        transaction.set_rollback(True)


def test_a_run_with_decisions_in_force_costs_no_more_statements(clock, admin_user):
    # As tests/runs/test_bench.py: bench.five's 5 steps, with its write tool decided higher.
    high(admin_user, tool="bench.write")
    engine.run_until_quiet(engine.start_run("bench.five", {"n": 0})[0].pk)  # warm caches
    run, _ = engine.start_run("bench.five", {"n": 1})
    with CaptureQueriesContext(connection) as queries:
        engine.advance(run.pk, budget=60)
    assert run.__class__.objects.get(pk=run.pk).status == "succeeded"
    assert tools.get("bench.write").risk == "high"
    counted = [s for s in statements(queries) if not s.startswith("SELECT nextval(")]
    assert len(counted) <= 5, counted

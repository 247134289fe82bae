"""The engine's hot path (runs/engine/inline.py: one statement per protocol step) writes exactly
the records the model verbs write one statement at a time: the same rows, the same timeline
events in the same order, a chain that verifies — so nobody reading them can tell which path
ran. Each workflow runs twice, once with the hot path and once with TASKPILOTS_HOT_PATH off, and
the two runs are compared field by field (ids, times and the run's own id aside)."""

from __future__ import annotations

import re

import pytest
from django.conf import settings
from django.db import connection

from runs import engine
from runs.audit import verify_chain
from runs.batch import Batch, Refused
from runs.models import Run, SideEffect, Snapshot, TimelineEvent, chain_heads

pytestmark = pytest.mark.django_db

# The simulated systems' own ids for what they did (a message, a contact, a ticket update).
EXTERNAL_ID = re.compile(r"\b[a-z]{3}_[0-9a-f]{16}\b")
VOLATILE = {
    "snapshot",
    "step_id",
    "response_digest",
    "wait",
    "due_at",
    "checksum",
    "key",
    "idempotency_key",
    "worker",
    "previous_worker",
}


def _run_with(hot: bool, workflow: str, input: dict) -> Run:
    previous = settings.TASKPILOTS["HOT_PATH"]
    settings.TASKPILOTS["HOT_PATH"] = hot
    try:
        run, _ = engine.start_run(workflow, input)
        return engine.run_until_quiet(run.pk)
    finally:
        settings.TASKPILOTS["HOT_PATH"] = previous


def _same_shape(run: Run) -> dict:
    """Everything recorded about a run except what differs between two runs by nature."""
    run_id = str(run.pk)

    def clean(value):
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items() if k not in VOLATILE}
        if isinstance(value, list):
            return [clean(v) for v in value]
        if isinstance(value, str):
            return EXTERNAL_ID.sub("ID", value.replace(run_id, "RUN"))
        return value

    steps = [
        clean(
            {
                "name": s.name,
                "iteration": s.iteration,
                "position": s.position,
                "kind": s.kind,
                "stage": s.stage,
                "tool": s.tool,
                "spec": s.spec,
                "status": s.status,
                "attempts": s.attempts,
                "error_class": s.error_class,
                "result": s.result,
                "key": s.idempotency_key.replace(run_id, "RUN"),
                "routing": s.routing,
                "read_record": s.read_record,
                "lease": (s.lease_owner, s.lease_expires_at),
                "finished": s.finished_at is not None,
            }
        )
        for s in run.steps.order_by("position")
    ]
    snapshots = [
        clean({**s.content(), "key": s.idempotency_key.replace(run_id, "RUN")})
        for s in Snapshot.objects.filter(run=run).order_by("id")
    ]
    effects = [
        clean(
            {
                "key": e.idempotency_key.replace(run_id, "RUN"),
                "status": e.status,
                "tool": e.tool,
                "target": e.target,
                "params_checksum": e.params_checksum,
                "external_id": e.external_id,
                "receipt": e.receipt,
                "confirmed_by": e.confirmed_by,
                "committed": e.committed_at is not None,
            }
        )
        for e in SideEffect.objects.filter(run=run).order_by("created_at")
    ]
    events = [(e.actor, e.verb, clean(e.data)) for e in TimelineEvent.objects.filter(run=run)]
    run.refresh_from_db()
    return {
        "run": clean([run.status, run.stage, run.result, run.failure_count, run.lock_version]),
        "steps": steps,
        "snapshots": snapshots,
        "effects": effects,
        "events": events,
    }


@pytest.mark.parametrize(
    ("workflow", "input"),
    [
        ("bench.five", {"n": 3}),
        ("test.reply", {"message": "Where is my refund?", "email": "a@example.com", "ticket": "T"}),
        ("test.lead", {"email": "lead@example.com", "name": "Lee"}),
        ("test.branch", {"n": 20}),
        ("test.agent", {"mails": 2}),
        ("test.turns", {}),
        ("test.timer", {}),
    ],
)
def test_the_hot_path_writes_what_the_verbs_write(sandbox, workflow, input):
    from taskpilots.evidence import bench_flows  # noqa: F401  (registers bench.five)

    hot = _run_with(True, workflow, input)
    sandbox.reset()  # the receiving side as it was: the second run writes the same things
    ordinary = _run_with(False, workflow, input)
    hot_shape, ordinary_shape = _same_shape(hot), _same_shape(ordinary)
    for part in hot_shape:
        assert hot_shape[part] == ordinary_shape[part], part
    assert _verifies(hot) and _verifies(ordinary)


def _verifies(run) -> bool:
    return verify_chain(run.events.order_by("seq"))[0]


def test_the_hot_path_takes_one_statement_per_protocol_step(sandbox):
    # bench.five: the fresh claim (a read, then one statement that also records `prepare`, a
    # pure compute step, and `fetch`, a read, both executed ahead of their claim, and claims
    # `write_a` with its snapshot and intent), then one statement for each outcome together
    # with the next step's claim — the final compute step done ahead with the run's success.
    # (Ids are taken from the sequences 64 at a time; the tests' own savepoints aside.)
    from django.test.utils import CaptureQueriesContext

    from taskpilots.evidence import bench_flows  # noqa: F401

    # The caches warm, as a worker's are: a test before may have changed the approval rules and
    # rolled back, and the first statement that reads another stamp has the rules read again.
    engine.run_until_quiet(engine.start_run("bench.five", {"n": 0})[0].pk)
    run, _ = engine.start_run("bench.five", {"n": 1})
    with CaptureQueriesContext(connection) as queries:
        engine.advance(run.pk, budget=60)
    statements = [
        q["sql"]
        for q in queries.captured_queries
        if not q["sql"].startswith(("SAVEPOINT", "RELEASE SAVEPOINT", "SELECT nextval("))
    ]
    assert len(statements) == 4, statements
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED


def test_a_stale_chain_head_writes_nothing_and_the_ordinary_path_takes_over(sandbox):
    from runs.engine import inline
    from taskpilots.evidence import bench_flows  # noqa: F401

    run, _ = engine.start_run("bench.five", {"n": 2})
    claim = engine.claim_next(run.pk)
    outcome = engine.execute(claim)
    # Another process appends to the run's timeline meanwhile (a person, an API client): this
    # worker still holds the head it saw.
    seen = chain_heads.get(run.pk)
    TimelineEvent.append(run.pk, "run.note", {"why": "a person looked"}, actor="user:someone")
    chain_heads.remember(run.pk, *seen)
    assert inline.record_and_continue(claim, outcome, go_on=True) is None
    claim.step.refresh_from_db()
    assert claim.step.status == "running"  # nothing written
    assert engine.record_outcome(claim, outcome)
    done = engine.run_until_quiet(run.pk)
    assert done.status == Run.Status.SUCCEEDED
    assert _verifies(done)
    assert [e.verb for e in done.events.order_by("seq")].count("step.succeeded") == 5


def test_a_refused_statement_leaves_the_callers_transaction_usable(sandbox):
    from django.db import transaction

    from taskpilots.evidence import bench_flows  # noqa: F401

    run, _ = engine.start_run("bench.five", {"n": 4})
    with transaction.atomic():
        batch = Batch(run.pk, (999, "nope"))
        batch.event("run.note", {})
        with pytest.raises(Refused):
            batch.commit()
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            assert cursor.fetchone() == (1,)


def test_large_payloads_go_through_the_statement_unchanged_and_compressed(sandbox):
    # The statement's rows travel as jsonb (parsed once by the server): what comes back is what
    # went in — text with quotes, escapes and non-ASCII, big and fractional numbers — and a
    # payload over the 2 KB at which PostgreSQL compresses is compressed with lz4 where the
    # server has it (runs/migrations/0025), with pglz where it has not.
    from taskpilots.evidence import bench_flows  # noqa: F401
    from taskpilots.evidence.bench_payloads import document

    doc = document(7, 12, 12) + ' "quoted" \\back\\slash\\ 退款 ✓ \t end'
    data = {"n": 7, "doc": doc, "big": 2**62 + 1, "ratio": 0.1, "none": None}
    run, _ = engine.start_run("bench.five", data)
    engine.advance(run.pk, budget=60)
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED
    assert run.input == data
    assert run.steps.get(name="fetch").result == {"value": 7, "doc": doc}
    receipts = [e.receipt for e in SideEffect.objects.filter(run=run)]
    assert len(receipts) == 2 and all(r["response"]["record"] == doc for r in receipts)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT 'lz4' = ANY (enumvals) FROM pg_settings "
            "WHERE name = 'default_toast_compression'"
        )
        method = "lz4" if cursor.fetchone()[0] else "pglz"
        cursor.execute("SELECT pg_column_compression(input) FROM runs_run WHERE id = %s", [run.pk])
        assert cursor.fetchone()[0] == method
        cursor.execute(
            "SELECT DISTINCT pg_column_compression(result) FROM runs_step "
            "WHERE run_id = %s AND name = 'fetch'",
            [run.pk],
        )
        assert cursor.fetchall() == [(method,)]


@pytest.mark.parametrize("condition", ["false", "NULL", "NULL = 'a'", "NOT (NULL::jsonb ? 'a')"])
def test_a_guard_that_is_not_true_refuses_the_statement(sandbox, condition):
    # A guard whose read found nothing compares NULL, and NULL is not true: the statement is
    # refused as for a false one, nothing written.
    from taskpilots.evidence import bench_flows  # noqa: F401

    run, _ = engine.start_run("bench.five", {"n": 5})
    batch = Batch(run.pk, (run.event_seq, run.event_hash))
    batch.event("run.note", {})
    batch.check(condition, [], "guard")
    with pytest.raises(Refused, match="guard"):
        batch.commit()
    assert not run.events.filter(verb="run.note").exists()

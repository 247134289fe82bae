"""Short versions of the benchmarks, so a regression in what a step costs fails CI.

Timings vary between machines; the guards are on what does not: statements and commits per step,
and for bench io runs done, effects counted where they land, connections within the limit.
The full runs and their figures are in docs/benchmarks.md.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runs import engine
from taskpilots.evidence import (
    bench,
    bench_flows,  # noqa: F401  (registers bench.five)
)

pytestmark = pytest.mark.bench

# bench.five, 5 steps, on the hot path: a read (the fresh claim) and 3 statements, each its own
# transaction (`prepare` and `finish` are pure compute steps and `fetch` a read, done ahead of
# their claims; the side effects' snapshots and intents go with their claims, their receipts
# with the next claim). The ordinary path (the model verbs, statement by statement) took 64.
# Lower it when the hot path gets leaner; raise it only with a reason.
MAX_STATEMENTS_PER_RUN = 4


@pytest.mark.django_db
def test_a_five_step_run_costs_a_bounded_number_of_statements():
    engine.run_until_quiet(engine.start_run("bench.five", {"n": 0})[0].pk)  # warm caches
    run, _ = engine.start_run("bench.five", {"n": 1})
    with CaptureQueriesContext(connection) as queries:
        engine.advance(run.pk, budget=60)
    assert run.__class__.objects.get(pk=run.pk).status == "succeeded"
    statements = [
        q
        for q in queries.captured_queries
        # The tests' own savepoints, and ids taken from a sequence 64 at a time.
        if not q["sql"].startswith(("SAVEPOINT", "RELEASE", "SELECT nextval("))
    ]
    assert len(statements) <= MAX_STATEMENTS_PER_RUN, [q["sql"][:80] for q in statements]


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(300)
def test_the_engine_benchmark_runs_and_reports_its_figures():
    result = bench.bench_engine(runs=20, workers=2, say=lambda line: None, with_dbos=True)
    for key in (
        "steps_per_s",
        "baseline_commits_per_s",
        "ratio",
        "dbos_steps_per_s",
        "vs_dbos",
        "commits_per_step",
        "run_p50_ms",
        "run_p99_ms",
        "broker",
    ):
        assert result[key] is not None, key
    assert result["steps"] == 100
    assert 0 < result["run_p50_ms"] <= result["run_p99_ms"]
    # 4 statements a run (one of them a read, which pg_stat_database counts as a commit too):
    # 0.8 a step, a little more with the pool's checks and the polling. Well above means a new
    # transaction crept into the hot path. (The exact guard is the statement count above.)
    assert result["commits_per_step"] <= 1.4, result
    assert result["worker_pool"] == "threads"
    # Where the CPU went: the workers' processes and the server's for this database (both on
    # this machine in every configuration the tests run).
    assert result["worker_cpu_ms_per_step"] > 0, result
    assert result["db_cpu_ms_per_step"] > 0, result


@pytest.mark.django_db
def test_the_snapshot_benchmark_compares_a_step_with_its_bare_call(sandbox):
    result = bench.bench_snapshot(samples=5, say=lambda line: None)
    assert result["noop"]["step_p50_ms"] > result["noop"]["bare_p50_ms"]
    assert result["http"]["ratio"] > 1


def test_the_waiting_tool_counts_a_key_received_twice():
    # bench io reports "0 duplicates" from these counters: they must see a duplicate.
    from taskpilots.evidence.bench_io import WaitingTool

    with WaitingTool.start(latency_ms=0) as tool:
        for _ in range(2):
            answer = tool.client.post(f"{tool.url}/call/t", headers={"Idempotency-Key": "k-1"})
            assert answer.status_code == 200
        tool.client.post(f"{tool.url}/call/t", headers={"Idempotency-Key": "k-2"})
        stats = tool.stats("t", keys=True)
        assert (stats["calls"], stats["distinct_keys"], stats["duplicate_keys"]) == (3, 2, 1)
        assert stats["keys"] == ["k-1", "k-2"]
        assert tool.client.get(f"{tool.url}/lookup/t", params={"key": "k-2"}).status_code == 200
        assert tool.client.get(f"{tool.url}/lookup/t", params={"key": "k-3"}).status_code == 404


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(300)
def test_the_io_benchmark_loses_nothing_and_sends_nothing_twice():
    """make run's worker configuration and DBOS, a few runs: guarded on counts, never on times."""
    from taskpilots.evidence.bench_io import bench_io

    result = bench_io(runs=6, latency_ms=50, say=lambda line: None)
    assert result["runs_succeeded"] == 6, result
    assert (result["runs_failed"], result["runs_lost"], result["runs_needs_human"]) == (0, 0, 0)
    # Counted where the calls land: two per run, each key once, each one in the ledger.
    assert (result["calls"], result["duplicates"]) == (12, 0), result
    assert result["landed_without_receipt"] == result["receipt_without_landing"] == 0, result
    assert 1 <= result["peak_in_flight"] <= result["concurrency"], result
    assert 0 < result["db_connections_peak"] <= result["max_connections"], result
    assert result["worker_rss_mb"] > 0 and result["worker_processes"] >= 1, result
    assert (result["dbos_calls"], result["dbos_duplicates"]) == (12, 0), result
    assert (result["dbos_failed"], result["dbos_lost"]) == (0, 0), result
    for key in ("makespan_s", "dbos_makespan_s", "vs_dbos"):
        assert result[key] is not None, key

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
def test_the_engine_benchmark_pairs_taskpilots_with_dbos_and_reports_what_each_costs(tmp_path):
    from taskpilots.evidence import artifacts
    from taskpilots.evidence.bench_engine import bench_engine
    from taskpilots.evidence.bench_engine_report import render_engine

    result = bench_engine(
        runs=20, workers=2, say=lambda line: None, pairs=1, seconds=1, dbos_threads=(1, 16)
    )
    assert result["pairs"] == 1
    # The statements a run sends, counted on the cursor: the exact guard (as above), for the
    # slow path too (its baseline reads and the ordinary verbs).
    assert result["statements_per_run"]["bench.five"] <= MAX_STATEMENTS_PER_RUN
    assert result["statements_per_run"]["bench.verified"] <= 2 * MAX_STATEMENTS_PER_RUN
    ours = result["taskpilots"]
    # Durable commits (transaction ids handed out): the 3 writing statements a run, plus the
    # workers' heartbeats meanwhile. Well above means a writing transaction crept in.
    assert 3 <= ours["commits_per_run"] <= 5, ours
    # WAL: the run's rows and events with its 1–16 KB document a few times over; a run writing
    # far more than that has started to copy its payloads around.
    assert 0 < ours["wal_bytes_per_run"] < 200_000, ours
    # WAL records by kind, where pg_walinspect can be had: a run inserts its row, 5 steps, 2
    # snapshots, 2 ledger rows and 19 events (29 rows), and the heartbeats write nothing new.
    # More means the protocol started writing rows it did not before.
    # The documents compress as prose does, so most are still over 2 KB compressed: both sides
    # store them out of line (TOAST chunks, counted apart from the tables' rows).
    if _walinspect_available():
        records = ours["wal_records_per_run"]
        assert 29 <= records["heap_inserts"] <= 31, records
        assert records["toast_chunks"] > 0 and records["toast_index_entries"] > 0, records
        theirs = result["dbos_docs"]["wal_records_per_run"]
        assert theirs["heap_inserts"] > 0 and theirs["toast_chunks"] > 0, theirs
    for part in ("workers", "client", "postgres"):
        assert ours["cpu_ms_per_step"][part] > 0, (part, ours)
    # DBOS, the same workflow as its docs teach and with every line a step: each durable step
    # output is a commit of its own (start, 3 steps, end; 5 steps with the computations).
    docs, steps = result["dbos_docs"], result["dbos_steps"]
    assert docs["commits_per_run"] >= 4 and steps["commits_per_run"] > docs["commits_per_run"]
    assert docs["statements_per_run"] > 0 and docs["cpu_ms_per_step"]["processes"] > 0
    assert set(result["concurrency_tried"]["docs"]) == {"1", "16"}
    for name in ("vs_dbos_docs", "vs_dbos_steps"):
        ratios = result[name]
        assert ratios["min"] <= ratios["median"] <= ratios["max"] and len(ratios["pairs"]) == 1
    assert result["slow_path"]["taskpilots"]["statements_per_run"] > (ours["statements_per_run"])
    assert result["slow_path"]["vs_dbos"] > 0
    # A baseline at each system's connection count.
    assert str(2 * 10) in result["baseline_commits_per_s"], result["baseline_commits_per_s"]
    # Raw samples for the record: calibration, the pair, the slow path.
    phases = {sample["phase"] for sample in result["samples"]}
    assert phases == {"calibration", "pair 1", "slow"}
    # Recorded as the command records it, and rendered for the docs from the record.
    record = tmp_path / "engine.jsonl"
    samples = result.pop("samples")
    artifacts.write(record, "engine", result, samples)
    kinds = [line["kind"] for line in artifacts.read(record)]
    assert kinds == ["environment", *["sample"] * len(samples), "result"]
    text = render_engine(artifacts.read(record))
    assert f"**{ours['steps_per_s_median']:,.0f}**" in text
    assert f"{result['vs_dbos_docs']['median']:.2f}×" in text
    assert "| 1 | TaskPilots → docs → steps |" in text


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

    result = bench_io(runs=6, latency_ms=50, pairs=1, say=lambda line: None)
    assert result["runs_succeeded"] == 6, result
    assert (result["runs_failed"], result["runs_lost"], result["runs_needs_human"]) == (0, 0, 0)
    # Counted where the calls land: two per run, each key once, each one in the ledger.
    assert (result["calls"], result["duplicates"]) == (12, 0), result
    assert result["landed_without_receipt"] == result["receipt_without_landing"] == 0, result
    assert 1 <= result["peak_in_flight"] <= result["concurrency"], result
    assert 0 < result["db_connections_peak"] <= result["max_connections"], result
    assert result["worker_rss_mb"] > 0 and result["worker_processes"] >= 1, result
    for dbos in ("dbos_", "dbos_one_process_"):
        assert (result[f"{dbos}calls"], result[f"{dbos}duplicates"]) == (12, 0), result
        assert (result[f"{dbos}failed"], result[f"{dbos}lost"]) == (0, 0), result
    # DBOS on TaskPilots' resources: as many processes, threads and pooled connections (its
    # notification listener holds one more connection per process, outside the pool).
    assert result["dbos_processes"] == result["processes"], result
    assert result["dbos_threads"] == result["concurrency"], result
    assert result["dbos_sys_db_pool_size"] == result["db_pool_size"], result
    assert result["dbos_db_connections_peak"] <= result["processes"] * (result["db_pool_size"] + 1)
    for key in ("makespan_s", "dbos_makespan_s", "vs_dbos", "vs_dbos_one_process"):
        assert result[key] is not None, key


@pytest.mark.parametrize(
    "argv, message",
    [
        (["crash", "--kills", "0"], "--kills and --pairs"),
        (["engine", "--pairs", "0"], "--kills and --pairs"),
        (["inbox", "--consoles", "0"], "--consoles"),
        (["io", "--latency-ms", "-1"], "--latency-ms"),
    ],
)
def test_bad_benchmark_options_are_refused_before_a_scratch_database_is_made(argv, message):
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match=message):
        call_command("bench", *argv)


def _walinspect_available() -> bool:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'pg_walinspect'")
        return cursor.fetchone() is not None

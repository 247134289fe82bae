"""profile_engine measures the engine's own CPU per run and records where it came from."""

from __future__ import annotations

import json

import pytest
from django.core.management import CommandError, call_command

from runs.models import Run
from taskpilots.evidence import artifacts
from taskpilots.evidence.profile import render_profile


@pytest.mark.django_db(transaction=True)
def test_profile_engine_measures_start_and_advance_and_records_them(tmp_path, capsys):
    argv = ["--here", "--runs", "3", "--repeat", "2", "--out", str(tmp_path)]
    call_command("profile_engine", *argv)
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert figures["runs"] == 3 and figures["repeat"] == 2 and figures["tool"] == "cpu"
    for kind in ("with_payload", "without_payload"):
        for part in ("start_cpu_ms_per_run", "advance_cpu_ms_per_run"):
            spread = figures[kind][part]
            assert 0 < spread["min"] <= spread["median"] <= spread["max"], (kind, part)
        # PostgreSQL is on this machine in the tests: its backends' CPU is read from /proc (in
        # ticks: a round of 3 runs may read 0).
        for part in ("start_postgres_cpu_ms_per_run", "advance_postgres_cpu_ms_per_run"):
            spread = figures[kind][part]
            assert 0 <= spread["min"] <= spread["median"] <= spread["max"], (kind, part)
    # Every run it made (a warm-up round and 2 measured, 3 runs with and 3 without each) ended.
    runs = Run.objects.filter(business_key__startswith="prof-")
    assert runs.count() == 18 and set(runs.values_list("status", flat=True)) == {"succeeded"}
    assert runs.filter(input__has_key="doc").count() == 9
    record = artifacts.read(tmp_path / "profile.jsonl")
    assert [line["kind"] for line in record] == ["environment", "result"]
    assert record[0]["commit"] and record[1]["with_payload"]["advance_cpu_ms_per_run"]
    text = render_profile(record)
    commit = f"| `{record[0]['commit'][:7]}` | `bench.five` |"
    assert f"{commit} 1–16 KB |" in text and f"{commit} none |" in text
    # A result recorded before PostgreSQL's side was measured shows a dash in that column; of
    # a workflow recorded again, the last result is shown.
    earlier = json.loads(json.dumps(record[1]))
    del earlier["with_payload"]["advance_postgres_cpu_ms_per_run"]
    assert " | — | 2 × 3 |" in render_profile([record[0], earlier])
    later = {**record[1], "repeat": 7}
    text = render_profile([record[0], earlier, record[0], later])
    assert " | — |" not in text and text.count("| 7 × 3 |") == 2 and "| 2 × 3 |" not in text


def test_profile_engine_refuses_a_bad_payload_range():
    with pytest.raises(CommandError, match="LOW,HIGH"):
        call_command("profile_engine", "--here", "--payload-kb", "16,1")


# --- profile_engine --tool workers: the split of a worker's samples, and the main thread's CPU

_CONSUMER = (
    "main (celery/bin/celery.py:232);asynloop (celery/worker/loops.py:130);"
    "Hub.create_loop (kombu/asynchronous/hub.py:395)"
)
_THREAD = "_worker (concurrent/futures/thread.py:92);trace_task (celery/app/trace.py:453)"
_ENGINE = _THREAD + ";advance_run (runs/tasks.py:14);advance (runs/engine/execute.py:69)"
RAW = "\n".join(
    [
        f"{_CONSUMER};Connection.drain_events (amqp/connection.py:529) 30",
        f"{_THREAD};Request.execute (celery/worker/request.py:1) 5",
        f"{_ENGINE};canonical_json (runs/models/values.py:75);dumps (orjson) 4",
        f"{_ENGINE};encode (json/encoder.py:183) 1",
        f"{_ENGINE};execute_one (runs/batch.py:290);Cursor.execute (psycopg/cursor.py:97) 20",
        f"{_ENGINE};Batch.event (runs/batch.py:138) 40",
        "_bootstrap (threading.py:1012);worker (psycopg_pool/pool.py:80) 0",
        "",
        "not a sample line",
    ]
)


def test_a_workers_samples_are_split_by_where_they_ran():
    from taskpilots.evidence.profile_workers import share_of, shares

    assert share_of(f"{_ENGINE};Batch.event (runs/batch.py:138)") == "engine: rest"
    assert share_of(_CONSUMER) == "consumer"
    assert share_of(_THREAD) == "task call"
    figures = shares(RAW)
    assert figures["samples"] == 100
    assert figures["shares"] == {
        "consumer": 0.3,
        "engine: json": 0.05,
        "engine: psycopg": 0.2,
        "engine: rest": 0.4,
        "task call": 0.05,
    }
    assert shares("") == {"samples": 0, "shares": {}}


def test_the_main_threads_share_is_read_per_thread():
    import os
    import threading
    import time

    from taskpilots.evidence.profile_workers import main_thread_share, threads_cpu_s

    pid = os.getpid()
    spun, release = threading.Event(), threading.Event()

    def spin():  # 0.3 s of CPU on another thread, which is still there at the second reading
        end = time.thread_time() + 0.3
        while time.thread_time() < end:
            pass
        spun.set()
        release.wait(10)

    before = threads_cpu_s(pid)
    thread = threading.Thread(target=spin)
    thread.start()
    try:
        assert spun.wait(10)
        after = threads_cpu_s(pid)
    finally:
        release.set()
        thread.join()
    assert thread.native_id in after and pid in after
    assert main_thread_share(pid, before, after) < 0.5  # the CPU was the other thread's
    assert main_thread_share(pid, {pid: 1.0, 7: 1.0}, {pid: 2.0, 7: 4.0}) == 0.25
    assert main_thread_share(pid, {pid: 1.0}, {pid: 1.0}) == 0.0


def test_the_workers_table_is_rendered_from_its_record():
    from taskpilots.evidence.profile_workers import render_workers

    env = {"kind": "environment", "at": "2026-12-07T04:45:00+00:00", "commit": "abc1234567"}
    result = {
        "kind": "result",
        "tool": "workers",
        "workflow": "bench.five",
        "runs": 3000,
        "payload_kb": [1, 16],
        "broker": "rabbitmq",
        "worker_concurrency": 10,
        "steps_per_s": 624.4,
        "cpu_ms_per_step": {"workers": 1.332},
        "consumer_cpu_share": 0.084,
        "samples": 552,
        "shares": {"consumer": 0.1, "engine: rest": 0.9},
    }
    assert render_workers([env]) == "_No worker profile recorded yet._\n"
    text = render_workers([env, result])
    assert "624 steps/s" in text and "spent 8% of that worker's CPU" in text
    assert "| consumer | 10% |" in text and "| engine: rest | 90% |" in text


# --- profile_engine --tool postgres: the split of PostgreSQL's samples by part

# `perf script -F comm,pid,ip,sym` as perf writes it: a header (the command right-aligned, the
# pid), then the sample's frames, leaf first, each on a line starting with a tab.
PERF_SCRIPT = """\
        postgres  4242
\t          4ef218 [unknown]
\t          5f5fcb pg_parse_json
\t          4f0252 jsonb_in
\t          47e8fa PostgresMain

        postgres  4242
\t          6a0001 heap_lock_tuple
\t          6a0002 RI_FKey_check_ins
\t          6a0003 AfterTriggerFireDeferred
\t          6a0004 CommitTransaction

        postgres  4242
\t          7b0001 pglz_compress+0x12
\t          7b0002 toast_compress_datum
\t          7b0003 heap_insert
\t          7b0004 ExecInsertIndexTuples

        postgres  4242
\t          8c0001 _bt_compare
\t          8c0002 ExecInsertIndexTuples
         swapper     0
        postgres  4242
\t          9d0001 hash_search_with_hash_value
\t          9d0002 PostgresMain
        postgres  5151
\t          9d0003 XLogBackgroundFlush
          python  4240
\t          9d0004 _PyEval_EvalFrameDefault
"""


def test_postgres_samples_are_read_from_perf_script_text():
    from taskpilots.evidence.profile_postgres import read_samples

    samples = read_samples(PERF_SCRIPT.splitlines())
    assert [(command, pid) for command, pid, _ in samples] == [
        ("postgres", 4242),
        ("postgres", 4242),
        ("postgres", 4242),
        ("postgres", 4242),
        ("swapper", 0),
        ("postgres", 4242),
        ("postgres", 5151),
        ("python", 4240),
    ]
    # Frames without a name are dropped; an offset is not part of the name.
    assert samples[0][2] == ["pg_parse_json", "jsonb_in", "PostgresMain"]
    assert samples[2][2][0] == "pglz_compress"


def test_postgres_samples_go_to_the_first_part_on_their_stack():
    from taskpilots.evidence.profile_postgres import part_of, read_samples, split

    samples = read_samples(PERF_SCRIPT.splitlines())
    # The foreign-key check's row lock counts as the check, the compression inside an INSERT
    # (itself inside index maintenance's caller) as compression.
    assert [part_of(stack) for _, pid, stack in samples if pid == 4242] == [
        "json_input",
        "foreign_keys",
        "compression",
        "index_inserts",
        "other",
    ]
    figures = split(samples, {4242})
    assert figures["backend_samples"] == 5 and figures["other_postgres_samples"] == 1
    assert figures["parts"] == {
        "foreign_keys": 0.2,
        "compression": 0.2,
        "index_inserts": 0.2,
        "json_input": 0.2,
        "other": 0.2,
    }
    assert figures["top_functions"][0] == {"function": "pg_parse_json", "share": 0.2}
    with pytest.raises(RuntimeError, match="no sample of this process's PostgreSQL backends"):
        split(samples, {9999})


def test_the_postgres_table_is_rendered_from_its_record():
    from taskpilots.evidence.profile_postgres import read_samples, render_postgres, split

    figures = split(read_samples(PERF_SCRIPT.splitlines()), {4242})
    result = {
        **figures,
        "kind": "result",
        "tool": "postgres",
        "workflow": "bench.five",
        "runs": 300,
        "repeat": 4,
        "payload_kb": [1, 16],
        "frequency_hz": 999,
    }
    older = {**result, "parts": {"other": 1.0}}
    verified = {**result, "workflow": "bench.verified", "parts": {"wal_flush": 0.5, "other": 0.5}}
    env = {"kind": "environment", "commit": "abc", "recorded_at": "2026-12-07T00:00:00+00:00"}
    text = render_postgres([env, older, env, result, env, verified])
    assert "`bench.five`: 4 rounds of 300 runs with 1–16 KB payloads" in text
    assert "5 samples of the backends at 999 Hz (1 more in other PostgreSQL processes)" in text
    assert "| part of PostgreSQL's CPU | `bench.five` | `bench.verified` |" in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and "%" in line]
    # The last result of each workflow, a column each; a part one of them lacks is 0.
    assert len(rows) == 6 and rows[-1].startswith("| everything else")
    assert "| foreign-key checks at commit (a row lock on the parent each) | 20.0% | 0.0% |" in rows
    assert "| flushing WAL at commit (fdatasync) | 0.0% | 50.0% |" in rows
    assert render_postgres([env]) == "_No PostgreSQL profile recorded yet._\n"


# --- profile_engine --tool instructions: callgrind's totals at two sizes, subtracted


def test_instructions_per_run_are_the_difference_the_added_runs_make(tmp_path, monkeypatch):
    from taskpilots.evidence import profile

    totals = {100: 9_000_000_000, 200: 12_400_000_000}  # 100 more runs in each of 4 blocks

    def under(tool, workflow, runs, payload_kb, out, stamp, repeat):
        assert tool == "callgrind" and repeat == 1
        path = tmp_path / f"{runs}.callgrind"
        path.write_text(f"events: Ir\nsummary: {totals[runs]}\nfn=x\n1 5\ntotals: {totals[runs]}\n")
        return {"file": str(path)}

    monkeypatch.setattr(profile, "_under", under)
    figures = profile.instructions("bench.five", 100, (1, 16), tmp_path, "s")
    assert figures["instructions_per_run"] == 8_500_000
    assert figures["instructions"] == totals and figures["tool"] == "instructions"
    # Without payloads a round is one block, not two.
    assert (
        profile.instructions("bench.five", 100, (0, 0), tmp_path, "s")["instructions_per_run"]
        == 17_000_000
    )
    (tmp_path / "empty.callgrind").write_text("events: Ir\n")
    with pytest.raises(ValueError, match="no totals"):
        profile.callgrind_total(tmp_path / "empty.callgrind")

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
    # Every run it made (a warm-up round and 2 measured, 3 runs with and 3 without each) ended.
    runs = Run.objects.filter(business_key__startswith="prof-")
    assert runs.count() == 18 and set(runs.values_list("status", flat=True)) == {"succeeded"}
    assert runs.filter(input__has_key="doc").count() == 9
    record = artifacts.read(tmp_path / "profile.jsonl")
    assert [line["kind"] for line in record] == ["environment", "result"]
    assert record[0]["commit"] and record[1]["with_payload"]["advance_cpu_ms_per_run"]
    text = render_profile(record)
    assert "| `bench.five` | 1–16 KB |" in text and "| `bench.five` | none |" in text


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

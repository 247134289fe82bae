"""`bench crash` in short (docs/benchmarks.md, section 7): workers SIGKILLed mid-call on
TaskPilots and DBOS, effects counted where they land.

The guards are on what must hold whatever the machine: TaskPilots loses no run and lands no
effect twice on either target; what it cannot know (the plain target) it hands to a person. DBOS's
figures are reported as measured, so they are only checked to be there — and the target is
checked to be able to see a duplicate, so a zero is a measurement, not a blind spot.
"""

from __future__ import annotations

import socket
import time

import httpx2
import pytest

from taskpilots.evidence.bench_crash import PHASES, render_crash, schedule
from taskpilots.evidence.crash_target import CrashTarget

# Seed 2's first three kills are one before the call landed, one during it, one after it.
SEED = 2


def test_the_plain_target_counts_every_call_and_the_dedupe_target_absorbs_a_repeat():
    with CrashTarget(latency_ms=20) as target, httpx2.Client(trust_env=False) as client:
        for path in ("/plain/x", "/plain/x", "/dedupe/x", "/dedupe/x"):
            answer = client.post(target.url + path, headers={"Idempotency-Key": "k1"}, json={})
            assert answer.status_code == 200
        found = client.get(target.url + "/dedupe/x/lookup", params={"key": "k1"})
        missing = client.get(target.url + "/dedupe/x/lookup", params={"key": "k2"})
        stats = client.get(target.url + "/_stats").json()
    plain, dedupe = stats["plain"]["x"], stats["dedupe"]["x"]
    assert (plain["calls"], plain["effects"], plain["duplicated_keys"]) == (2, 2, 1)
    assert (dedupe["calls"], dedupe["effects"], dedupe["duplicated_keys"]) == (2, 1, 0)
    assert dedupe["repeated_calls_absorbed"] == 1
    assert (found.status_code, found.json()["found"]) == (200, True)
    assert missing.status_code == 404


def test_a_call_whose_caller_is_gone_before_it_lands_is_dropped_not_counted():
    with CrashTarget(latency_ms=400) as target:
        host, port = target.server.server_address
        with socket.create_connection((host, port)) as caller:
            caller.sendall(
                b"POST /plain/x HTTP/1.1\r\nHost: t\r\nIdempotency-Key: gone\r\n"
                b"Content-Length: 2\r\n\r\n{}"
            )
            assert target.wait_for("gone", "arrived", timeout=5) is not None
        # The caller closed its end 0-200 ms into the 200 ms before landing.
        assert target.wait_for("gone", "dropped", timeout=5) is not None
        time.sleep(0.3)
        stats = target.stats()["plain"]["x"]
    assert (stats["calls"], stats["dropped"], stats["effects"]) == (1, 1, 0)


def test_the_kill_schedule_is_the_seeds_and_spans_the_call():
    assert schedule(3, SEED) == schedule(3, SEED)
    assert [item["phase"] for item in schedule(3, SEED)] == list(PHASES)
    assert schedule(20, 1) != schedule(20, 2)


def _summary(**overrides) -> dict:
    timing = {"p50_ms": 2500.0, "p95_ms": 3100.0, "n": 2}
    return {
        "kills": 2,
        "hit": {"before": 1, "during": 0, "after": 1, "recorded": 0, "not arrived": 0},
        "succeeded": 2,
        "with_a_person": 0,
        "failed": 0,
        "lost": 0,
        "duplicated": 0,
        "repeated_calls_absorbed": 0,
        "succeeded_without_effect": 0,
        "unknown_to_person": 0,
        "unknown_landed": 0,
        "unknown_not_landed": 0,
        "kill_to_resume": timing,
        "kill_to_done": timing,
        "fresh_start": {"p50_ms": None, "p95_ms": None, "n": 0},
        **overrides,
    }


def test_render_crash_puts_the_systems_side_by_side_from_the_last_result():
    environment = {
        "kind": "environment",
        "benchmark": "crash",
        "at": "2026-12-07T09:00:00+00:00",
        "commit": "0123456789abcdef",
        "dirty": False,
        "cpus": 2,
        "cpu_model": "Test CPU",
        "load_avg": [3.5, 2.0, 1.0],
        "postgres": {"server_version": "15.8"},
    }
    result = {
        "kind": "result",
        "benchmark": "crash",
        "kills": 2,
        "seed": 7,
        "latency_ms": 500,
        "schedule": {"before": 1, "during": 0, "after": 1},
        "broker": "rabbitmq",
        "lease_seconds": 60,
        "heartbeat_seconds": 1.0,
        "taskpilots": {
            "dedupe": _summary(),
            "plain": _summary(succeeded=1, with_a_person=1, unknown_to_person=1, unknown_landed=1),
        },
        "dbos": {
            "dedupe": _summary(repeated_calls_absorbed=1),
            "plain": _summary(duplicated=1),
        },
    }
    older = {**result, "kills": 99}
    records = [environment, {"kind": "sample", "n": 0}, older, environment, result]
    text = render_crash(records)
    assert "--kills 2`" in text and "--kills 99" not in text
    assert "load average 3.50, 2.00, 1.00" in text and "15.8" in text and "0123456789" in text
    rows = {line.split(" | ")[0]: line for line in text.splitlines() if line.startswith("| ")}
    # Columns: TaskPilots dedupe, DBOS dedupe, TaskPilots plain, DBOS plain.
    assert rows["| **effects duplicated** (a key landed twice)"].endswith(
        "| **0** | **0** | **0** | **1** |"
    )
    assert rows["| repeated calls absorbed by the target"].endswith("| 0 | 1 | 0 | 0 |")
    assert rows["| left unknown, handed to a person (landed / not)"].endswith(
        "| 0 (0 / 0) | 0 (0 / 0) | 1 (1 / 0) | 0 (0 / 0) |"
    )
    assert "| 2.50 / 3.10 s |" in rows["| kill → work resumed, p50 / p95"]
    assert rows["| kill → fresh worker ready, p50 / p95"].endswith("| — | — | — | — |")
    assert text.rstrip().endswith("```")


@pytest.mark.worker
@pytest.mark.bench
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(300)
def test_workers_killed_mid_call_lose_nothing_and_send_nothing_twice_on_taskpilots():
    from taskpilots.evidence.bench_crash import bench_crash

    result = bench_crash(kills=3, say=lambda line: None, seed=SEED, latency_ms=400)
    samples = result.pop("samples")
    assert len(samples) == 12  # 3 kills × 2 targets × 2 systems
    ours = result["taskpilots"]
    for kind in ("dedupe", "plain"):
        assert ours[kind]["lost"] == 0, ours[kind]
        assert ours[kind]["duplicated"] == 0, ours[kind]
        assert ours[kind]["target"]["duplicated_keys"] == 0, ours[kind]
        assert ours[kind]["succeeded_without_effect"] == 0, ours[kind]
        assert ours[kind]["kill_to_resume"]["p50_ms"] is not None, ours[kind]
    # The target that dedupes and answers by key: every run finished by itself, its effect
    # landed once, found by lookup or sent again under the same key.
    assert ours["dedupe"]["succeeded"] == 3, ours["dedupe"]
    assert ours["dedupe"]["target"]["effects"] == 3, ours["dedupe"]
    # The plain target: a run killed before its receipt was recorded cannot know whether its
    # call landed, so it waits for a person with the outcome unknown — every run is one or the
    # other, and what waits is split by what the target shows.
    plain = ours["plain"]
    assert plain["succeeded"] + plain["unknown_to_person"] == 3, plain
    assert plain["unknown_landed"] + plain["unknown_not_landed"] == plain["unknown_to_person"]
    assert plain["unknown_to_person"] >= 1, plain  # the kill before the call landed at least
    # Every kill was aimed at a call the target had seen arrive (where it landed is reported:
    # on a loaded machine a kill aimed before the landing may land just after it).
    assert all(sample["hit"] in (*PHASES, "recorded") for sample in samples), samples
    # DBOS's figures are reported as measured.
    for kind in ("dedupe", "plain"):
        dbos = result["dbos"][kind]
        assert dbos["kills"] == 3
        for key in ("lost", "duplicated", "repeated_calls_absorbed", "succeeded"):
            assert isinstance(dbos[key], int), (key, dbos)
        assert dbos["target"]["calls"] >= 3, dbos

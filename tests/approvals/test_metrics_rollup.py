"""The metrics rollup: stored run rows and day sums give exactly the figures computed live.

The hand-built fixture (`world`, from test_metrics) and the load generator's runs are measured
twice: live (no stored rows) and after the rollup. Anything the rollup gets wrong about a run
or a day shows as a figure that differs.
"""

from __future__ import annotations

import io
import logging
from datetime import timedelta

import pytest
from django.conf import settings
from django.core.management import call_command
from django.utils import timezone

from approvals.metrics import dashboard as dashboard_module
from approvals.metrics import queries as queries_module
from approvals.metrics import sketch
from approvals.metrics.dashboard import compute
from approvals.metrics.prometheus import prometheus_text
from approvals.metrics.store import rollup
from approvals.metrics.window import parse_window
from approvals.models import MetricsDay, MetricsHour, RunMetrics
from runs import audit
from runs.models import Run, TimelineEvent
from taskpilots.evidence.loadgen import load_fake_runs
from tests.approvals.test_metrics import world  # noqa: F401 (the fixture)
from tests.factories import RunFactory, TakeoverFactory, UserFactory

pytestmark = pytest.mark.django_db

WINDOWS = ["24h", "7d", "30d"]


def board(now, key: str) -> dict:
    """The dashboard's JSON, less how much of it was computed live (which is what differs)."""
    data = compute(parse_window({"window": key}, now=now), now=now).as_json()
    data.pop("rollup")
    return data


def boards(now) -> dict:
    return {key: board(now, key) for key in WINDOWS}


def same(a, b, path="") -> None:
    """Equal, but for the last bits of a float mean summed in another order."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for key in a:
            same(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            same(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-4), path
    else:
        assert a == b, path


def test_stored_rows_give_the_hand_computed_figures(world):  # noqa: F811
    now = world
    live = boards(now)
    stored = rollup(now=now)
    # Every run of the fixture that has been still for a minute: all but R11 (changed now).
    assert stored == RunMetrics.objects.count() == 12
    assert not RunMetrics.objects.filter(run__status="running", run__updated_at__gte=now).exists()
    for key in WINDOWS:
        same(board(now, key), live[key], key)
    # The figures themselves, as test_metrics works them out.
    f = board(now, "24h")["figures"]
    assert f["execution_success_rate"]["counts"] == [7, 8]
    assert f["wrong_retry_rate"]["counts"] == [2, 3]
    assert f["time_to_recover_median"]["value"] == _rounded(sketch.quantile([50, 200], 0.5))
    assert f["snapshot_latency_p50"]["value"] == _rounded(
        sketch.quantile([100, 200, 500, 1000, 30000, 210000], 0.5)
    )
    assert rollup(now=now) == 0  # nothing left to store


def _rounded(value: float) -> float:
    return round(value, 4)  # as the JSON has it


def test_loadgen_runs_give_the_same_figures_live_and_stored(caplog):
    now = timezone.now()
    load_fake_runs(400, days=6, batch_size=400, seed=11, now=now)
    live = boards(now)
    live_custom = compute(_last_week(now), now=now).as_json()
    stored = rollup(now=now, full=True, batch_size=150)
    assert stored > 300
    days = MetricsDay.objects.filter(tz=settings.TIME_ZONE)
    assert days.count() >= 5
    # Each day row sums the stored rows of the runs that started that day.
    for day in days:
        started = [
            r
            for r in Run.objects.filter(pk__in=RunMetrics.objects.values("run_id"))
            if timezone.localtime(r.created_at).date() == day.day
        ]
        assert day.runs == len(started), day.day
        assert day.finished == sum(r.status in Run.TERMINAL for r in started)
        assert day.succeeded == sum(r.status == "succeeded" for r in started)
    with caplog.at_level(logging.WARNING, logger="taskpilots.metrics"):
        for key in WINDOWS:
            same(board(now, key), live[key], key)
        custom = compute(_last_week(now), now=now).as_json()
        assert custom.pop("rollup")["behind"] is False
        live_custom.pop("rollup")
        same(custom, live_custom, "custom")
    assert not caplog.records  # the stored rows covered every run, no fallback
    # Day rows rebuilt now that the open runs' rows are stored too give the same figures.
    MetricsDay.objects.all().delete()
    assert rollup(now=now, full=True) == 0
    assert MetricsDay.objects.count() == days.count()
    for key in WINDOWS:
        same(board(now, key), live[key], key)


def test_the_load_generator_writes_nothing_in_the_future():
    # Long scenarios started a few hours before `now` once ended after it: an hour after
    # midnight, yesterday's day row then missed runs that "ended" later (87 == 88).
    now = timezone.now().replace(hour=1, minute=0)
    load_fake_runs(300, days=1, batch_size=300, seed=11, now=now)
    assert not TimelineEvent.objects.filter(at__gt=now).exists()
    assert not Run.objects.filter(finished_at__gt=now).exists()
    assert Run.objects.filter(status="running").exists()  # in flight, not finished in the future


def _last_week(now):
    end = timezone.localtime(now).date()
    return parse_window(
        {"window": "custom", "start": str(end - timedelta(days=6)), "end": str(end)}, now=now
    )


def test_a_stored_row_is_not_used_once_its_run_moves_on(db):
    now = timezone.now()
    old = now - timedelta(hours=3)
    run = RunFactory(status="needs_human", created_at=old, updated_at=old)
    run.record("run.escalated", {"reason": "outage"})  # the head moves: event_seq 1
    Run.objects.filter(pk=run.pk).update(updated_at=old)
    assert rollup(now=now) == 1
    assert board(now, "24h")["figures"]["takeovers_per_100_runs"]["counts"] == [0, 1]
    # A person takes the run over: a takeover and its event. The stored row is now stale...
    TakeoverFactory(run=run, user=UserFactory(), started_at=now)
    run.record("run.taken_over", {})
    assert board(now, "24h")["figures"]["takeovers_per_100_runs"]["counts"] == [1, 1]
    # ...until the run has been still for a minute and the rollup replaces it.
    assert rollup(now=now) == 0
    assert rollup(now=now + timedelta(minutes=2)) == 1
    row = RunMetrics.objects.get(run=run)
    assert row.event_seq == Run.objects.get(pk=run.pk).event_seq and row.takeovers == 1
    assert board(now, "24h")["figures"]["takeovers_per_100_runs"]["counts"] == [1, 1]


def test_runs_the_rollup_passed_by_are_still_counted(db, caplog):
    now = timezone.now()
    RunFactory(status="succeeded", created_at=now - timedelta(hours=2), finished_at=now)
    rollup(now=now + timedelta(minutes=5))
    # A run loaded afterwards with an end long before the high-water mark.
    late = RunFactory(
        status="failed", created_at=now - timedelta(hours=3), finished_at=now - timedelta(hours=2)
    )
    with caplog.at_level(logging.WARNING, logger="taskpilots.metrics"):
        counts = board(now, "24h")["figures"]["execution_success_rate"]["counts"]
    assert counts == [1, 2]
    assert "run rollup_metrics" in caplog.text
    assert rollup(now=now + timedelta(minutes=5)) == 0  # behind the high-water mark
    assert rollup(now=now + timedelta(minutes=5), full=True) == 1
    assert RunMetrics.objects.filter(run=late).exists()


def test_a_past_days_count_of_runs_is_kept_for_minutes(db, caplog, monkeypatch):
    """The check that the stored rows stand for every run counts a past day's runs once and
    keeps the count with the day row's version for DAY_RUNS_MAX_AGE: runs written into that day
    afterwards (an import, missed by the rollup) are found within that time, or at once when
    the day row is rebuilt."""
    now = timezone.now()
    noon = timezone.localtime(now - timedelta(days=2)).replace(hour=12, minute=0, second=0)
    RunFactory(status="succeeded", created_at=noon, finished_at=noon + timedelta(hours=1))
    # Written into that day afterwards, ended before the stored rows' high-water mark.
    late = {"created_at": noon - timedelta(hours=2), "finished_at": noon - timedelta(hours=1)}
    rollup(now=now)
    assert MetricsDay.objects.filter(day=noon.date()).exists()
    assert board(now, "7d")["figures"]["execution_success_rate"]["counts"] == [1, 1]
    RunFactory(status="failed", **late)
    with caplog.at_level(logging.WARNING, logger="taskpilots.metrics"):
        # The day's count is kept: the run written into the past is not seen yet.
        assert board(now, "7d")["figures"]["execution_success_rate"]["counts"] == [1, 1]
        assert not caplog.records
        # Once the kept count is older than DAY_RUNS_MAX_AGE, the day is counted again.
        clock = queries_module.time_module.monotonic() + queries_module.DAY_RUNS_MAX_AGE
        monkeypatch.setattr(queries_module.time_module, "monotonic", lambda: clock)
        assert board(now, "7d")["figures"]["execution_success_rate"]["counts"] == [1, 2]
    assert "run rollup_metrics" in caplog.text
    # A rebuilt day row is counted again at once (its version is new).
    rollup(now=now + timedelta(minutes=5), full=True)
    assert board(now, "7d")["figures"]["execution_success_rate"]["counts"] == [1, 2]
    RunFactory(status="succeeded", **late)
    assert board(now, "7d")["figures"]["execution_success_rate"]["counts"] == [1, 2]  # kept
    MetricsDay.objects.filter(day=noon.date()).update(computed_at=now + timedelta(minutes=6))
    assert board(now, "7d")["figures"]["execution_success_rate"]["counts"] == [2, 3]


def failure_counters(now) -> list[str]:
    text = prometheus_text(now)
    return [line for line in text.splitlines() if line.startswith("taskpilots_step_failures")]


def test_pruning_payloads_keeps_every_figure(world):  # noqa: F811
    now = world
    before = boards(now)
    counters = failure_counters(now)
    assert len(counters) == 3  # mail.send transient, crm.create unknown, refund outage
    report = audit.prune_payloads(0, now=now)
    assert report.events > 0
    for key in WINDOWS:
        same(board(now, key), before[key], key)
    assert failure_counters(now) == counters  # Prometheus counters never go down
    # The stored rows are what kept them: recomputed from the pruned timeline, the failure
    # figures are lost.
    RunMetrics.objects.all().delete()
    MetricsDay.objects.all().delete()
    MetricsHour.objects.all().delete()
    assert board(now, "24h")["figures"]["tool_failure_rate"]["counts"][0] == 0


def test_the_command_reports_what_it_stored(db):
    RunFactory(status="succeeded", finished_at=timezone.now() - timedelta(minutes=5))
    out = io.StringIO()
    call_command("rollup_metrics", "--full", stdout=out, stderr=io.StringIO())
    assert out.getvalue().startswith("stored 1 run rows in ")
    assert settings.CELERY_BEAT_SCHEDULE["metrics-rollup"]["task"] == (
        "approvals.tasks.rollup_metrics"
    )


def test_the_beat_task_runs_the_rollup(db):
    from approvals.tasks import rollup_metrics
    from taskpilots.celery import app

    app.loader.import_default_modules()
    assert "approvals.tasks.rollup_metrics" in app.tasks
    RunFactory(status="failed", finished_at=timezone.now() - timedelta(minutes=5))
    assert rollup_metrics.run() == 1
    assert rollup_metrics.run() == 0


def test_a_day_row_follows_a_run_that_ends_days_after_it_started(db):
    now = timezone.now()
    two_days_ago = now - timedelta(days=2)
    done = RunFactory(
        status="succeeded", created_at=two_days_ago, finished_at=two_days_ago, updated_at=now
    )
    waiting = RunFactory(status="needs_human", created_at=two_days_ago, updated_at=two_days_ago)
    rollup(now=now)
    day = MetricsDay.objects.get(day=timezone.localtime(two_days_ago).date())
    assert (day.runs, day.finished) == (2, 1)  # the parked run's row too
    assert board(now, "7d")["figures"]["execution_success_rate"]["counts"] == [1, 1]
    # The parked run is settled today: it fails.
    waiting.fail("settled today")
    assert board(now, "7d")["figures"]["execution_success_rate"]["counts"] == [1, 2]
    later = now + timedelta(minutes=2)
    rollup(now=later)
    day.refresh_from_db()
    assert (day.runs, day.finished, day.succeeded) == (2, 2, 1)
    assert RunMetrics.objects.get(run=waiting).finished == 1
    assert RunMetrics.objects.get(run=done).finished == 1
    assert board(later, "7d")["figures"]["execution_success_rate"]["counts"] == [1, 2]


def test_an_empty_window_is_not_taken_for_a_missed_rollup(db, caplog):
    RunFactory(status="succeeded", finished_at=timezone.now() - timedelta(days=60))
    window = parse_window({"window": "custom", "start": "2020-01-01", "end": "2020-01-31"})
    with caplog.at_level(logging.WARNING, logger="taskpilots.metrics"):
        board = compute(window).as_json()
    assert board["figures"]["execution_success_rate"]["counts"] == [0, 0]
    assert not caplog.records


def test_the_page_says_when_the_rollup_is_behind(client, auditor_user, monkeypatch):
    monkeypatch.setattr(dashboard_module, "ROLLUP_BEHIND_RUNS", 50)
    now = timezone.now()
    load_fake_runs(120, days=2, batch_size=120, seed=2, now=now)
    client.force_login(auditor_user)
    behind = client.get("/console/metrics/?window=7d")
    assert "the metrics rollup is behind" in behind.content.decode()
    assert "rollup_metrics --full" in behind.content.decode()
    data = client.get("/console/metrics.json?window=7d").json()["rollup"]
    assert data["behind"] and data["live_runs"] == 120
    rollup(now=now + timedelta(minutes=2), full=True)
    assert "the metrics rollup is behind" not in client.get("/console/metrics/").content.decode()
    data = client.get("/console/metrics.json?window=7d").json()["rollup"]
    assert not data["behind"] and data["live_runs"] < 5  # the few still moving


def test_hour_rows_give_the_same_figures_as_their_runs_late_in_the_day():
    # Late in the day a week's window reads today from many hour rows, and the 24 h window reads
    # yesterday's and today's: each hour's sketch and counts must count once, in its own bucket.
    now = timezone.now().replace(hour=21, minute=30)
    load_fake_runs(240, days=2, batch_size=240, seed=5, now=now)
    live = boards(now)
    rollup(now=now + timedelta(minutes=2), full=True)
    assert MetricsHour.objects.filter(hour__gte=now - timedelta(hours=21)).count() >= 15
    for key in WINDOWS:
        same(board(now, key), live[key], key)


def _resumes(text: str) -> float:
    (line,) = [line for line in text.splitlines() if line.startswith("taskpilots_resumes_total ")]
    return float(line.split()[1])


def test_prometheus_reads_the_same_from_stored_rows_as_live(db):
    # /metrics adds the counters stored for ended runs to the open runs' current rows (the
    # open runs and the open rows in one hash join) and to the runs computed live.
    now = timezone.now()
    load_fake_runs(300, days=3, batch_size=300, seed=5, now=now)
    live = prometheus_text(now)
    assert rollup(now=now, full=True) > 250
    assert RunMetrics.objects.filter(finished=0).count() > 5  # open runs' rows are stored too
    assert prometheus_text(now) == live
    # An open run resumes: its stored row is no longer current, and it is computed live (once).
    run = Run.objects.filter(status="needs_human").first()
    run.record("run.resumed", {})
    assert _resumes(prometheus_text(now)) == _resumes(live) + 1

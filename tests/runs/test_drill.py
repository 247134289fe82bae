"""A small drill in `make test`: every drill kind recovers, nothing is lost, nothing is doubled.

The figures come from the database and the sandbox ledger
(taskpilots/evidence/drill_report.py::compute_report)."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.db import connection

from approvals.models import EscalationRule
from runs.models import Run
from taskpilots.evidence.drill import KINDS, Drill, DrillConfig, parse_faults
from taskpilots.evidence.scratch import scratch_name
from taskpilots.evidence.stalls import HOT_PATH_MOMENTS, PARTITION_MOMENTS, ZOMBIE_MOMENTS

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


@pytest.mark.timeout(300)
def test_a_small_drill_loses_nothing_and_duplicates_nothing(sandbox):
    config = DrillConfig(runs=len(KINDS), workers=2, batch_timeout=60, sandbox_url=sandbox.base_url)
    with Drill(config) as drill:
        report = drill.run()
    assert report["runs"] == len(KINDS)
    assert report["lost_runs"] == 0
    assert report["duplicate_side_effects"] == 0, report["duplicates"]
    # Drills resume runs (killed workers, approvals): none of those resumes duplicated anything.
    after_resume = report["duplicates_after_resume"]
    assert after_resume["resumes"] > 0 and after_resume["duplicates"] == 0, after_resume
    assert report["snapshot_coverage"] == 1.0
    assert report["committed_without_snapshot"] == 0  # the outside world's view agrees
    for kind in KINDS:
        row = report["per_kind"][kind]
        assert row["succeeded"] + row["needs_human"] == row["runs"], (kind, row)
    assert report["auto_recovered"] >= 4  # timeouts, resets, a killed worker, a lost receipt
    # The down relay's write went out once, through its fallback.
    assert report["per_kind"]["degrade_write"]["through_fallback_once"] == 1
    assert 0 < report["human_takeover_rate"] < 1
    # The figures are the dashboard's own (approvals.metrics.seed_figures), not a second copy.
    assert report["auto_recovery_rate"] == round(
        report["auto_recovered"] / report["runs_with_faults"], 4
    )


@pytest.mark.timeout(300)
def test_the_drill_command_leaves_the_install_it_runs_beside_as_it_found_it(sandbox, capfd):
    # A drill against a live install once left six rules on top of the admin's rules page, a
    # drill user and drill workflows in the filters, and cleared the sandbox's seeded outage.
    outage = sandbox.inject("mail", "outage", seconds=1200)
    before = (Run.objects.count(), EscalationRule.objects.count(), get_user_model().objects.count())
    call_command("drill", runs=2, faults="interrupt_before,worker_kill", workers=1, json=True)
    report = capfd.readouterr().out.strip().splitlines()[-1]
    assert '"lost_runs": 0' in report and '"duplicate_side_effects": 0' in report, report
    after = (Run.objects.count(), EscalationRule.objects.count(), get_user_model().objects.count())
    assert after == before
    assert [f["id"] for f in sandbox.faults()] == [outage["id"]]
    assert sandbox.ledger() == []
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", [scratch_name("drill")])
        assert cursor.fetchall() == []  # the scratch database is gone


def _stall_drill(
    sandbox, kind: str, runs: int, concurrency: int = 1, **worker_env: str
) -> tuple[Drill, dict]:
    config = DrillConfig(
        runs=runs,
        faults=(kind,),
        workers=2,
        concurrency=concurrency,
        batch_timeout=60,
        sandbox_url=sandbox.base_url,
        worker_env=worker_env,
    )
    with Drill(config) as drill:
        report = drill.run()
    return drill, report


def _assert_stalled_workers_did_nothing(drill: Drill, report: dict, sandbox, stalls: int) -> None:
    # Each episode's verdict with the drill's note beside it (how long it waited, and for what).
    verdicts = [(e["moment"], e["variant"], e["verdict"], e["note"]) for e in report["episodes"]]
    assert report["stalls_injected"] == stalls, verdicts
    assert report["lost_runs"] == 0
    # The receiving side: one mail per run, whatever the stalled worker did when it came back.
    mails = {str(r): len(sandbox.ledger(system="mail", run=str(r))) for r in drill.all_run_ids()}
    assert set(mails.values()) == {1}, (mails, verdicts)
    assert report["duplicate_side_effects"] == 0, (report["duplicates"], verdicts)
    # From the stalled worker's own call log and the events it committed: nothing sent, nothing
    # recorded once another worker held the step (a refused outcome may be recorded as such).
    assert report["stale_calls"] == 0, verdicts
    assert report["stale_writes"] == 0, verdicts
    assert report["ledger_mismatches"] == 0, report["mismatches"]
    assert report["claims_not_taken_back"] == 0, verdicts
    assert report["hung_workers"] == 0, verdicts
    assert report["succeeded"] == report["runs"]


@pytest.mark.timeout(300)
def test_a_stopped_worker_that_wakes_sends_nothing_and_records_nothing(sandbox):
    # SIGSTOP after the claim, after the intent, during the call and after the answer, each
    # kept stopped past the lease until another worker took the step back and finished it,
    # then SIGCONT: a worker that was only paused must not send the mail a second time or
    # record anything over its successor's work.
    drill, report = _stall_drill(sandbox, "zombie", len(ZOMBIE_MOMENTS))
    _assert_stalled_workers_did_nothing(drill, report, sandbox, len(ZOMBIE_MOMENTS))


@pytest.mark.timeout(300)
def test_on_the_hot_path_a_stopped_worker_that_wakes_sends_nothing(sandbox):
    # The same on the path production runs, where a step's claim carries its intent.
    moments = len(HOT_PATH_MOMENTS["zombie"])
    drill, report = _stall_drill(sandbox, "zombie", moments, TASKPILOTS_HOT_PATH="1")
    _assert_stalled_workers_did_nothing(drill, report, sandbox, moments)


@pytest.mark.timeout(400)
def test_a_black_holed_worker_is_taken_over_and_sends_nothing_twice(sandbox):
    # The worker's PostgreSQL connection black-holed (no reset: the sockets stay open) before
    # the intent, inside the intent's transaction, on its COMMIT, right after it and after the
    # answer; held past the lease; then healed, and the same again cut. The workers run 4
    # threads, as production runs many: the stalled task's other threads go on beside it, and
    # may take the run afresh once its new owner let it go (that is not a stale write).
    drill, report = _stall_drill(sandbox, "partition", 2 * len(PARTITION_MOMENTS), concurrency=4)
    _assert_stalled_workers_did_nothing(drill, report, sandbox, 2 * len(PARTITION_MOMENTS))
    assert {e["variant"] for e in report["episodes"]} == {"heal", "cut"}
    assert [e["proxy"]["holes"][-1]["ended"] for e in report["episodes"]] == (
        ["healed"] * len(PARTITION_MOMENTS) + ["cut"] * len(PARTITION_MOMENTS)
    )


def test_unknown_drill_kinds_are_refused_with_the_list():
    with pytest.raises(ValueError, match="choose from"):
        parse_faults("interrupt_before,meteor")
    with pytest.raises(CommandError, match="--runs"):
        call_command("drill", runs=0)


@pytest.mark.chaos
@pytest.mark.timeout(600)
def test_a_short_chaos_soak_loses_nothing_and_duplicates_nothing(sandbox):
    # Workers SIGKILLed, the broker and PostgreSQL restarted, the simulated systems dropped,
    # while every drill kind runs. The services are running again afterwards.
    from django.db import connections

    config = DrillConfig(
        runs=len(KINDS) * 2, workers=4, batch_timeout=240, chaos=True, chaos_interval=(2.0, 4.0)
    )
    try:
        with Drill(config) as drill:
            report = drill.run()
    finally:
        connections.close_all()
    assert report["lost_runs"] == 0
    assert report["duplicate_side_effects"] == 0, report["duplicates"]
    assert report["chaos"], "no fault was injected"
    assert report["succeeded"] + report["needs_human"] == report["runs"]


def test_only_the_stalled_tasks_own_calls_and_records_count_as_stale():
    # In a threads pool the stalled task shares its process with other tasks: what another
    # thread did on a claim of its own is not the stalled task's doing; logs without a thread
    # (a process that runs one task at a time) are the process's.
    from taskpilots.evidence.stalls import Episode, _by_stalled_task

    episode = Episode(number=0, kind="partition", moment="in_transaction", variant="heal", wake="x")
    episode.pid, episode.thread = 41, 7
    assert _by_stalled_task({"pid": 41, "thread": 7}, episode)
    assert not _by_stalled_task({"pid": 41, "thread": 8}, episode)
    assert not _by_stalled_task({"pid": 42, "thread": 7}, episode)
    assert _by_stalled_task({"pid": 41}, episode)
    episode.thread = None
    assert _by_stalled_task({"pid": 41, "thread": 8}, episode)


@pytest.mark.timeout(300)
def test_the_drill_reports_changed_results_and_a_planted_external_mismatch(sandbox):
    faults = ("changed_result", "external_mismatch")
    config = DrillConfig(runs=4, faults=faults, workers=2, batch_timeout=60,
                         sandbox_url=sandbox.base_url)  # fmt: skip
    with Drill(config) as drill:
        report = drill.run()
    assert report["lost_runs"] == 0
    assert report["duplicate_side_effects"] == 0, report["duplicates"]
    # Each recovered refund was found with another amount and a person confirmed it.
    assert report["results_changed"] == 2
    assert report["ledger_mismatches"] == 0  # the accepted answer is what the bank holds
    assert report["per_kind"]["changed_result"]["succeeded"] == 2
    # One mail changed out there; two passes of the check record it once.
    assert report["external_mismatches"] == 1
    assert report["per_kind"]["external_mismatch"]["succeeded"] == 2

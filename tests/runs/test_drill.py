"""A small drill in `make test`: every drill kind recovers, nothing is lost, nothing is doubled.

The figures come from the database and the sandbox ledger (runs/drill.py::compute_report)."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from runs.drill import KINDS, Drill, DrillConfig, parse_faults

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


@pytest.mark.timeout(300)
def test_a_small_drill_loses_nothing_and_duplicates_nothing(sandbox):
    with Drill(DrillConfig(runs=len(KINDS), workers=2, batch_timeout=60)) as drill:
        report = drill.run()
    assert report["runs"] == len(KINDS)
    assert report["lost_runs"] == 0
    assert report["duplicate_side_effects"] == 0, report["duplicates"]
    assert report["snapshot_coverage"] == 1.0
    for kind in KINDS:
        assert report["per_kind"][kind]["recovered"] >= 1, (kind, report["per_kind"][kind])
    assert report["auto_recovered"] >= 4  # timeouts, resets, a killed worker, a lost receipt
    assert 0 < report["human_takeover_rate"] < 1


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

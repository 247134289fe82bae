"""profile_engine measures the engine's own CPU per run and records where it came from."""

from __future__ import annotations

import json

import pytest
from django.core.management import CommandError, call_command

from runs.models import Run
from taskpilots.evidence import artifacts


@pytest.mark.django_db(transaction=True)
def test_profile_engine_measures_start_and_advance_and_records_them(tmp_path, capsys):
    call_command("profile_engine", "--here", "--runs", "3", "--out", str(tmp_path))
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert figures["runs"] == 3 and figures["tool"] == "cpu"
    assert figures["start_cpu_ms_per_run"] > 0 and figures["advance_cpu_ms_per_run"] > 0
    # Every run it made (3 to warm up, 3 measured) went to the end.
    runs = Run.objects.filter(business_key__startswith="prof-")
    assert runs.count() == 6 and set(runs.values_list("status", flat=True)) == {"succeeded"}
    record = artifacts.read(tmp_path / "profile.jsonl")
    assert [line["kind"] for line in record] == ["environment", "result"]
    assert record[0]["commit"] and record[1]["advance_cpu_ms_per_run"] > 0


def test_profile_engine_refuses_a_bad_payload_range():
    with pytest.raises(CommandError, match="LOW,HIGH"):
        call_command("profile_engine", "--here", "--payload-kb", "16,1")

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

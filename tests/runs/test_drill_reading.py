"""The drill's table reads as figures with units and counts (issue 33 §6: it printed
`snapshot_latency_p50 20.2884` and `human_takeover_rate 0.2` beside `needs_human 0`)."""

from __future__ import annotations

from io import StringIO

from taskpilots.evidence.management.commands.drill import LEGEND, Command, reading


def test_a_ratio_reads_as_a_percentage_with_its_counts_and_label():
    detail = {"label": "Human takeover rate", "unit": "ratio", "counts": [2, 10]}
    assert reading(0.2, detail) == f"{'20.0 % (2 of 10)':<24} Human takeover rate"


def test_durations_carry_their_unit():
    assert reading(20.2884, {"label": "L", "unit": "ms", "counts": None}).startswith("20.3 ms ")
    assert reading(3600.0, {"label": "L", "unit": "seconds", "counts": None}).startswith(
        "3,600.0 s "
    )


def test_a_figure_with_nothing_to_measure_says_so_and_plain_counts_stay_plain():
    assert reading(None, {"label": "L", "unit": "ratio", "counts": None}) == "—"
    assert reading(12, None) == "12"


def test_the_table_explains_needs_human_beside_the_takeover_rate():
    out = StringIO()
    command = Command(stdout=out)
    keys = {
        "runs": 10, "succeeded": 10, "needs_human": 0, "failed": 0, "lost_runs": 0,
        "duplicate_side_effects": 0, "committed_without_snapshot": 0, "ledger_mismatches": 0,
        "results_changed": 0, "external_mismatches": 0, "runs_with_faults": 4,
        "auto_recovered": 3, "stalls_injected": 0, "claims_not_taken_back": 0,
        "hung_workers": 0, "stale_calls": 0, "stale_writes": 0, "elapsed_s": 12.5,
    }  # fmt: skip
    from taskpilots.evidence.drill_report import FIGURE_KEYS

    figures = dict.fromkeys(FIGURE_KEYS) | {"human_takeover_rate": 0.2}
    details = {key: {"label": key, "unit": "ratio", "counts": None} for key in FIGURE_KEYS}
    details["human_takeover_rate"]["counts"] = [2, 10]
    report = {**keys, **figures, "figure_details": details, "per_kind": {}, "episodes": []}
    command._print_table(report)
    text = out.getvalue()
    assert "20.0 % (2 of 10)" in text
    assert all(line in text for line in LEGEND)

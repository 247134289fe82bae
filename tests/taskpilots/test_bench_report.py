"""docs/benchmarks.md quotes only what the committed result files give (bench_report --check)."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from taskpilots.evidence import report


def test_the_docs_blocks_match_the_committed_results():
    _, changed = report.regenerate()
    assert changed == [], f"run `python manage.py bench_report` and commit: {changed}"
    call_command("bench_report", "--check")


def test_a_figure_typed_into_a_block_is_caught(tmp_path):
    doc = tmp_path / "benchmarks.md"
    text = report.DOC.read_text(encoding="utf-8")
    start = text.index("<!-- results:engine -->\n") + len("<!-- results:engine -->\n")
    doc.write_text(text[:start] + "TaskPilots: 9,999 steps/s\n" + text[start:], encoding="utf-8")
    regenerated, changed = report.regenerate(doc)
    assert changed == ["engine"]
    assert "9,999 steps/s" not in regenerated
    assert regenerated == text


def test_every_block_has_a_renderer_and_a_result_file():
    text = report.DOC.read_text(encoding="utf-8")
    names = [m["name"] for m in report.BLOCK.finditer(text)]
    assert {"engine", "io", "crash"} <= set(names)
    for name in names:
        assert name in report.RENDERERS
        assert (report.RESULTS / f"{name}.jsonl").exists(), name


def test_check_fails_with_what_to_do(monkeypatch, tmp_path):
    doc = tmp_path / "benchmarks.md"
    doc.write_text("<!-- results:io -->\nstale\n<!-- /results:io -->\n", encoding="utf-8")
    monkeypatch.setattr(report, "DOC", doc)
    with pytest.raises(CommandError, match="bench_report"):
        call_command("bench_report", "--check")

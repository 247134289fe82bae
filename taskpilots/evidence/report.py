"""docs/benchmarks.md's figures, regenerated from the committed result files.

    python manage.py bench_report [--check]

Each benchmark that quotes figures has a result file, docs/results/<name>.jsonl (written by
`manage.py bench <which> --record docs/results/<name>.jsonl`, see artifacts.py), and a block in
docs/benchmarks.md between `<!-- results:<name> -->` and `<!-- /results:<name> -->`. The block is
the output of the renderer named below for that file's records; nothing inside a block is typed
by hand. `--check` (run by the tests) fails when a block differs from what its file gives.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from taskpilots.evidence import artifacts

DOC = artifacts.ROOT / "docs" / "benchmarks.md"
RESULTS = artifacts.ROOT / "docs" / "results"

# result file name → "module:function" taking the file's records and returning Markdown.
RENDERERS = {
    "engine": "taskpilots.evidence.bench_engine_report:render_engine",
    "io": "taskpilots.evidence.bench_io_report:render_io",
    "crash": "taskpilots.evidence.bench_crash:render_crash",
    "recovery": "taskpilots.evidence.bench_recovery:render_recovery",
    "profile": "taskpilots.evidence.profile:render_profile",
    "workers": "taskpilots.evidence.profile_workers:render_workers",
    "postgres": "taskpilots.evidence.profile_postgres:render_postgres",
}

BLOCK = re.compile(
    r"(<!-- results:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /results:(?P=name) -->)", re.S
)


def render(name: str) -> str:
    module, function = RENDERERS[name].split(":")
    records = artifacts.read(RESULTS / f"{name}.jsonl")
    text = getattr(importlib.import_module(module), function)(records)
    return text if text.endswith("\n") else text + "\n"


def regenerate(doc: Path | None = None) -> tuple[str, list[str]]:
    """The document (docs/benchmarks.md unless `doc`) with every block regenerated, and the
    names of the blocks that changed."""
    original = (doc or DOC).read_text(encoding="utf-8")
    changed = []

    def block(match: re.Match) -> str:
        name = match["name"]
        if name not in RENDERERS:
            raise KeyError(f"docs/benchmarks.md has a block for {name!r}, which has no renderer")
        body = render(name)
        if body != match["body"]:
            changed.append(name)
        return match.group(1) + body + match.group(4)

    return BLOCK.sub(block, original), changed

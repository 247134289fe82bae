"""Import rules docs/architecture.md states, read from the source: `approvals` reaches the engine
only through its public names (`runs.engine`), never its modules."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _imports(folder: str) -> list[tuple[str, str]]:
    found = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        if "migrations" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module:
                found.append((str(path.relative_to(ROOT)), node.module))
            elif isinstance(node, ast.Import):
                found += [(str(path.relative_to(ROOT)), alias.name) for alias in node.names]
    return found


def test_approvals_uses_only_the_engines_public_names():
    # ast.walk: imports inside functions (the lazy ones) count as much as the module's own.
    private = [
        (path, module)
        for path, module in _imports("approvals")
        if module.startswith("runs.engine.")
    ]
    assert private == [], "import these names from runs.engine (add them to its __all__)"

"""Every web process lists the same workflows and tools: the lazily registered ones (the demo
agent, which imports openai-agents) once showed on some gunicorn workers and not on others,
depending on whether that process had happened to start one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_fresh_process_lists_the_lazily_registered_workflows_and_tools():
    code = (
        "import django; django.setup(); import sys; "
        "from runs import tools, workflows; "
        "assert 'demo.agent' not in sys.modules['runs.workflows']._WORKFLOWS; "
        "print(sorted({w.name for w in workflows.all_workflows()} & {'demo.agent'}), "
        "sorted(n for n in tools.all_tools() if n.startswith('demo.agent.'))[:1])"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-2000:]
    workflows, tools = result.stdout.strip().split("] [")
    assert workflows == "['demo.agent'" and tools.startswith("'demo.agent."), result.stdout

from __future__ import annotations

import importlib

from django.conf import settings


def autodiscover() -> None:
    """Import the modules that register workflows and tools (settings.TASKPILOTS
    ["WORKFLOW_MODULES"]), so every process — web, worker, beat — knows the same ones."""
    for module in settings.TASKPILOTS["WORKFLOW_MODULES"]:
        importlib.import_module(module)

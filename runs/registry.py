from __future__ import annotations

import importlib

from django.conf import settings


def autodiscover() -> None:
    """Import the modules that register workflows and tools (settings.TASKPILOTS
    ["WORKFLOW_MODULES"]), so every process — web, worker, beat — knows the same ones."""
    for module in settings.TASKPILOTS["WORKFLOW_MODULES"]:
        importlib.import_module(module)


def load_lazily(name: str) -> bool:
    """Import the module that registers workflow or tool `name`, for modules too heavy to import
    in every process at start-up (settings.TASKPILOTS["LAZY_MODULES"]: name or prefix → module).
    Returns True when a module was imported, so the caller looks again."""
    for prefix, module in settings.TASKPILOTS["LAZY_MODULES"].items():
        if name == prefix or (prefix.endswith(".") and name.startswith(prefix)):
            before = len(importlib.sys.modules)
            importlib.import_module(module)
            return len(importlib.sys.modules) != before
    return False

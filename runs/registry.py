from __future__ import annotations

import importlib
import logging

from django.conf import settings

logger = logging.getLogger("taskpilots.engine")


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


_all_loaded = False


def load_all_lazily() -> None:
    """Import every lazily registered module once in this process: for the pages and schemas
    that list every workflow and tool, which must list the same ones in every web process
    (they once depended on which process had happened to start a lazy workflow). A module
    whose optional dependency is missing is left out, as at any other use of it."""
    global _all_loaded
    if _all_loaded:
        return
    for module in dict.fromkeys(settings.TASKPILOTS["LAZY_MODULES"].values()):
        try:
            importlib.import_module(module)
        except ImportError:
            pass  # an optional extra is not installed: its workflows are not offered
        except Exception:  # a listing page must not fail for one module's error
            logger.exception("importing %s (lazily registered workflows) failed", module)
    _all_loaded = True

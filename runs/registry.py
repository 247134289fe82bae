from __future__ import annotations


def autodiscover() -> None:
    """Import the modules that register workflows and tools."""

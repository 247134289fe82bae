from __future__ import annotations

import pytest

from approvals import local_metadata


@pytest.fixture(autouse=True)
def fresh_local_metadata():
    """The process's copy of the local tool metadata outlives a test's rolled-back rows: start
    and end every test with none, so a decision never leaks into the next test."""
    local_metadata.CACHE.reset()
    yield
    local_metadata.CACHE.reset()


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch):
    """This process's cache on a clock the test drives (no sleeps)."""
    fake = Clock()
    monkeypatch.setattr(local_metadata.CACHE, "clock", fake)
    return fake

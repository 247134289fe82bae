from __future__ import annotations

import pytest

from approvals import local_metadata


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture(autouse=True)
def clock(monkeypatch):
    """This process's copy of the local tool metadata, fresh and on a clock the test drives.

    Fresh: the copy outlives a test's rolled-back rows, so a decision would leak into the next
    test. Stopped: its timed checks read committed rows only (on a connection of their own), so
    one falling inside a test would drop the decisions the test made in its transaction.
    """
    fake = Clock()
    local_metadata.CACHE.reset()
    monkeypatch.setattr(local_metadata.CACHE, "clock", fake)
    yield fake
    local_metadata.CACHE.reset()

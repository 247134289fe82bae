"""The engine's hook points: where code outside it may watch what it records or stand in for a
tool, without replacing any of its functions.

Two points, both empty unless something registers on them:
- `wrap_tools(wrapper)`: `runs.tools.get` hands out `wrapper(tool)` instead of the tool (the
  same tool, or a stand-in that calls it);
- `observe_events(observer)`: `observer(run_id, events)` is called once timeline events the
  engine wrote have committed, whichever way they were written (`TimelineEvent.append` inside
  the caller's transaction, or a hot-path batch that is its own transaction); each event is a
  dict with its `at` (ISO 8601: when its writer made it, which
  can be long before the commit that a stalled or cut-off process completes), `verb`, `data`
  and `hash`.

The engine registers nothing here. The only registrant is the evidence app's fault injection
and drill logging (taskpilots/evidence/faults.py), and production settings do not install that
app: in production both lists stay empty, so a process whose environment has the fault
variables set injects nothing (tests/taskpilots/test_production_tooling.py). An observer or
wrapper that raises is logged and skipped, never changes what the engine does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.db import transaction

logger = logging.getLogger("taskpilots.engine")

ToolWrapper = Callable[[Any], Any]
EventObserver = Callable[[str, list[dict]], None]

# The engine's hot path checks these lists itself (`if hooks.event_observers:`): no call where
# nothing is registered.
tool_wrappers: list[ToolWrapper] = []
event_observers: list[EventObserver] = []


def wrap_tools(wrapper: ToolWrapper) -> None:
    tool_wrappers.append(wrapper)


def observe_events(observer: EventObserver) -> None:
    event_observers.append(observer)


def clear() -> None:
    """Forget every registration (a test that registered its own)."""
    tool_wrappers.clear()
    event_observers.clear()


def wrapping_tools() -> bool:
    return bool(tool_wrappers)


def observing_events() -> bool:
    return bool(event_observers)


def wrapped(tool):
    for wrapper in tool_wrappers:
        try:
            tool = wrapper(tool)
        except Exception:
            logger.exception("hook: tool wrapper %r failed; the tool is used as it is", wrapper)
    return tool


def events_committed(run_id, events: list[dict]) -> None:
    """Tell the observers about `events` of the run, committed."""
    for observer in event_observers:
        try:
            observer(str(run_id), events)
        except Exception:
            logger.exception("hook: event observer %r failed", observer)


def events_written(run_id, events: list[dict]) -> None:
    """`events` were written: tell the observers once the transaction that wrote them has
    committed (at once outside a transaction block; nothing if it rolls back)."""
    transaction.on_commit(lambda: events_committed(run_id, events))

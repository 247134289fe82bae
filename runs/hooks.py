"""The engine's hook points: where code outside it may watch what it records, stand in for a
tool or time the work it does, without replacing any of its functions.

Four points, all empty unless something registers on them:
- `wrap_tools(wrapper)`: `runs.tools.get` hands out `wrapper(tool)` instead of the tool (the
  same tool, or a stand-in that calls it);
- `observe_events(observer)`: `observer(run_id, events)` is called once timeline events the
  engine wrote have committed, whichever way they were written (`TimelineEvent.append` inside
  the caller's transaction, or a hot-path batch that is its own transaction); each event is a
  dict with its `at` (ISO 8601: when its writer made it, which
  can be long before the commit that a stalled or cut-off process completes), `actor`, `verb`,
  `data` and `hash`;
- `trace(tracer)`: `tracer.start(what, subject)` is called as a piece of the engine's work
  begins and `tracer.end(token, result, error)` as it ends, in the thread that does it, with
  what `start` returned (a span around it: taskpilots/otel). The pieces: `"step"`, one
  execution of a step (subject: its `runs.engine.claim.Claim`; result: the `Outcome`), in
  `runs.engine.steps.execute` — every claimed step, and the reads executed ahead of their
  claim — and in `runs.engine.inline` for a pure compute step executed ahead (its step has no
  row id yet; result: a `Succeeded`, or `None` when it failed there and the ordinary path
  executes it again); `"model_request"`, a model turn's request to the model
  (`runs.agents.sdk.runner`; subject: {"agent": name, "model": name}; result: the SDK's
  `ModelResponse`). Tool calls are timed through `wrap_tools`;
- `propagate(injector)`: `injector(headers)` adds to the headers of every HTTP request an
  http tool sends (runs.tools.http_request), in the thread that sends it: the trace context
  (W3C `traceparent`), so the receiving service's spans join the run's trace.

The engine registers nothing here. The registrants are the evidence app's fault injection
and drill logging (taskpilots/evidence/faults.py) and the OpenTelemetry traces (taskpilots/otel,
installed only when TASKPILOTS_OTEL=1), and production settings install neither by default: in
production the lists stay empty, so a process whose environment has the fault variables set
injects nothing (tests/taskpilots/test_production_tooling.py), and the engine pays one list
check per hook point for them. An observer, wrapper or tracer that raises is logged and
skipped, never changes what the engine does: a tracer sees the result and the error of the
work, it cannot change them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from django.db import transaction

logger = logging.getLogger("taskpilots.engine")

ToolWrapper = Callable[[Any], Any]
EventObserver = Callable[[str, list[dict]], None]


class Tracer(Protocol):
    def start(self, what: str, subject: Any) -> Any: ...

    def end(self, token: Any, result: Any, error: BaseException | None) -> None: ...


# The engine's hot path checks these lists itself (`if hooks.event_observers:`): no call where
# nothing is registered.
tool_wrappers: list[ToolWrapper] = []
event_observers: list[EventObserver] = []
tracers: list[Tracer] = []
HeaderInjector = Callable[[dict[str, str]], None]
propagators: list[HeaderInjector] = []


def wrap_tools(wrapper: ToolWrapper) -> None:
    tool_wrappers.append(wrapper)


def observe_events(observer: EventObserver) -> None:
    event_observers.append(observer)


def trace(tracer: Tracer) -> None:
    tracers.append(tracer)


def propagate(injector: HeaderInjector) -> None:
    propagators.append(injector)


def clear() -> None:
    """Forget every registration (a test that registered its own)."""
    tool_wrappers.clear()
    event_observers.clear()
    tracers.clear()
    propagators.clear()


def outgoing_headers(headers: dict[str, str]) -> None:
    """Let every injector add to an outgoing request's headers (callers check
    `if hooks.propagators:` first); one that raises is logged and skipped."""
    for injector in propagators:
        try:
            injector(headers)
        except Exception:
            logger.exception("hook: header injector %r failed; the request goes without", injector)


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


def traced(what: str, subject: Any, work: Callable[[], Any]) -> Any:
    """`work()` between every tracer's `start(what, subject)` and `end`: its result returned,
    its exception raised, as without tracers. Callers check `if hooks.tracers:` first."""
    started = []
    for tracer in tracers:
        try:
            started.append((tracer, tracer.start(what, subject)))
        except Exception:
            logger.exception("hook: tracer %r failed to start %s; the work goes on", tracer, what)
    try:
        result = work()
    except BaseException as exc:
        _ended(started, None, exc)
        raise
    _ended(started, result, None)
    return result


def _ended(started: list, result: Any, error: BaseException | None) -> None:
    for tracer, token in reversed(started):
        try:
            tracer.end(token, result, error)
        except Exception:
            logger.exception("hook: tracer %r failed to end its span", tracer)

"""Fault injection for drills and crash tests, kept off the engine's path.

Installed by the evidence app, in the worker processes a drill or a test starts, when one of
these variables is set; otherwise nothing here runs.

The three crashes of a worker around a side-effect call, each for the tools it names
(comma-separated TaskPilots tool names) and at every call of them:
- `TASKPILOTS_CHAOS_CRASH_BEFORE_CALL=mcp.fs.write_file,…`: the process SIGKILLs itself as the
  engine hands it the call — after the snapshot and the `intended` ledger row committed (and the
  engine's checks before the call passed), before the request leaves the process;
- `TASKPILOTS_CHAOS_CRASH_DURING_CALL=…`: a helper thread SIGKILLs the process while the call
  waits for its answer: once `TASKPILOTS_CHAOS_CRASH_DURING_CALL_LOG` (the log of the stdio proxy
  in front of the server, taskpilots/evidence/mcp_proxy.py, which can hold the answer back)
  shows a new answer to a call with this call's idempotency key — the request reached the
  server and was carried out, the answer never reached the worker — or, without a log,
  `TASKPILOTS_CHAOS_CRASH_DURING_CALL_AFTER` seconds (0.25) into the call;
- `TASKPILOTS_CHAOS_CRASH_AFTER_CALL=mail.send,…`: after a successful call, the process dies
  before it can record the receipt — "the side effect is done, the local record failed".
With the threads pool the worker process dies; with prefork, the pool process that made the call
(its parent replaces it).

`TASKPILOTS_CHAOS_STALL_DIR=<folder>`: the zombie and partition drills (taskpilots/evidence/
stalls.py). The drill arms one stall at a time by writing `armed.json` there (which tool, which
moment of its step); the first worker process that reaches that moment takes it (an atomic
rename, so exactly one does), writes `stalled-<episode>.json` (its pid and name, the run and
step where it knows them) and then:
- zombie: stops itself with SIGSTOP — after the claim before the snapshot, right after the
  intent committed (before whatever the engine does next, its checks before the call
  included), during the call (from a helper thread while the request is in flight), or after
  the answer before the receipt. The drill SIGCONTs it once another worker took the step back;
- partition: tells its database proxy (`TASKPILOTS_CHAOS_DB_PROXY`, the control address of
  taskpilots/evidence/blackhole.py) to black-hole its connections — before the intent, once the
  intent transaction holds the run's lock, once the intent's COMMIT went out, right after the
  intent committed, or after the answer — and goes on into the hole. The drill heals or cuts it.
Every worker with the variable set also logs, per process, each call it makes
(`calls-<pid>.jsonl`), each timeline event it appends (`writes-<pid>.jsonl`, with the event's
id and hash), the end of each task (`tasks-<pid>.jsonl`) and each task that raised
(`errors-<pid>.jsonl`): what a stalled worker sent and recorded after it lost its claim, until
its task was over, can then be told apart from what the new owner did, from the sender's side
and in the database.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import signal
import socket
import threading
import time
from datetime import datetime
from pathlib import Path

from runs import hooks

logger = logging.getLogger("taskpilots.evidence")
VARIABLE = "TASKPILOTS_CHAOS_CRASH_AFTER_CALL"
CRASH_BEFORE_CALL = "TASKPILOTS_CHAOS_CRASH_BEFORE_CALL"
CRASH_DURING_CALL = "TASKPILOTS_CHAOS_CRASH_DURING_CALL"
CRASH_DURING_CALL_LOG = "TASKPILOTS_CHAOS_CRASH_DURING_CALL_LOG"
CRASH_DURING_CALL_AFTER = "TASKPILOTS_CHAOS_CRASH_DURING_CALL_AFTER"
# The crash variables by moment (the peer drill's kill matrix names them so).
CRASH_AT = {
    "before_send": CRASH_BEFORE_CALL,
    "during_call": CRASH_DURING_CALL,
    "after_answer": VARIABLE,
}
STALL_DIR = "TASKPILOTS_CHAOS_STALL_DIR"
DB_PROXY = "TASKPILOTS_CHAOS_DB_PROXY"

# Where in a side-effect step each moment is reached, seen from outside the engine: the tool's
# parameter check runs after the claim and before the snapshot; the intent's timeline event
# commits with the intent (the stall runs right after that commit, before the engine's next
# statement, so whatever the engine checks before calling comes after it); the call itself; the
# answer, before the engine records it.
POINTS = {
    ("zombie", "after_claim"): "validate",
    ("zombie", "after_intent"): "intent_committed",
    ("zombie", "during_call"): "before_call",
    ("zombie", "after_answer"): "after_call",
    ("partition", "before_intent"): "validate",
    ("partition", "in_transaction"): "validate",
    ("partition", "intent_commit"): "validate",
    ("partition", "after_intent"): "intent_committed",
    ("partition", "after_answer"): "after_call",
}
# What the proxy waits for before opening the hole: the intent transaction's lock on the run
# row went out (the worker holds the lock inside the hole), or its COMMIT went out.
HOLE_AFTER = {"in_transaction": "FOR UPDATE", "intent_commit": "COMMIT"}


def crash_after_call(names: frozenset[str]) -> None:
    """The named tools exit the process right after their call, before its receipt."""

    def wrap(tool, invoke):
        def invoke_then_die(params, ctx):
            result = invoke(params, ctx)
            logger.error("chaos: exiting after %s committed, before recording it", tool.name)
            os._exit(137)
            return result  # pragma: no cover

        return invoke_then_die

    _wrap_invoke(names, wrap)


def _wrap_invoke(names: frozenset[str], wrap) -> None:
    """Through the engine's tool hook (runs.hooks): the named tools are called through
    `wrap(tool, invoke)`."""

    def stand_in(tool):
        if tool.name not in names:
            return tool
        return dataclasses.replace(tool, invoke=wrap(tool, tool.invoke))

    hooks.wrap_tools(stand_in)


def _sigkill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def crash_before_call(names: frozenset[str]) -> None:
    """The named tools' calls kill the process before anything is sent."""

    def wrap(tool, invoke):
        def die_before(params, ctx):
            logger.error("chaos: SIGKILL before sending %s (%s)", tool.name, ctx.idempotency_key)
            _sigkill_self()
            return invoke(params, ctx)  # pragma: no cover

        return die_before

    _wrap_invoke(names, wrap)


def crash_during_call(names: frozenset[str], log: str = "", after: float = 0.25) -> None:
    """The named tools' calls kill the process while they wait for the answer (see the module
    docstring): once the proxy's `log` shows the server answered this call, else `after` s in."""
    from taskpilots.evidence import mcp_proxy

    def kill_when_answered(key: str, before: int) -> None:
        deadline = time.monotonic() + 120
        if log:
            # An answer with this key that was not there when the call began: this call's
            # (the verification reads made for the call carry its key too).
            while mcp_proxy.answers(log, key) <= before and time.monotonic() < deadline:
                time.sleep(0.01)
        else:
            time.sleep(after)
        logger.error("chaos: SIGKILL during the call (%s)", key)
        _sigkill_self()

    def wrap(tool, invoke):
        def die_during(params, ctx):
            key = ctx.idempotency_key
            before = mcp_proxy.answers(log, key) if log else 0
            threading.Thread(target=kill_when_answered, args=(key, before), daemon=True).start()
            result = invoke(params, ctx)
            # The answer came back first (nothing held it): the crash is after the answer now,
            # and still before the receipt.
            logger.error("chaos: %s answered before the crash; SIGKILL now", tool.name)
            _sigkill_self()
            return result  # pragma: no cover

        return die_during

    _wrap_invoke(names, wrap)


class Stalls:
    """The worker's side of the zombie and partition drills (see the module docstring)."""

    def __init__(self, folder: Path, proxy: str = ""):
        self.folder = folder
        self.proxy = proxy

    # -- logs ------------------------------------------------------------------------------
    def log(self, name: str, entry: dict) -> None:
        # The thread tells the stalled task from the worker's other tasks (threads pool).
        head = {"pid": os.getpid(), "thread": threading.get_ident(), "t": time.time()}
        line = json.dumps({**head, **entry}, default=str) + "\n"
        path = self.folder / f"{name}-{os.getpid()}.jsonl"
        with contextlib.suppress(OSError), open(path, "a") as log:
            log.write(line)

    # -- taking an armed stall ---------------------------------------------------------------
    def take(self, point: str, tool: str, ctx=None) -> dict | None:
        armed = self.folder / "armed.json"
        try:
            plan = json.loads(armed.read_text())
        except (OSError, ValueError):
            return None
        if plan.get("tool") != tool or POINTS.get((plan["kind"], plan["moment"])) != point:
            return None
        if point == "validate" and not _claim_committed(tool):
            # The engine builds the call's parameters before its claim committed (the hot path
            # claims the step and writes its intent in one statement): not this moment.
            return None
        try:
            os.rename(armed, self.folder / f"taken-{os.getpid()}-{time.time_ns()}.json")
        except OSError:
            return None  # another process took it first
        from runs.engine.dispatch import worker_id

        report = {
            **plan,
            "pid": os.getpid(),
            "thread": threading.get_ident(),
            "pgid": os.getpgid(0),
            "worker": worker_id(),
            "at": time.time(),
            "run": getattr(ctx, "run_id", "") or _current_run(),
            "step": getattr(ctx, "step", ""),
            "attempt": getattr(ctx, "attempt", None),
            "key": getattr(ctx, "idempotency_key", ""),
        }
        if plan["kind"] == "partition":
            report["proxy"] = self.proxy
            report["db_port"] = _database_client_port()
        return report

    def stall(self, report: dict) -> None:
        """Stop this process (zombie) or black-hole its database connections (partition),
        after telling the drill where."""
        moment = report["moment"]
        if report["kind"] == "partition":
            from taskpilots.evidence.blackhole import control

            trigger = HOLE_AFTER.get(moment)
            port = report["db_port"] or "-"
            command = f"hole-after {port} {trigger}" if trigger else "hole"
            report["proxy_answer"] = control(self.proxy, command)
            self._announce(report)
            return
        self._announce(report)
        if moment == "during_call":
            # The request must be in flight when the process stops: a helper thread stops the
            # whole process while this thread waits for the answer.
            delay = float(report.get("delay_s", 0.25))
            threading.Thread(target=_stop_self, args=(delay,), daemon=True).start()
            return
        _stop_self(0)

    def _announce(self, report: dict) -> None:
        name = self.folder / f"stalled-{report.get('episode', 0)}.json"
        partial = name.with_suffix(".tmp")
        partial.write_text(json.dumps(report, default=str))
        os.replace(partial, name)
        logger.error("chaos: %s stall at %s (%s)", report["kind"], report["moment"], report["run"])

    # -- the hooks -------------------------------------------------------------------------
    def hook(self, point: str, tool: str, ctx=None) -> None:
        try:
            report = self.take(point, tool, ctx)
            if report is not None:
                self.stall(report)
        except Exception:  # a broken hook must never change what the worker does
            logger.exception("chaos: stall hook failed")

    def wrap(self, tool):
        validate, invoke = tool.validate, tool.invoke
        stalls = self

        def checked(params):
            stalls.hook("validate", tool.name)
            return validate(params)

        def invoke_with_stalls(params, ctx):
            stalls.hook("before_call", tool.name, ctx)
            stalls.log(
                "calls",
                {
                    "worker": _worker(),
                    "tool": tool.name,
                    "run": ctx.run_id,
                    "step": ctx.step,
                    "attempt": ctx.attempt,
                    "key": ctx.idempotency_key,
                },
            )
            result = invoke(params, ctx)
            stalls.hook("after_call", tool.name, ctx)
            return result

        wrapped = dataclasses.replace(tool, invoke=invoke_with_stalls)
        wrapped.validate = checked
        return wrapped


@dataclasses.dataclass
class _Intent:
    """What the intent's event names, in the shape of a call context."""

    run_id: str
    step: str
    idempotency_key: str
    attempt: int | None = None


def _claim_committed(tool: str) -> bool:
    """Whether the step of `tool` in the run this task advances is claimed (running) already."""
    from runs.models import Step

    run = _current_run()
    return bool(run) and Step.objects.filter(run_id=run, tool=tool, status="running").exists()


def _current_run() -> str:
    """The run the executing task advances (its only argument), where no call context says."""
    from celery import current_task

    args = getattr(getattr(current_task, "request", None), "args", None) or ()
    return str(args[0]) if args else ""


_continued = 0  # SIGCONTs this process received


def _on_sigcont(signum, frame) -> None:
    global _continued
    _continued += 1


def _stop_self(delay: float) -> None:
    """Stop the whole process, and go on in this thread only once it was continued.

    A SIGSTOP sent to one's own process does not stop a multi-threaded process at once (the
    thread that takes the signal stops the others as they next enter the kernel); measured: a
    worker thread went on into the tool call. Sent to this thread, and waited for, the stall
    is where it was asked for."""
    if delay:
        time.sleep(delay)
    waits = signal.getsignal(signal.SIGCONT) is _on_sigcont
    if not waits and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGCONT, _on_sigcont)  # a forked child may have reset it
        waits = True
    before = _continued
    signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
    deadline = time.monotonic() + 600
    while waits and _continued == before and time.monotonic() < deadline:
        time.sleep(0.001)


def _worker() -> str:
    from runs.engine.dispatch import worker_id

    return worker_id()


def _database_client_port() -> int | None:
    """This process's end of its database connection (the proxy tells connections apart by it)."""
    from django.db import connection

    with contextlib.suppress(Exception):
        connection.ensure_connection()
        fd = connection.connection.pgconn.socket
        with socket.socket(fileno=os.dup(fd)) as sock:
            return sock.getsockname()[1]
    return None


def install_stalls(folder: Path, proxy: str = "") -> Stalls:
    """Wrap side-effect tools with the stall hooks, and log every timeline event this process
    commits, whichever way the engine writes it (both through the engine's hook points,
    runs.hooks)."""
    stalls = Stalls(folder, proxy)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGCONT, _on_sigcont)
    hooks.wrap_tools(lambda tool: stalls.wrap(tool) if tool.side_effect else tool)

    def committed(run_id: str, events: list[dict]) -> None:
        for event in events:
            # When the event was written (its own time), not when its commit came back: a
            # transaction that held the run's lock through a partition committed what it wrote
            # while it held its claim.
            written = datetime.fromisoformat(event["at"]).timestamp()
            entry = {"t": written, "run": run_id, "hash": event["hash"], "verb": event["verb"]}
            stalls.log("writes", entry)
        for event in events:
            data = event.get("data") or {}
            if event["verb"] == "side_effect.intended":
                intent = _Intent(run_id, str(data.get("step", "")), str(data.get("key")))
                stalls.hook("intent_committed", str(data.get("tool", "")), intent)

    hooks.observe_events(committed)

    from celery.signals import task_failure, task_postrun

    def task_over(task_id=None, state=None, args=None, **kwargs):
        stalls.log("tasks", {"task": task_id, "state": state, "run": str(args[0]) if args else ""})

    def task_failed(task_id=None, exception=None, args=None, **kwargs):
        error = f"{type(exception).__name__}: {exception}"[:300]
        stalls.log("errors", {"task": task_id, "run": str(args[0]) if args else "", "error": error})

    task_postrun.connect(task_over, weak=False)
    task_failure.connect(task_failed, weak=False)
    return stalls


def _names(variable: str) -> frozenset[str]:
    return frozenset(n.strip() for n in os.environ.get(variable, "").split(",") if n.strip())


def install_from_environment() -> None:
    names = _names(VARIABLE)
    if names:
        crash_after_call(names)
    names = _names(CRASH_BEFORE_CALL)
    if names:
        crash_before_call(names)
    names = _names(CRASH_DURING_CALL)
    if names:
        crash_during_call(
            names,
            os.environ.get(CRASH_DURING_CALL_LOG, ""),
            float(os.environ.get(CRASH_DURING_CALL_AFTER) or 0.25),
        )
    folder = os.environ.get(STALL_DIR, "")
    if folder:
        install_stalls(Path(folder), os.environ.get(DB_PROXY, ""))

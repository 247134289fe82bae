"""4. Recovery latency (`manage.py bench recovery [--busy]`, docs/benchmarks.md section 4).

With this install's lease and heartbeat (the defaults: lease 60 s, a beat every 1 s, a worker
dead after 4 s without one), on real Celery worker processes:

- kill → resume: SIGKILL the worker holding a step mid-call; time until another worker that was
  already running takes the step back (its heartbeat finds the dead one);
- restart → resume: the same, with the killed worker started again at once under its name (it
  takes back its previous incarnation's leases as it starts); where that time goes is read from
  the restarted worker's ready line (taskpilots.celery.STARTED): process start, Celery, Django,
  the task modules, the heartbeat's take-back, consuming;
- approval → next step and event → run finished.

`busy` measures the same while bench.five runs, through workers of their own, keep every CPU of
the machine busy for the whole measurement (the engine benchmark beside it); the CPU use and the
load average during the measurement are reported either way, since the machine may be shared.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings
from django.utils import timezone

from runs import engine
from runs.models import Run, Step, TimelineEvent
from runs.verbs import Verb
from taskpilots.celery import start_times
from taskpilots.evidence.bench import (
    BENCH_MODULES,
    Say,
    _sandbox,
    _worker_pool,
    broker_name,
    percentile,
)
from taskpilots.evidence.workers import ROOT, Workers

# The points of a restarted worker's start, in order (taskpilots.celery.STARTED), then the step
# taken back.
PHASES = ("process", "app", "django", "tasks", "heartbeat", "ready")
PHASE_LABELS = {
    "process": "process started",
    "app": "interpreter and Celery loaded",
    "django": "Django set up (settings, apps)",
    "tasks": "task modules imported",
    "heartbeat": "registered; previous leases taken back",
    "ready": "consuming",
}
MEASURES = ("kill_to_resume", "restart_to_resume", "approval_to_next_step", "event_to_next_step")


def bench_recovery(
    samples: int = 20, say: Say = print, *, busy: bool = False, kills: int | None = None
) -> dict:
    """With the default lease and heartbeat: time from a worker SIGKILL to its step taken back
    by another worker (the heartbeat notices, not the lease), from a SIGKILL to the step taken
    back with the same worker restarted (its previous incarnation's leases at once), and from
    an approval decision or an event delivery to the next step; `kills` runs each way
    (default max(3, samples // 4)). `busy`: with every CPU kept busy meanwhile."""
    person = _bench_operator()
    tag = uuid.uuid4().hex[:6]
    conf = settings.TASKPILOTS
    env = {
        "TASKPILOTS_TOOL_TIMEOUT_SECONDS": "5",
        # This install's lease and heartbeat (the defaults unless configured), not the tests'.
        "TASKPILOTS_LEASE_SECONDS": str(conf["LEASE_SECONDS"]),
        "TASKPILOTS_HEARTBEAT_SECONDS": str(conf["HEARTBEAT_SECONDS"]),
        "TASKPILOTS_WORKER_DEAD_SECONDS": str(conf["WORKER_DEAD_SECONDS"]),
    }
    kills = kills or max(3, samples // 4)
    with (
        _sandbox() as sandbox,
        _worker_pool("celery", env) as pool,
        _background_load(busy, say) as load,
        _machine_use() as use,
    ):
        for _ in range(2):
            pool.start()
        say(f"approval → next step, {samples} runs")
        approve, event = _approval_and_event_latencies(samples, tag, person)
        say(
            f"worker SIGKILL mid-call → step taken back, {kills} runs each way (lease "
            f"{conf['LEASE_SECONDS']} s, heartbeat every {conf['HEARTBEAT_SECONDS']} s, dead "
            f"after {conf['WORKER_DEAD_SECONDS']} s)"
        )
        kill = _kill_latencies(kills, f"{tag}-k", pool, sandbox, say)
        restart = _kill_latencies(kills, f"{tag}-r", pool, sandbox, say, restart=True)
        load_runs = load()
    measured = {
        "kill_to_resume": [s["ms"] for s in kill],
        "restart_to_resume": [s["ms"] for s in restart],
        "approval_to_next_step": approve,
        "event_to_next_step": event,
    }
    raw = [{"measure": "kill_to_resume", **s} for s in kill]
    raw += [{"measure": "restart_to_resume", **s} for s in restart]
    raw += [{"measure": "approval_to_next_step", "ms": round(v, 1)} for v in approve]
    raw += [{"measure": "event_to_next_step", "ms": round(v, 1)} for v in event]
    return {
        "benchmark": "recovery",
        "machine": "busy" if busy else "idle",
        "lease_seconds": conf["LEASE_SECONDS"],
        "heartbeat_seconds": conf["HEARTBEAT_SECONDS"],
        "worker_dead_seconds": conf["WORKER_DEAD_SECONDS"],
        "broker": broker_name(),
        **{name: _latency_summary(values) for name, values in measured.items()},
        # Where a restarted worker's recovery goes: the median time from the SIGKILL to each
        # point of its start, and to the step taken back (ms).
        "restart_phases_ms": _phase_medians(restart),
        "load": {**use(), "background_runs": load_runs},
        "samples": raw,
    }


# -- the measurements ---------------------------------------------------------------------------


def _bench_operator():
    """The person who approves (human actions check the acting user's role like the console)."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group

    person, _ = get_user_model().objects.get_or_create(username="bench-operator")
    person.groups.add(Group.objects.get_or_create(name="support")[0])
    return person


def _approval_and_event_latencies(samples: int, tag: str, person) -> tuple[list, list]:
    """Per refund run: from the approval to the refund step starting, and from the settlement
    event's delivery to the run's success (ms)."""
    from approvals import actions

    approve, event = [], []
    for n in range(samples):
        run, _ = engine.start_run(
            "refund.approval",
            {"payment_id": f"p{n}", "amount": 300},
            business_key=f"rb-a-{tag}-{n}",
        )
        approval = _wait_until(lambda r=run: r.approvals.filter(status="pending").first())
        decided = timezone.now()
        actions.decide_approval(approval.pk, person, "approved")
        started = _wait_until(
            lambda r=run, d=decided: _first_at(r.pk, Verb.STEP_STARTED, d, "issue_refund")
        )
        approve.append((started - decided).total_seconds() * 1000)
        wait_row = _wait_until(lambda r=run: r.waits.filter(kind="event", status="pending").first())
        delivered = timezone.now()
        engine.deliver_event(
            f"rb-{tag}-{n}", wait_row.event_type, wait_row.correlation_key, {}, source="bench"
        )
        done = _wait_until(lambda r=run, d=delivered: _first_at(r.pk, Verb.RUN_SUCCEEDED, d))
        event.append((done - delivered).total_seconds() * 1000)
    return approve, event


def _kill_latencies(
    runs: int, tag: str, pool: Workers, sandbox, say: Say, restart: bool = False
) -> list[dict]:
    """Per run, mid-call: SIGKILL the worker holding the step, and time until a worker takes the
    step back (ms) — one that was already running (its heartbeat notices the dead one), or with
    `restart` the killed one started again under its name (it takes back its previous
    incarnation's leases as it starts; the one already running may be the one that claims the
    step then). The sweeper runs at its default interval, as Celery beat would."""
    dead_after = settings.TASKPILOTS["WORKER_DEAD_SECONDS"]
    sweep_every = settings.CELERY_BEAT_SCHEDULE["sweep"]["schedule"]
    taken = []
    for n in range(runs):
        while len(pool.alive) < 2:
            pool.start()
        # Every worker beating long enough to judge the others (and to be judged).
        youngest = max(_ready_at(w) for w in pool.alive)
        time.sleep(max(0.0, youngest + dead_after + 1 - time.time()))
        sandbox.inject("mail", "latency", action="send", latency_ms=1500)
        run, _ = engine.start_run(
            "support.reply",
            {"message": "refund", "email": f"k{tag}{n}@example.com", "ticket_id": f"T-{n}"},
            business_key=f"rb-{tag}-{n}",
        )
        _wait_until(lambda r=run: r.side_effects.filter(status="intended").exists())
        victim = _holder(run, pool)
        killed = timezone.now()
        victim.kill()
        sample: dict = {}
        if restart:
            spawned = time.time()
            worker = pool.start(name=victim.name)
            start = next((start_times(line) for line in worker.output if start_times(line)), {})
            base = killed.timestamp()
            sample["phases_ms"] = {"spawn": round((spawned - base) * 1000, 1)} | {
                phase: round((start[phase] - base) * 1000, 1) for phase in PHASES if phase in start
            }
        resumed = _sweeping_until(
            lambda r=run, k=killed: _first_at(r.pk, Verb.STEP_LEASE_RECLAIMED, k), sweep_every
        )
        sample["ms"] = round((resumed - killed).total_seconds() * 1000, 1)
        if restart:
            sample["phases_ms"]["resumed"] = sample["ms"]
        taken.append(sample)
        say(f"  {n + 1}/{runs}: taken back after {sample['ms'] / 1000:.2f} s")
        # The new owner may find the call's outcome not yet known and ask again later: beat
        # goes on sweeping meanwhile, as in production.
        _sweeping_until(lambda r=run: Run.objects.get(pk=r.pk).status == "succeeded", sweep_every)
    return taken


def _ready_at(worker) -> float:
    """When a worker started consuming (wall clock), from its ready line; now if unknown."""
    for line in worker.output:
        times = start_times(line)
        if times.get("ready"):
            return times["ready"]
    return time.time()


def _phase_medians(samples: list[dict]) -> dict:
    phases = [s["phases_ms"] for s in samples if s.get("phases_ms")]
    names = ("spawn", *PHASES, "resumed")
    return {
        name: round(statistics.median(p[name] for p in phases if name in p), 1)
        for name in names
        if any(name in p for p in phases)
    }


def _sweeping_until(predicate, sweep_every: float, timeout: float = 120):
    """Wait for predicate's value while sweeping every `sweep_every` seconds, as Celery beat
    does beside the workers."""
    deadline, swept = time.monotonic() + timeout, time.monotonic()
    while time.monotonic() < deadline:
        if time.monotonic() - swept >= sweep_every:
            engine.sweep()
            swept = time.monotonic()
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise RuntimeError("benchmark timed out")


def _holder(run, pool: Workers):
    """The worker process whose incarnation holds the run's running step."""
    from runs.models import Worker

    owner = Step.objects.get(run=run, status="running").lease_owner
    node = Worker.objects.get(pk=owner).node
    return next(w for w in pool.alive if node.startswith(f"{w.name}@"))


def _first_at(run_id, verb, after=None, step=None):
    """When the run's first `verb` event (after `after`, about `step`) happened, or None."""
    events = TimelineEvent.objects.filter(run_id=run_id, verb=verb).order_by("seq")
    for event in events:
        if (after is None or event.at > after) and (step is None or event.data.get("step") == step):
            return event.at
    return None


def _wait_until(predicate, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise RuntimeError("benchmark timed out")


def _latency_summary(values: list[float]) -> dict:
    return {
        "p50_ms": round(percentile(values, 50), 1),
        "p95_ms": round(percentile(values, 95), 1),
        "min_ms": round(min(values), 1),
        "max_ms": round(max(values), 1),
        "n": len(values),
    }


# -- the machine: busy beside the measurement, and how busy it was ------------------------------


@contextmanager
def _background_load(busy: bool, say: Say):
    """With `busy`: bench.five runs through Celery workers of their own (one per CPU, on a queue
    of their own), fed by a process that keeps a bounded number of them waiting, for as long as
    the measurement lasts. Yields a function giving how many of them finished."""
    if not busy:
        yield lambda: 0
        return
    from taskpilots.workerconf import CONCURRENCY, worker_config

    config = worker_config(None, min(CONCURRENCY, settings.DB_POOL_SIZE or 8))
    env = {"TASKPILOTS_WORKFLOW_MODULES": BENCH_MODULES, "TASKPILOTS_INLINE_BUDGET_SECONDS": "30"}
    load = Workers(extra_env={**env, **config.env})
    prefix = f"bench-load-{uuid.uuid4().hex[:6]}-"
    feeder = None
    try:
        cpus = os.cpu_count() or 1
        say(f"background load: bench.five through {cpus} more workers, all CPUs busy")
        for _ in range(cpus):
            load.start(options=config.options())
        feeder = subprocess.Popen(
            [sys.executable, "-c", _FEEDER, prefix, str(20 * cpus)],
            cwd=ROOT,
            env={**load.env(), "DJANGO_SETTINGS_MODULE": "taskpilots.settings"},
            start_new_session=True,
        )
        runs = Run.objects.filter(business_key__startswith=prefix)
        _wait_until(lambda: runs.filter(status="succeeded").exists(), timeout=120)
        yield lambda: runs.filter(status="succeeded").count()
    finally:
        if feeder is not None and feeder.poll() is None:
            os.killpg(feeder.pid, 9)
            feeder.wait(10)
        load.close()
        load.delete_queue()


# The feeder process: keeps `waiting` runs of bench.five waiting for the load's workers (their
# queue is its TASKPILOTS_QUEUE), few enough that each finishes within a second or two, so the
# benchmark's sweeps never find one stale and hint it to the measured workers.
_FEEDER = """
import sys, time
import django
django.setup()
from runs import engine
from runs.models import Run
prefix, waiting = sys.argv[1], int(sys.argv[2])
runs, n = Run.objects.filter(business_key__startswith=prefix), 0
while True:
    for _ in range(waiting - runs.filter(status__in=Run.RUNNABLE).count()):
        engine.start_run("bench.five", {"n": n}, business_key=f"{prefix}{n}")
        n += 1
    time.sleep(0.05)
"""


@contextmanager
def _machine_use():
    """Yields a function giving the machine's CPU use (all processes, /proc/stat) and its 1-minute
    load average (sampled every 2 s) since the block began: how busy the machine really was."""
    stop, loads = threading.Event(), []

    def sample():
        while not stop.wait(2):
            loads.append(os.getloadavg()[0])

    first = _cpu_times()
    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    result: dict = {}

    def use() -> dict:
        if not result:
            last = _cpu_times()
            busy = None
            if first and last and last[1] > first[1]:
                busy = round(100 * (1 - (last[0] - first[0]) / (last[1] - first[1])), 1)
            result.update(
                cpus=os.cpu_count(),
                cpu_busy_pct=busy,
                load1_mean=round(statistics.mean(loads), 2) if loads else None,
                load1_max=round(max(loads), 2) if loads else None,
            )
        return result

    try:
        yield use
    finally:
        stop.set()
        thread.join(5)


def _cpu_times() -> tuple[int, int] | None:
    """Idle (with iowait) and total jiffies of all CPUs so far, or None off Linux."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    return fields[3] + fields[4], sum(fields[:8])


# -- docs/benchmarks.md's block (taskpilots/evidence/report.py) -------------------------------


def render_recovery(records: list[dict]) -> str:
    """The recovery block: for the last recorded run of each kind (idle, busy; earlier ones stay
    in the file), its figures with their spread, where a restarted worker's recovery went, and
    the machine it ran on and how busy it was."""
    last, environment = {}, None
    for record in records:
        if record.get("kind") == "environment":
            environment = record
        elif record.get("kind") == "result":
            last[record.get("machine", "idle")] = (environment or {}, record)
    rows = [last[kind] for kind in ("idle", "busy") if kind in last]
    if not rows:
        return "(no recorded run)\n"
    labels = {
        "kill_to_resume": "worker SIGKILL mid-call → step taken back by a running worker",
        "restart_to_resume": "worker SIGKILL, restarted at once → step taken back",
        "approval_to_next_step": "approval decision → next step starting",
        "event_to_next_step": "event delivery → run finished",
    }
    out = [
        "| machine | from → to | p50 | p95 | min | max | n |",
        "|---|---|---|---|---|---|---|",
    ]
    for _, result in rows:
        for measure in MEASURES:
            figure = result.get(measure)
            if not figure:
                continue
            cells = [_ms(figure.get(k)) for k in ("p50_ms", "p95_ms", "min_ms", "max_ms")]
            if measure in ("kill_to_resume", "restart_to_resume"):
                cells[0] = f"**{cells[0]}**"
            machine = result.get("machine", "idle")
            n = figure.get("n", "")
            out.append(f"| {machine} | {labels[measure]} | " + " | ".join(cells) + f" | {n} |")
    out.append("")
    for _, result in rows:
        phases = result.get("restart_phases_ms") or {}
        if phases:
            steps = [f"{PHASE_LABELS[p]} {_ms(phases[p])}" for p in PHASES if p in phases]
            steps.append(f"step taken back {_ms(phases.get('resumed'))}")
            out.append(
                f"Restarted worker, {result.get('machine', 'idle')} machine (medians, from the "
                "SIGKILL): " + " → ".join(steps) + "."
            )
            out.append("")
    for environment, result in rows:
        load = result.get("load") or {}
        at_start = environment.get("load_avg")
        out.append(
            f"- {result.get('machine', 'idle')}: recorded {environment.get('at', '?')}, commit "
            f"{(environment.get('commit') or '?')[:10]}"
            f"{' (uncommitted changes)' if environment.get('dirty') else ''}, "
            f"{environment.get('cpus', '?')} CPUs ({environment.get('cpu_model') or '?'}), "
            f"{result.get('broker', '?')}; lease {result.get('lease_seconds')} s, heartbeat "
            f"{result.get('heartbeat_seconds')} s, dead after {result.get('worker_dead_seconds')} "
            f"s. Load average as it started {_loads(at_start)}; during the measurement CPUs "
            f"{_pct(load.get('cpu_busy_pct'))} busy, 1-minute load {load.get('load1_mean')} mean, "
            f"{load.get('load1_max')} max"
            + (
                f"; {load['background_runs']} bench.five runs beside it"
                if load.get("background_runs")
                else ""
            )
            + "."
        )
    return "\n".join(out) + "\n"


def _ms(value) -> str:
    if value is None:
        return "–"
    return f"{value / 1000:.2f} s" if value >= 1000 else f"{value:.0f} ms"


def _pct(value) -> str:
    return "?" if value is None else f"{value:.0f}%"


def _loads(values) -> str:
    return "?" if not values else " / ".join(f"{v:.2f}" for v in values)

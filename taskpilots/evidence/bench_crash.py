"""`manage.py bench crash`: a worker SIGKILLed during a side-effect call, many times, at random
points, on TaskPilots and on DBOS Transact in the same run, against the same target.

    python manage.py bench crash [--kills 20] [--latency-ms 500] [--seed S] [--record FILE]

1. The target (taskpilots/evidence/crash_target.py) runs in a thread of this process. Each call
   arrives, lands L/2 ms later (unless its caller has gone: then it is dropped, nothing
   happened) and is answered L/2 ms after that. It counts effects per key where they land, on
   two paths: `dedupe` (a repeated key is answered with the first answer, no new effect; it can
   be asked by key whether a call landed) and `plain` (every call is an effect; nobody can ask).
2. The kill schedule: for each of `kills` runs, a moment drawn with `seed` — before the call
   landed (between its arrival and its landing), during it (landed, not yet answered), or
   after it (answered, before the caller recorded the answer) — and a point inside it. The same
   schedule is played on both systems against both paths.
3. TaskPilots: one real Celery worker (taskpilots/evidence/crash_flows.py: `crash.dedupe`, whose
   tool declares the key dedupe and the lookup; `crash.plain`, whose tool declares neither), this
   install's lease and heartbeat. At the scheduled moment the worker is SIGKILLed and a fresh
   one started at once under its name (it takes back its previous incarnation's leases as it
   starts); the sweeper runs at its interval as beat would, until the run has finished or waits
   for a person.
4. DBOS: one process of taskpilots/evidence/crash_peer.py (a workflow whose step calls the target
   with a key from the workflow id). At the scheduled moment it is SIGKILLed and a fresh one
   started at once, which recovers the pending workflow on launch (DBOS's defaults), until the
   workflow is recorded finished in DBOS's system database.
5. Counted per system × path, on the target's side: runs lost (neither finished nor waiting for
   a person), effects duplicated (a key that landed twice), repeated calls the target absorbed
   (dedupe), effects left unknown and handed to a person (and whether they had landed), and the
   time from the kill to the work resumed and to the run done, the fresh worker's start
   included.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
import uuid
from datetime import UTC, datetime

from django.conf import settings

from runs import engine
from runs.models import Run, SideEffect
from runs.verbs import Verb
from taskpilots.evidence import scratch
from taskpilots.evidence.bench import Say, _worker_pool, broker_name, percentile
from taskpilots.evidence.bench_recovery import _first_at
from taskpilots.evidence.crash_target import KINDS, CrashTarget
from taskpilots.evidence.workers import ROOT, database_url

CRASH_MODULES = "taskpilots.evidence.crash_flows"
PHASES = ("before", "during", "after")
HITS = (*PHASES, "recorded", "not arrived")
SYSTEMS = ("taskpilots", "dbos")
DEFAULT_SEED = 20261207
SETTLED = ("succeeded", "failed", "cancelled", "compensated")
PARKED = ("needs_human", "taken_over")  # waits for a person: not lost
SETTLE_TIMEOUT_S = 90


def schedule(kills: int, seed: int) -> list[dict]:
    """The kill schedule: for each run, the moment of its call to kill at and a point in it."""
    rng = random.Random(seed)
    return [
        {"n": n, "phase": rng.choice(PHASES), "fraction": round(rng.uniform(0.1, 0.9), 3)}
        for n in range(kills)
    ]


def bench_crash(
    kills: int = 20, say: Say = print, seed: int = DEFAULT_SEED, latency_ms: int = 500
) -> dict:
    from taskpilots.evidence import crash_flows  # noqa: F401  (registers crash.* here too)

    plan = schedule(kills, seed)
    tag = uuid.uuid4().hex[:6]
    say(
        f"crash: {kills} kills per system and target (seed {seed}; "
        + ", ".join(f"{p} {sum(1 for i in plan if i['phase'] == p)}" for p in PHASES)
        + f"), calls of {latency_ms} ms"
    )
    with CrashTarget(latency_ms) as target:
        samples = _taskpilots(plan, target, latency_ms, tag, say)
        samples += _dbos(plan, target, latency_ms, tag, say)
        landed = target.stats()
    conf = settings.TASKPILOTS
    result = {
        "benchmark": "crash",
        "kills": kills,
        "seed": seed,
        "latency_ms": latency_ms,
        "schedule": {p: sum(1 for i in plan if i["phase"] == p) for p in PHASES},
        "broker": broker_name(),
        "lease_seconds": conf["LEASE_SECONDS"],
        "heartbeat_seconds": conf["HEARTBEAT_SECONDS"],
        "worker_dead_seconds": conf["WORKER_DEAD_SECONDS"],
    }
    for system in SYSTEMS:
        result[system] = {
            kind: _summary(
                [s for s in samples if s["system"] == system and s["target"] == kind],
                landed[kind].get(system, {}),
            )
            for kind in KINDS
        }
    result["samples"] = samples
    return result


# --------------------------------------------------------------------------------------------
# Aiming a kill


def _aim(target: CrashTarget, key: str, item: dict, latency_ms: int) -> float | None:
    """Wait for the scheduled moment of `key`'s call; the time to kill at (None: the call
    never reached that moment)."""
    half = latency_ms / 2000
    phase = item["phase"]
    if phase == "before":
        event, delay = target.wait_for(key, "arrived"), item["fraction"] * half * 0.9
    elif phase == "during":
        event, delay = target.wait_for(key, "landed"), item["fraction"] * half * 0.9
    else:  # at once after the answer left: the caller is reading it, or recording it
        event, delay = target.wait_for(key, "answered"), 0.0
    if event is None:
        return None
    at = event.at + delay
    time.sleep(max(0.0, at - time.time()))
    return at


def _hit(target: CrashTarget, key: str, killed_at: float) -> str:
    """Where the call was when the kill landed, by the target's own record."""
    phases = {event.phase for event in target.key_events(key) if event.at <= killed_at}
    if "answered" in phases:
        return "after"
    if "landed" in phases:
        return "during"
    if "arrived" in phases:
        return "before"
    return "not arrived"


def _target_counts(target: CrashTarget, kind: str, system: str, key: str) -> dict:
    with target.lock:
        tally = target.tally(kind, system)
        return {"effects": tally.effects[key], "absorbed": tally.absorbed[key]}


def _calls_after(target: CrashTarget, key: str, after: float) -> list[float]:
    return [e.at for e in target.key_events(key) if e.phase == "arrived" and e.at > after]


# --------------------------------------------------------------------------------------------
# TaskPilots: a real Celery worker, killed and started afresh under its name.


def _taskpilots(
    plan: list[dict], target: CrashTarget, latency_ms: int, tag: str, say: Say
) -> list[dict]:
    conf = settings.TASKPILOTS
    env = {
        "TASKPILOTS_WORKFLOW_MODULES": CRASH_MODULES,
        "TASKPILOTS_CRASH_URL": target.url,
        "TASKPILOTS_CRASH_LATENCY_MS": str(latency_ms),
        # This install's settings (the defaults unless configured), not the tests' own.
        "TASKPILOTS_LEASE_SECONDS": str(conf["LEASE_SECONDS"]),
        "TASKPILOTS_HEARTBEAT_SECONDS": str(conf["HEARTBEAT_SECONDS"]),
        "TASKPILOTS_WORKER_DEAD_SECONDS": str(conf["WORKER_DEAD_SECONDS"]),
        "TASKPILOTS_TOOL_TIMEOUT_SECONDS": str(conf["TOOL_TIMEOUT_SECONDS"]),
        # One run at a time: a few pooled connections are all it uses (and all a shared
        # server may have left).
        "TASKPILOTS_DB_POOL_SIZE": "3",
    }
    sweep_every = settings.CELERY_BEAT_SCHEDULE["sweep"]["schedule"]
    samples = []
    with _worker_pool("celery", env) as pool:
        say(
            f"TaskPilots: one Celery worker ({broker_name()}; lease {conf['LEASE_SECONDS']} s, "
            f"heartbeat {conf['HEARTBEAT_SECONDS']} s, sweeper every {sweep_every} s)"
        )
        worker = pool.start(name=f"crash-{tag}")
        for kind in KINDS:
            for item in plan:
                if not worker.alive:
                    worker = pool.start(name=worker.name)
                sample = _taskpilots_kill(kind, item, pool, worker, target, latency_ms, tag)
                worker = pool.alive[0] if pool.alive else worker
                samples.append(sample)
                say(_line(sample, len(plan)))
    return samples


def _taskpilots_kill(kind, item, pool, worker, target, latency_ms, tag) -> dict:
    run, _ = engine.start_run(
        f"crash.{kind}", {"n": item["n"]}, business_key=f"crash-{tag}-{kind}-{item['n']}"
    )
    key = f"tp-{run.pk}-call"
    at = _aim(target, key, item, latency_ms)
    killed_at = time.time()
    worker.kill()
    pool.start(name=worker.name)  # a fresh worker, at once, under the killed one's name
    ready_at = time.time()
    killed = datetime.fromtimestamp(killed_at, UTC)
    status = _settle_taskpilots(run.pk)
    run.refresh_from_db()
    effect = SideEffect.objects.filter(run_id=run.pk).order_by("-pk").first()
    resumed = _first_at(run.pk, Verb.STEP_LEASE_RECLAIMED, killed)
    parked = _first_at(run.pk, Verb.RUN_NEEDS_HUMAN, killed)
    done = run.finished_at if status in SETTLED else parked
    hit = _hit(target, key, killed_at)
    if status == "succeeded" and done is not None and done <= killed:
        hit, resumed, done = "recorded", None, None  # the kill came after the run's end
    return {
        "system": "taskpilots",
        "target": kind,
        **item,
        "aimed_late_ms": None if at is None else round((killed_at - at) * 1000, 1),
        "hit": hit,
        "outcome": status if status in (*SETTLED, *PARKED) else "lost",
        "status": status,
        "side_effect": effect.status if effect else None,
        "confirmed_by": effect.confirmed_by if effect else None,
        **_target_counts(target, kind, "taskpilots", key),
        "calls_after_kill": len(_calls_after(target, key, killed_at)),
        "fresh_start_ms": round((ready_at - killed_at) * 1000, 1),
        "kill_to_resume_ms": _ms(killed, resumed),
        "kill_to_done_ms": _ms(killed, done),
    }


def _settle_taskpilots(run_id) -> str:
    """Sweep as beat would until the run finished or waits for a person; its status then."""
    sweep_every = settings.CELERY_BEAT_SCHEDULE["sweep"]["schedule"]
    deadline, swept = time.monotonic() + SETTLE_TIMEOUT_S, time.monotonic()
    while True:
        status = Run.objects.filter(pk=run_id).values_list("status", flat=True).get()
        if status in (*SETTLED, *PARKED) or time.monotonic() > deadline:
            return status
        if time.monotonic() - swept >= sweep_every:
            engine.sweep()
            swept = time.monotonic()
        time.sleep(0.02)


def _ms(start: datetime, end: datetime | None) -> float | None:
    return None if end is None else round((end - start).total_seconds() * 1000, 1)


# --------------------------------------------------------------------------------------------
# DBOS Transact: one process, killed and started afresh (it recovers on launch).


class _Peer:
    """A process of taskpilots/evidence/crash_peer.py; `started_at` to `ready_at` is its start,
    DBOS's launch (and the recovery it starts) included."""

    def __init__(self, url: str, target_url: str, timeout: float):
        self.started_at = time.time()
        self.process = subprocess.Popen(
            [
                *[sys.executable, "-m", "taskpilots.evidence.crash_peer"],
                *["--url", url, "--target", target_url, "--timeout", str(timeout)],
            ],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.lines: list[dict] = []
        self.errors: list[str] = []
        self._news = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_errors, daemon=True).start()
        launched = self.wait_for("launched", timeout=120)
        if launched is None:
            self.kill()
            raise RuntimeError("the DBOS peer did not start: " + "".join(self.errors)[-800:])
        self.ready_at = time.time()

    def _read(self) -> None:
        for line in self.process.stdout:
            if line.startswith("{"):
                with self._news:
                    self.lines.append(json.loads(line))
                    self._news.notify_all()
        with self._news:
            self._news.notify_all()

    def _read_errors(self) -> None:
        for line in self.process.stderr:
            if len(self.errors) < 2000:
                self.errors.append(line)

    def wait_for(self, event: str, timeout: float) -> dict | None:
        deadline = time.monotonic() + timeout
        with self._news:
            while True:
                for line in self.lines:
                    if line.get("event") == event:
                        return line
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self.process.poll() is not None:
                    return None
                self._news.wait(min(remaining, 0.5))

    def start_workflow(self, kind: str, n: int, workflow_id: str) -> None:
        self.process.stdin.write(f"start {kind} {n} {workflow_id}\n")
        self.process.stdin.flush()

    def kill(self) -> None:
        import os
        import signal

        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()


def _dbos(plan: list[dict], target: CrashTarget, latency_ms: int, tag: str, say: Say) -> list:
    import psycopg

    name = scratch.scratch_name("crash_dbos")
    scratch.create_database(name)
    url = database_url(name)
    timeout = settings.TASKPILOTS["TOOL_TIMEOUT_SECONDS"]
    samples = []
    say("DBOS: one process of taskpilots/evidence/crash_peer.py (DBOS's default settings)")
    peer = _Peer(url, target.url, timeout)
    try:
        with psycopg.connect(url, autocommit=True) as system_db:
            for kind in KINDS:
                for item in plan:
                    sample, peer = _dbos_kill(kind, item, peer, system_db, url, target, tag)
                    sample["aimed_late_ms"] = sample.pop("_late")
                    samples.append(sample)
                    say(_line(sample, len(plan)))
    finally:
        peer.close()
        scratch.drop_database(name)
    return samples


def _dbos_kill(kind, item, peer: _Peer, system_db, url, target: CrashTarget, tag):
    workflow_id = f"crash-{tag}-{kind}-{item['n']}"
    key = f"{workflow_id}-call"
    peer.start_workflow(kind, item["n"], workflow_id)
    at = _aim(target, key, item, int(target.latency * 1000))
    killed_at = time.time()
    peer.kill()
    peer = _Peer(url, target.url, settings.TASKPILOTS["TOOL_TIMEOUT_SECONDS"])
    status, updated_ms = _settle_dbos(system_db, workflow_id)
    done_at = updated_ms / 1000 if status == "SUCCESS" and updated_ms else None
    again = _calls_after(target, key, killed_at)
    hit = _hit(target, key, killed_at)
    if done_at is not None and done_at <= killed_at and not again:
        hit, done_at = "recorded", None  # the kill came after the workflow's end
    resumed_at = again[0] if again else done_at
    sample = {
        "system": "dbos",
        "target": kind,
        **item,
        "_late": None if at is None else round((killed_at - at) * 1000, 1),
        "hit": hit,
        "outcome": "succeeded" if status == "SUCCESS" else ("failed" if status else "lost"),
        "status": status,
        **_target_counts(target, kind, "dbos", key),
        "calls_after_kill": len(again),
        "fresh_start_ms": round((peer.ready_at - killed_at) * 1000, 1),
        "kill_to_resume_ms": None
        if resumed_at is None
        else round((resumed_at - killed_at) * 1000, 1),
        "kill_to_done_ms": None if done_at is None else round((done_at - killed_at) * 1000, 1),
    }
    if status not in ("SUCCESS", "ERROR"):
        sample["outcome"] = "lost"
    return sample, peer


def _settle_dbos(system_db, workflow_id: str) -> tuple[str | None, int | None]:
    """Poll DBOS's system database until the workflow is recorded finished; its status and
    `updated_at` (epoch ms), or what it was when the benchmark gave up."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    row = None
    while time.monotonic() < deadline:
        row = system_db.execute(
            "SELECT status, updated_at FROM dbos.workflow_status WHERE workflow_uuid = %s",
            [workflow_id],
        ).fetchone()
        if row and row[0] in ("SUCCESS", "ERROR", "CANCELLED", "MAX_RECOVERY_ATTEMPTS_EXCEEDED"):
            return row[0], row[1]
        time.sleep(0.02)
    return (row[0], row[1]) if row else (None, None)


# --------------------------------------------------------------------------------------------
# Counting


def _line(sample: dict, kills: int) -> str:
    resume = sample["kill_to_resume_ms"]
    return (
        f"  {sample['system']} {sample['target']} {sample['n'] + 1}/{kills}: aimed "
        f"{sample['phase']}, hit {sample['hit']} → {sample['outcome']}, {sample['effects']} "
        f"effect(s), {sample['absorbed']} absorbed, resumed "
        f"{'—' if resume is None else f'{resume / 1000:.2f} s'} after the kill"
    )


def _summary(samples: list[dict], landed: dict) -> dict:
    def stat(name: str) -> dict:
        values = [s[name] for s in samples if s.get(name) is not None]
        return {
            "p50_ms": _round(percentile(values, 50)),
            "p95_ms": _round(percentile(values, 95)),
            "n": len(values),
        }

    unknown = [s for s in samples if s["outcome"] in PARKED and s.get("side_effect") == "unknown"]
    return {
        "kills": len(samples),
        # Where the kills landed, by the target's record ("recorded": after the run's end).
        "hit": {p: sum(1 for s in samples if s["hit"] == p) for p in HITS},
        "succeeded": sum(1 for s in samples if s["outcome"] == "succeeded"),
        "with_a_person": sum(1 for s in samples if s["outcome"] in PARKED),
        "failed": sum(1 for s in samples if s["outcome"] in ("failed", "cancelled")),
        "lost": sum(1 for s in samples if s["outcome"] == "lost"),
        # Where the effects land: a key that landed twice is an effect duplicated.
        "duplicated": sum(1 for s in samples if s["effects"] > 1),
        "repeated_calls_absorbed": sum(s["absorbed"] for s in samples),
        "succeeded_without_effect": sum(
            1 for s in samples if s["outcome"] == "succeeded" and s["effects"] == 0
        ),
        # Handed to a person with the outcome unknown, and what the target shows of them.
        "unknown_to_person": len(unknown),
        "unknown_landed": sum(1 for s in unknown if s["effects"] > 0),
        "unknown_not_landed": sum(1 for s in unknown if s["effects"] == 0),
        "target": {
            k: landed.get(k, 0)
            for k in ("calls", "dropped", "effects", "distinct_keys", "duplicated_keys")
        },
        "kill_to_resume": stat("kill_to_resume_ms"),
        "kill_to_done": stat("kill_to_done_ms"),
        "fresh_start": stat("fresh_start_ms"),
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


# --------------------------------------------------------------------------------------------
# The docs' block


def render_crash(records: list[dict]) -> str:
    """Markdown for docs/benchmarks.md's crash block, from the last recorded run's result and
    the environment line written with it."""
    last = max(i for i, r in enumerate(records) if r.get("kind") == "result")
    result = records[last]
    environment = next((r for r in reversed(records[:last]) if r.get("kind") == "environment"), {})
    columns = [(system, kind) for kind in KINDS for system in SYSTEMS]
    label = {"taskpilots": "TaskPilots", "dbos": "DBOS"}

    def row(title: str, cell) -> str:
        return f"| {title} | " + " | ".join(cell(result[s][k]) for s, k in columns) + " |"

    def timing(name: str):
        def cell(summary: dict) -> str:
            figure = summary[name]
            if figure["p50_ms"] is None:
                return "—"
            return f"{figure['p50_ms'] / 1000:.2f} / {figure['p95_ms'] / 1000:.2f} s"

        return cell

    postgres = (environment.get("postgres") or {}).get("server_version", "?")
    load = environment.get("load_avg") or []
    lines = [
        f"`python manage.py bench crash --kills {result['kills']}` (seed {result['seed']}, calls "
        f"of {result['latency_ms']} ms; kills aimed before / during / after the call: "
        + " / ".join(str(result["schedule"][p]) for p in PHASES)
        + f"), measured {environment.get('at', '?')} at commit "
        f"{(environment.get('commit') or '?')[:10]}"
        + (" (uncommitted changes)" if environment.get("dirty") else "")
        + f": {environment.get('cpus', '?')} CPUs ({environment.get('cpu_model') or '?'}), "
        f"load average {', '.join(f'{x:.2f}' for x in load) or '?'} as it started, PostgreSQL "
        f"{postgres}, {result.get('broker', '?')}; lease {result['lease_seconds']} s, heartbeat "
        f"{result['heartbeat_seconds']} s.",
        "",
        "| per system × target | "
        + " | ".join(f"{label[s]}, `{k}` target" for s, k in columns)
        + " |",
        "|---|" + "---|" * len(columns),
        row("kills", lambda x: str(x["kills"])),
        row(
            "kill landed before / during / after the call / after the run's end",
            lambda x: " / ".join(str(x["hit"].get(p, 0)) for p in (*PHASES, "recorded")),
        ),
        row("**runs lost**", lambda x: f"**{x['lost']}**"),
        row("**effects duplicated** (a key landed twice)", lambda x: f"**{x['duplicated']}**"),
        row("repeated calls absorbed by the target", lambda x: str(x["repeated_calls_absorbed"])),
        row(
            "left unknown, handed to a person (landed / not)",
            lambda x: (
                f"{x['unknown_to_person']} ({x['unknown_landed']} / {x['unknown_not_landed']})"
            ),
        ),
        row("finished by themselves", lambda x: str(x["succeeded"])),
        row("finished without their effect", lambda x: str(x["succeeded_without_effect"])),
        row("kill → work resumed, p50 / p95", timing("kill_to_resume")),
        row("kill → finished or with a person, p50 / p95", timing("kill_to_done")),
        row("kill → fresh worker ready, p50 / p95", timing("fresh_start")),
    ]
    summary = {k: result[k] for k in ("benchmark", "kills", "seed", "latency_ms")}
    for system in SYSTEMS:
        summary[system] = {
            kind: {k: result[system][kind][k] for k in ("lost", "duplicated", "unknown_to_person")}
            for kind in KINDS
        }
    lines += ["", "```json", json.dumps(summary, sort_keys=True), "```"]
    return "\n".join(lines) + "\n"

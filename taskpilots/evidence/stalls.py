"""The zombie and partition drills: a worker that stalls mid-step without dying.

- zombie: the worker's pool child stops itself with SIGSTOP at one moment of a side-effect step
  (taskpilots/evidence/faults.py); the drill stops its whole process group too every other
  time, keeps it stopped until another worker has taken the step back (and, every other time,
  until that worker has finished the step), then SIGCONTs it.
- partition: the worker's PostgreSQL connection goes through its own black-hole proxy
  (taskpilots/evidence/blackhole.py); the hook opens the hole at one moment of the step, the
  drill holds it past the lease until another worker has taken the step back, then heals it
  (everything held back is delivered) or cuts it (every connection reset).

One stall at a time, each on a run started for it, each at the next moment in turn (at most
STALLS_PER_BATCH; a larger batch's other runs go alongside as traffic). Afterwards, from the
database, the sandbox ledger and the workers' own logs of what they called and wrote:
- was the claim taken back while the worker was stalled;
- did the worker come back (finish its task) after SIGCONT, heal or cut, or does it hang;
- what the stalled worker sent after it lost its claim (its call log), and what it recorded
  (timeline events it appended that committed: a discarded outcome is the engine refusing it, a
  receipt of its own call is the truth; anything else is written over the new owner's work);
- the run's timeline around the stall, each event marked with who wrote it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from django.db import InterfaceError, OperationalError, close_old_connections, connections

from runs.models import Run, Step, TimelineEvent
from taskpilots.sandbox.client import SandboxClient, SandboxError

ZOMBIE_MOMENTS = ("after_claim", "after_intent", "during_call", "after_answer")
PARTITION_MOMENTS = (
    "before_intent",
    "in_transaction",
    "intent_commit",
    "after_intent",
    "after_answer",
)
# On the engine's hot path (TASKPILOTS_HOT_PATH) a step is claimed together with its intent,
# and an intent is one statement of its own: the moments between the claim and the intent, and
# inside the intent's transaction, do not exist there. The drill runs its stalls on the
# ordinary path unless told otherwise (drill --worker-env TASKPILOTS_HOT_PATH=1).
HOT_PATH_MOMENTS = {
    "zombie": ("after_intent", "during_call", "after_answer"),
    "partition": ("after_intent", "after_answer"),
}
STALLED_TOOL = "mail.send"
# Timeline events a worker may still commit after losing its claim: the engine recording that it
# refused what the worker brought (today `step.outcome_discarded`; any verb naming a discard, a
# fence or a refusal), and the receipt of a call the worker itself made (confirmed by the tool).
REFUSALS = ("discard", "fenc", "refus", "stale")
# At most this many stalls in one batch (one at a time, a few seconds each); the batch's other
# runs go alongside as ordinary traffic.
STALLS_PER_BATCH = 20
# A step the new owner has finished with (done, failed, or parked for a person).
SETTLED = Step.FINISHED | {Step.Status.NEEDS_HUMAN, Step.Status.UNKNOWN_OUTCOME}


@dataclass
class Episode:
    kind: str  # zombie | partition
    moment: str
    number: int
    variant: str  # zombie: child | group (what is stopped); partition: heal | cut (the end)
    wake: str  # after_new_owner | after_take_back: how long the stall lasts past the take-back
    run: str = ""
    step: str = ""
    step_id: int | None = None
    attempt: int | None = None
    worker: str = ""
    lease_owner: str = ""  # as the step row named the stalled worker's claim
    pid: int | None = None
    thread: int | None = None  # the stalled task's thread in the worker (threads pool)
    stalled_at: float | None = None
    taken_back_at: float | None = None
    new_owner_done_at: float | None = None
    ended_at: float | None = None  # SIGCONT, heal or cut
    back_at: float | None = None  # the stalled task was over
    note: str = ""
    interrupted: str = ""  # why the stall could not be seen through (the soak's own faults)
    proxy: dict = field(default_factory=dict)
    # Filled in by analyse().
    verdict: str = ""
    stale_calls: list = field(default_factory=list)
    stale_writes: list = field(default_factory=list)
    late_receipts: int = 0
    discarded: int = 0
    mail_sent: int = 0
    errors: list = field(default_factory=list)  # what the run's tasks raised, and in whom
    timeline: list = field(default_factory=list)

    @property
    def injected(self) -> bool:
        return self.stalled_at is not None

    def as_dict(self) -> dict:
        data = asdict(self)
        for name in ("taken_back_at", "new_owner_done_at", "ended_at", "back_at"):
            data[name.replace("_at", "_after_s")] = _since(self.stalled_at, data.pop(name))
        data.pop("stalled_at")
        data["injected"] = self.injected
        return data


def _since(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else round(end - start, 2)


def plan(kind: str, number: int, *, hot_path: bool = False) -> Episode:
    """The number-th stall of a batch: every moment in turn, then the other variants."""
    moments = ZOMBIE_MOMENTS if kind == "zombie" else PARTITION_MOMENTS
    if hot_path:
        moments = HOT_PATH_MOMENTS[kind]
    rounds = number // len(moments)
    variants = ("child", "group") if kind == "zombie" else ("heal", "cut")
    return Episode(
        kind=kind,
        moment=moments[number % len(moments)],
        number=number,
        variant=variants[rounds % 2],
        wake=("after_new_owner", "after_take_back")[(rounds // 2) % 2],
    )


class StallFolder:
    """The folder the drill and its workers share: the armed stall, the reports, the logs."""

    def __init__(self) -> None:
        self.path = Path(tempfile.mkdtemp(prefix="tp-stalls-"))

    def close(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)

    def arm(self, episode: Episode) -> None:
        armed = {"kind": episode.kind, "moment": episode.moment, "tool": STALLED_TOOL}
        armed["episode"] = f"{episode.kind}-{episode.number}"
        partial = self.path / "armed.tmp"
        partial.write_text(json.dumps(armed))
        os.replace(partial, self.path / "armed.json")

    def disarm(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.path / "armed.json").unlink()

    def report(self, episode: Episode) -> dict | None:
        try:
            return json.loads(
                (self.path / f"stalled-{episode.kind}-{episode.number}.json").read_text()
            )
        except (OSError, ValueError):
            return None

    def task_over(self, pid: int, *, after: float, thread: int | None = None) -> float | None:
        """When the first task process `pid` ran to its end after `after` ended (on `thread`
        when given: the worker's other threads run tasks of their own)."""
        path = self.path / f"tasks-{pid}.jsonl"
        with contextlib.suppress(OSError):
            for line in path.read_text().splitlines():
                with contextlib.suppress(ValueError):
                    entry = json.loads(line)
                    if thread is not None and entry.get("thread") not in (None, thread):
                        continue
                    if entry["t"] > after:
                        return entry["t"]
        return None

    def log(self, name: str) -> list[dict]:
        entries = []
        for path in self.path.glob(f"{name}-*.jsonl"):
            with contextlib.suppress(OSError):
                for line in path.read_text().splitlines():
                    with contextlib.suppress(ValueError):
                        entries.append(json.loads(line))
        return entries


# -- running one stall ------------------------------------------------------------------------


def process_state(pid: int) -> str:
    """The state letter of /proc/<pid>/stat (T: stopped), or "" when the process is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return text.rsplit(")", 1)[1].split()[0]


def _wait(predicate, timeout: float, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return None


class StallRunner:
    """Runs the stalls of one batch for a Drill (its workers, sandbox, runs, person)."""

    def __init__(self, drill, lease_seconds: float, *, hot_path: bool = False):
        self.drill = drill
        self.hot_path = hot_path
        self.folder: StallFolder = drill.stall_folder
        self.lease = lease_seconds
        # Past the lease, the sweeper's period and a reconcile's settle window.
        self.hold_max = 3 * lease_seconds + 4

    def run(self, kind: str, batch, count: int) -> None:
        stalled = min(count, STALLS_PER_BATCH)
        for _ in range(count - stalled):
            self.drill._start(batch, "support.reply", self._reply_input(batch))
        for number in range(stalled):
            episode = plan(kind, number, hot_path=self.hot_path)
            self.drill.episodes.append(episode)
            try:
                self._one(episode, batch)
            except ProcessLookupError:
                episode.interrupted = "the stalled worker died meanwhile (the soak's SIGKILL)"
            except (OperationalError, InterfaceError, OSError, SandboxError) as exc:
                # The soak restarted PostgreSQL or dropped the sandbox mid-stall: this stall
                # proves nothing either way; the batch goes on (and is not started again).
                episode.interrupted = f"{type(exc).__name__}: {exc}"[:200]
                close_old_connections()
            finally:
                self.folder.disarm()
                self._release(episode)
                self.drill.stalled_pgid = None
            self.drill.say(f"    {self.describe(episode)}")
            # The next stall must hit the next run, not a retry of this one.
            self.drill._wait(
                lambda: (
                    not Run.objects.filter(pk__in=batch.run_ids)
                    .exclude(status__in=[*Run.TERMINAL, *Run.HUMAN])
                    .exists()
                ),
                what="the stalled run to come to rest",
                timeout=30,
            )

    def describe(self, episode: Episode) -> str:
        if not episode.injected or episode.interrupted:
            why = episode.interrupted or episode.note
            return f"{episode.kind} {episode.moment}: not seen through ({why})"
        taken = _since(episode.stalled_at, episode.taken_back_at)
        back = _since(episode.ended_at, episode.back_at)
        return (
            f"{episode.kind} {episode.moment} ({episode.variant}, {episode.wake}): "
            f"taken back after {taken if taken is not None else '—'} s, "
            f"ended after {_since(episode.stalled_at, episode.ended_at)} s, "
            f"task over {back if back is not None else 'never'} s later"
        )

    def _one(self, episode: Episode, batch) -> None:
        drill = self.drill
        if episode.moment == "during_call":
            # The request must still be in flight when the worker stops.
            drill.sandbox.inject("mail", "latency", action="send", count=1, latency_ms=700)
        self.folder.arm(episode)
        run = drill._start(batch, "support.reply", self._reply_input(batch))
        report = _wait(lambda: self.folder.report(episode), timeout=20)
        if report is None:
            episode.note = "no worker reached the moment"
            return
        episode.pid, episode.worker = report["pid"], report["worker"]
        episode.thread = report.get("thread")
        drill.stalled_pgid = report["pgid"]
        episode.stalled_at = report["at"]
        episode.proxy = {"address": report.get("proxy", ""), "answer": report.get("proxy_answer")}
        step = self._stalled_step(report, run)
        if step is not None:
            episode.run, episode.step = str(step.run_id), step.name
            episode.step_id, episode.attempt = step.pk, step.attempts
            episode.lease_owner = step.lease_owner
        if episode.kind == "zombie":
            self._zombie(episode, report)
        else:
            self._partition(episode, report)

    def _reply_input(self, batch) -> dict:
        return self.drill._reply_input(800 + len(batch.run_ids))

    def _stalled_step(self, report: dict, run) -> Step | None:
        """The step the stalled worker holds: its run's step of the stalled tool (the worker
        names the run from its call, or from the task it executes), or found by its lease."""
        steps = Step.objects.filter(tool=STALLED_TOOL)
        if report.get("run"):
            return steps.filter(run_id=report["run"]).order_by("-iteration").first()
        held = steps.filter(status=Step.Status.RUNNING, lease_owner=report["worker"]).first()
        return held or steps.filter(run=run).first()

    def _zombie(self, episode: Episode, report: dict) -> None:
        if not _wait(lambda: process_state(episode.pid) in ("T", "t"), timeout=5):
            state = process_state(episode.pid)
            if not state:  # gone: the soak SIGKILLed it first; this stall proves nothing
                episode.interrupted = "the stalled worker died meanwhile (the soak's SIGKILL)"
            episode.note = f"the worker did not stop (state {state!r})"
            return
        worker = self._worker_of(report)
        if episode.variant == "group":
            os.killpg(report["pgid"], signal.SIGSTOP)
        self._hold(episode)
        if episode.variant == "group":
            os.killpg(report["pgid"], signal.SIGCONT)
        else:
            os.kill(episode.pid, signal.SIGCONT)
        episode.ended_at = time.time()
        self._wait_back(episode, worker)

    def _partition(self, episode: Episode, report: dict) -> None:
        proxy = self.drill.proxy_at(report.get("proxy", ""))
        if proxy is None:
            episode.note = "the worker has no database proxy"
            return
        if not _wait(lambda: proxy.state == "hole", timeout=10):
            episode.note = "the hole never opened (the statement it waits for never went out)"
            proxy.cut()
            return
        worker = self._worker_of(report)
        self._hold(episode)
        answer = proxy.heal() if episode.variant == "heal" else proxy.cut()
        episode.ended_at = time.time()
        episode.proxy["holes"] = answer["holes"][-1:]
        self._wait_back(episode, worker)

    def _hold(self, episode: Episode) -> None:
        """Past the lease, until another worker took the step back; then, for after_new_owner,
        until it has finished the step too (each bounded by hold_max)."""
        time.sleep(self.lease)
        if episode.step_id is None:
            return
        if _wait(lambda: self._taken_back(episode), timeout=self.hold_max, interval=0.05):
            episode.taken_back_at = time.time()
            if episode.wake == "after_new_owner" and _wait(
                lambda: self._step_status(episode) in SETTLED, timeout=self.hold_max
            ):
                episode.new_owner_done_at = time.time()
        else:
            episode.note = f"not taken back within {self.lease + self.hold_max:.0f} s"

    def _step_status(self, episode: Episode) -> str:
        return Step.objects.filter(pk=episode.step_id).values_list("status", flat=True).first()

    def _taken_back(self, episode: Episode) -> bool:
        row = Step.objects.filter(pk=episode.step_id).values("status", "lease_owner", "attempts")
        row = row.first()
        return bool(row) and (
            row["attempts"] > (episode.attempt or 0)
            or row["status"] != Step.Status.RUNNING
            or row["lease_owner"] not in ("", episode.lease_owner)
        )

    def _worker_of(self, report: dict):
        for worker in self.drill._workers.started:
            if worker.process is not None and worker.process.pid == report.get("pgid"):
                return worker
        return None

    def _wait_back(self, episode: Episode, worker) -> None:
        """The stalled task must end by itself once the stall is over (or during it, when the
        worker gives up by itself): no hang. Its end is in the worker's task log."""

        def over():
            ended = self.folder.task_over(
                episode.pid, after=episode.stalled_at, thread=episode.thread
            )
            return ended or (worker is not None and not worker.alive and time.time())

        # A task that waits for a pooled connection while its worker's connections come back
        # is slow, not hung: it fails on its own after the pool's timeout.
        pool = connections["default"].settings_dict["OPTIONS"].get("pool") or {}
        episode.back_at = _wait(over, timeout=15 + pool.get("timeout", 0), interval=0.1)

    def _release(self, episode: Episode) -> None:
        """Never leave a worker stopped or a hole open behind an episode."""
        if episode.kind == "zombie" and episode.pid and episode.ended_at is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(os.getpgid(episode.pid), signal.SIGCONT)
        if episode.kind == "partition":
            proxy = self.drill.proxy_at(episode.proxy.get("address", ""))
            if proxy is not None and proxy.state == "hole":
                proxy.heal()


# -- what happened ------------------------------------------------------------------------------


def analyse(episodes: list[Episode], folder: StallFolder | None, sandbox: SandboxClient) -> dict:
    """Per stall: what the stalled worker sent and committed after losing its claim, with the
    run's timeline; and the figures the drill reports."""
    calls = folder.log("calls") if folder else []
    writes = folder.log("writes") if folder else []
    # Who committed each event: by its hash (unique along the chain), however it was written.
    writer = {(entry["run"], entry["hash"]): entry for entry in writes}
    errors = folder.log("errors") if folder else []
    for episode in episodes:
        if episode.injected and episode.run:
            _analyse_one(episode, calls, writer, sandbox)
            episode.errors = [
                {
                    "by": "stalled worker" if _by_stalled_task(e, episode) else "other worker",
                    "after_s": round(e["t"] - episode.stalled_at, 2),
                    "error": e["error"],
                }
                for e in errors
                if e["run"] == episode.run
            ]
            if episode.interrupted:
                episode.verdict = f"not counted ({episode.interrupted}); {episode.verdict}"
    # A stall the soak interrupted (its worker SIGKILLed, PostgreSQL restarted) proves nothing
    # about stalls; it is listed, not counted.
    injected = [e for e in episodes if e.injected and not e.interrupted]
    return {
        "stalls": len(episodes),
        "stalls_injected": len(injected),
        "claims_not_taken_back": sum(1 for e in injected if e.taken_back_at is None),
        "hung_workers": sum(1 for e in injected if e.ended_at and e.back_at is None),
        "stale_calls": sum(len(e.stale_calls) for e in injected),
        "stale_writes": sum(len(e.stale_writes) for e in injected),
        "episodes": [e.as_dict() for e in episodes],
    }


def _by_stalled_task(entry: dict, episode: Episode) -> bool:
    """Logged by the stalled task itself: its process and, in a threads pool, its thread (the
    worker's other threads may claim the run afresh once the new owner let it go)."""
    if entry["pid"] != episode.pid:
        return False
    return episode.thread is None or entry.get("thread") in (None, episode.thread)


def _analyse_one(episode: Episode, calls: list, writer: dict, sandbox: SandboxClient) -> None:
    events = list(
        TimelineEvent.objects.filter(run_id=episode.run)
        .order_by("seq")
        .values("id", "seq", "at", "verb", "data", "hash")
    )
    lost_claim = _claim_lost_at(episode, events)
    # The stalled task ends when its log says so; a hung one is watched to the end.
    until = episode.back_at or time.time()
    for event in events:
        event["writer"] = writer.get((episode.run, event["hash"]))
    mine = {e["id"] for e in events if e["writer"] and _by_stalled_task(e["writer"], episode)}
    same_worker = {e["id"] for e in events if e["writer"] and e["writer"]["pid"] == episode.pid}
    if lost_claim is not None:
        episode.stale_calls = [
            {"tool": c["tool"], "key": c["key"], "after_s": round(c["t"] - episode.stalled_at, 2)}
            for c in calls
            if _by_stalled_task(c, episode)
            and c["run"] == episode.run
            and lost_claim < c["t"] <= until
        ]
        for event in events:
            if event["id"] not in mine:
                continue
            if not lost_claim < event["writer"]["t"] <= until:
                continue
            if any(word in event["verb"] for word in REFUSALS):
                episode.discarded += 1
            elif event["verb"] == "side_effect.committed" and (
                event["data"].get("confirmed_by") == "tool"
            ):
                episode.late_receipts += 1
            else:
                episode.stale_writes.append(_brief(event))
    episode.mail_sent = len(sandbox.ledger(system="mail", run=episode.run))
    start = datetime.fromtimestamp(episode.stalled_at, tz=UTC)
    for event in events:
        if (event["at"] - start).total_seconds() < -1:
            continue
        entry = _brief(event)
        entry["t"] = round((event["at"] - start).total_seconds(), 2)
        if event["id"] in mine:
            over = episode.back_at and event["writer"]["t"] > episode.back_at
            entry["by"] = "stalled worker, next task" if over else "stalled worker"
        elif event["id"] in same_worker:
            # Another of the worker's threads, on a claim of its own (a later hint).
            entry["by"] = "stalled worker, another task"
        else:
            entry["by"] = "other worker" if event["writer"] else "drill"
        episode.timeline.append(entry)
    problems = []
    if episode.mail_sent > 1:
        problems.append(f"{episode.mail_sent} mails sent")
    if episode.stale_calls:
        problems.append(f"{len(episode.stale_calls)} call(s) after losing the claim")
    if episode.stale_writes:
        verbs = ", ".join(w["verb"] for w in episode.stale_writes)
        problems.append(f"recorded after losing the claim: {verbs}")
    if episode.taken_back_at is None:
        problems.append("claim not taken back while stalled")
    if episode.ended_at and episode.back_at is None:
        problems.append("the worker hangs")
    episode.verdict = "; ".join(problems) or "ok"


def _claim_lost_at(episode: Episode, events: list) -> float | None:
    """When another claim of the stalled step began: the first event naming that step with a
    higher attempt (a take-back or a new start). None when nobody took it back."""
    for event in events:
        data = event["data"] or {}
        attempt = data.get("attempt")
        if (
            data.get("step") == episode.step
            and isinstance(attempt, int)
            and attempt > (episode.attempt or 0)
        ):
            return event["at"].timestamp()
    return None


def _brief(event: dict) -> dict:
    data = event["data"] or {}
    keep = ("step", "attempt", "from", "to", "key", "previous_worker", "worker", "why")
    return {"seq": event["seq"], "verb": event["verb"], **{k: data[k] for k in keep if k in data}}

"""The peer drill: a worker SIGKILLed around the write call of a real third-party MCP server,
and what recovery did about it, counted on the receiving side.

The peers are the reference filesystem server (`write_file`) and the reference git server
(`git_commit`), as installed by taskpilots/peers, configured by runs/agents/reference.py (or,
to compare, without its verifications, or with nothing but the servers' own annotations). Each
runs behind the stdio proxy of taskpilots/evidence/mcp_proxy.py, whose log holds every
tools/call request that reached the server and its answer.

Two workflows call them, `peers.fs.write` (write_file once) and `peers.git.commit` (git_add,
then git_commit once). For each peer × moment of the kill matrix —

| moment | the worker dies (taskpilots/evidence/faults.py) |
|---|---|
| `before_send` | after the intent committed, before the request leaves it |
| `during_call` | the request reached the server and was carried out; the proxy holds the answer |
| `after_answer` | the answer is in; the receipt is not recorded |

— one run starts on a worker of its own (its own queue) armed to die at that moment; the
worker that takes the step back (the recovery worker, which outlives the cases: the liveness
heartbeat takes a dead worker's leases back in seconds; the matrix sweeps meanwhile, as beat
would) finishes it or parks it for a person, and the case records: whether the worker died
where it should, the run's end, how many write requests with the run's key reached the server
(before the crash and in all), the effect on the receiving side (the file's content; the
commits with the run's message, by `git rev-list --count`), and the receipt's external id
against the one the effect implies (the file's path and sha256; the new commit's hash).

`manage.py drill --peers` runs the matrix and reports `local_recovery_rate` per peer: runs that
finished without a person ÷ crashes. tests/agents/test_real_peers.py runs it case by case.

Worker processes import this module (TASKPILOTS_WORKFLOW_MODULES) and register the tools and
workflows from TASKPILOTS_PEER_WORKDIR (the servers' folder and repository, the proxy logs, the
tool listings taken once by the matrix) and TASKPILOTS_PEER_CONFIG.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from runs import workflows
from runs.agents import mcp, reference
from runs.workflows import Workflow, compute, side_effect
from taskpilots import peers
from taskpilots.evidence import mcp_proxy

WORKDIR_ENV = "TASKPILOTS_PEER_WORKDIR"
CONFIG_ENV = "TASKPILOTS_PEER_CONFIG"
# MCP tool names whose answers this worker's proxies hold (the during-call crash).
HOLD_ENV = "TASKPILOTS_PEER_HOLD"

# reference: runs/agents/reference.py as it is; unverified: the same without its
# verifications (what a crash costs without them); annotations: no configuration at all, only
# what the servers claim (write_file's idempotentHint makes the engine resend it blindly).
MODES = ("reference", "unverified", "annotations")
MOMENTS = ("before_send", "during_call", "after_answer")
PROXY = Path(mcp_proxy.__file__).resolve()


@dataclass(frozen=True)
class Peer:
    name: str  # as the report names it
    server: str  # the McpServer's name: tools are mcp.<server>.<tool>
    write_tool: str  # the MCP tool the matrix crashes around
    workflow: str
    log: str  # the proxy's log, in the workdir

    @property
    def tool(self) -> str:
        return f"mcp.{self.server}.{self.write_tool}"


PEERS = {
    "filesystem": Peer("filesystem", "fs", "write_file", "peers.fs.write", "fs.jsonl"),
    "git": Peer("git", "git", "git_commit", "peers.git.commit", "git.jsonl"),
}


@dataclass(frozen=True)
class Workdir:
    """The peers' world: the filesystem server's folder, the git repository, the proxies'
    logs and the tool listings."""

    path: Path

    @property
    def files(self) -> Path:
        return self.path / "files"

    @property
    def repo(self) -> Path:
        return self.path / "repo"

    def log(self, peer: Peer) -> Path:
        return self.path / "logs" / peer.log

    def listing(self, peer: Peer) -> Path:
        return self.path / "listings" / f"{peer.server}.json"

    def prepare(self) -> Workdir:
        for folder in (self.files, self.repo, self.path / "logs", self.path / "listings"):
            folder.mkdir(parents=True, exist_ok=True)
        if not (self.repo / ".git").exists():
            git(self.repo, "init", "-q")
            git(self.repo, "config", "user.name", "TaskPilots peer drill")
            git(self.repo, "config", "user.email", "drill@taskpilots.invalid")
            git(
                self.repo,
                "commit",
                "-q",
                "--allow-empty",
                "-m",
                "The repository the drill commits to",
            )
        return self


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, timeout=30
    ).stdout.strip()


# --------------------------------------------------------------------------------------------
# The servers, tools and workflows (in every process that imports this module with the
# variables set; the matrix registers them in its own process too).


def servers(workdir: Workdir, hold: frozenset[str] = frozenset()) -> dict[str, mcp.McpServer]:
    """The two peers, each behind the logging proxy (run by path: its cwd is the peer's)."""

    def proxied(peer: Peer) -> list[str]:
        held = [arg for tool in sorted(hold) for arg in ("--hold", tool)]
        return [sys.executable, str(PROXY), "--log", str(workdir.log(peer)), *held, "--"]

    return {
        "filesystem": reference.filesystem_server(
            workdir.files,
            name=PEERS["filesystem"].server,
            command=[*proxied(PEERS["filesystem"]), *peers.filesystem_command()],
        ),
        "git": reference.git_server(
            workdir.repo,
            name=PEERS["git"].server,
            command=[*proxied(PEERS["git"]), *peers.git_command()],
        ),
    }


def configs(mode: str) -> dict[str, dict[str, mcp.McpToolConfig]]:
    if mode not in MODES:
        raise ValueError(f"unknown peer configuration {mode!r}; choose from {', '.join(MODES)}")
    if mode == "annotations":
        return {"filesystem": {}, "git": {}}
    chosen = {"filesystem": reference.filesystem_config(), "git": reference.git_config()}
    if mode == "unverified":
        chosen = {
            peer: {tool: dataclasses.replace(cfg, verification=None) for tool, cfg in cfgs.items()}
            for peer, cfgs in chosen.items()
        }
    return chosen


INCLUDE = {"filesystem": ["write_file"], "git": ["git_add", "git_commit"]}


def register(workdir: Workdir, mode: str = "reference", hold: frozenset[str] = frozenset()):
    """Register the peers' tools (from the listings the matrix took, when there) and the two
    workflows. Returns the servers."""
    found = servers(workdir, hold)
    chosen = configs(mode)
    for peer, server in found.items():
        listing = _read_listing(workdir.listing(PEERS[peer]))
        mcp.register_mcp_tools(server, include=INCLUDE[peer], config=chosen[peer], manifest=listing)
    fs, repo = PEERS["filesystem"], PEERS["git"]
    workflows.register(
        Workflow(
            fs.workflow,
            1,
            [
                side_effect(
                    "write",
                    fs.tool,
                    params=lambda ctx: {"path": ctx.input["path"], "content": ctx.input["content"]},
                    stage="write",
                ),
                compute("done", lambda ctx: {"written": ctx.input["path"]}, stage="done"),
            ],
        ),
        replace=True,
    )
    workflows.register(
        Workflow(
            repo.workflow,
            1,
            [
                side_effect(
                    "stage",
                    f"mcp.{repo.server}.git_add",
                    params=lambda ctx: {
                        "repo_path": ctx.input["repo"],
                        "files": [ctx.input["file"]],
                    },
                    stage="commit",
                ),
                side_effect(
                    "commit",
                    repo.tool,
                    params=lambda ctx: {
                        "repo_path": ctx.input["repo"],
                        "message": ctx.input["message"],
                    },
                    stage="commit",
                ),
                compute("done", lambda ctx: {"committed": ctx.input["file"]}, stage="done"),
            ],
        ),
        replace=True,
    )
    return found


def _read_listing(path: Path) -> list[dict] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # listed from the server on first use instead


def take_listings(workdir: Workdir) -> None:
    """List each peer's tools once (a session per listing) and keep them for every process."""
    for peer, server in servers(workdir).items():
        listing = mcp.list_tools(dataclasses.replace(server, keep_alive=False))
        workdir.listing(PEERS[peer]).write_text(json.dumps(listing))


if os.environ.get(WORKDIR_ENV):
    register(
        Workdir(Path(os.environ[WORKDIR_ENV])),
        os.environ.get(CONFIG_ENV) or "reference",
        frozenset(t for t in os.environ.get(HOLD_ENV, "").split(",") if t),
    )


# --------------------------------------------------------------------------------------------
# The kill matrix


@dataclass
class Case:
    """One crash and what came of it (see the module docstring)."""

    peer: str
    moment: str
    number: int
    run_id: str = ""
    key: str = ""
    crashed: bool = False  # the worker died, at the moment it was armed for
    status: str = ""
    attention_reason: str = ""
    writes_before_crash: int = 0  # write requests with the run's key that reached the server
    writes: int = 0  # ... in all, by the end
    answer_held: bool = False  # the proxy held the server's answer (during_call)
    effects: int = 0  # on the receiving side: the file holds the content (1), or commits
    content_ok: bool = False  # the file's final content / the last commit's message
    external_id: str = ""
    expected_external_id: str = ""
    confirmed_by: str = ""
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)

    @property
    def without_person(self) -> bool:
        return self.status == "succeeded"

    @property
    def resent(self) -> bool:
        return self.writes > self.writes_before_crash

    def as_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data.update(without_person=self.without_person, resent=self.resent)
        return data


class PeerMatrix:
    """Workers, peers and rules for the kill matrix; `run_case(peer, moment)` runs one case.

    A context manager: entering prepares the workdir, lists the peers' tools, registers them
    here, points this process's dispatch at Celery and starts the recovery worker; leaving
    stops every worker. Chaos workers (one per case: each dies) are started ahead with
    `prepare(cases)`, in parallel, so the cases do not wait for them one by one.
    """

    def __init__(
        self,
        workdir: Path,
        *,
        mode: str = "reference",
        progress: Callable[[str], None] | None = None,
        settle_timeout: float = 90.0,
        worker_env: dict[str, str] | None = None,
    ):
        self.workdir = Workdir(Path(workdir))
        self.mode = mode
        configs(mode)  # an unknown mode fails here
        self.progress = progress
        self.settle_timeout = settle_timeout
        self.tag = f"peers-{uuid.uuid4().hex[:8]}"
        self.worker_env = worker_env or {}
        self.cases: list[Case] = []
        self._chaos: dict[tuple[str, str], list] = {}
        self._numbers = iter(range(1, 10**6))
        self._rules: set[int] = set()

    def say(self, message: str) -> None:
        if self.progress:
            self.progress(message)

    # -- set up -----------------------------------------------------------------------------
    def __enter__(self) -> PeerMatrix:
        from django.conf import settings

        from taskpilots.celery import app as celery_app
        from taskpilots.evidence.workers import Workers

        peers.filesystem_command(), peers.git_command()  # PeerMissing: say what to run
        self.workdir.prepare()
        take_listings(self.workdir)
        register(self.workdir, self.mode)
        self._previous = (settings.TASKPILOTS["DISPATCH"], celery_app.conf.task_default_queue)
        self.workers = Workers(
            f"tp-{self.tag}",
            {
                "TASKPILOTS_WORKFLOW_MODULES": __name__,
                WORKDIR_ENV: str(self.workdir.path),
                CONFIG_ENV: self.mode,
                # A settle window of 7 s (twice the timeout plus a second): a verification
                # that finds nothing is trusted after that.
                "TASKPILOTS_TOOL_TIMEOUT_SECONDS": "3",
                **self.worker_env,
            },
        )
        celery_app.conf.task_default_queue = self.workers.queue
        settings.TASKPILOTS["DISPATCH"] = "celery"
        self.say(f"starting the recovery worker on queue {self.workers.queue} ({self.mode})")
        self.recovery = self.workers.start(name=f"recovery-{self.tag}", wait=False)
        return self

    def __exit__(self, *exc) -> None:
        from django.conf import settings

        from approvals.models import EscalationRule
        from taskpilots.celery import app as celery_app

        queues = {w.listen for w in self.workers.started}
        self.workers.close()
        with contextlib.suppress(Exception):  # a test database flushed meanwhile has none
            EscalationRule.objects.filter(pk__in=self._rules).delete()
        for queue in queues:
            self.workers.queue = queue
            self.workers.delete_queue()
        settings.TASKPILOTS["DISPATCH"], celery_app.conf.task_default_queue = self._previous

    def prepare(self, cases: list[tuple[str, str]]) -> None:
        """Start the chaos workers of these cases now (without waiting for them)."""
        for peer, moment in cases:
            self._chaos.setdefault((peer, moment), []).append(self._start_chaos(peer, moment))

    def _start_chaos(self, peer_name: str, moment: str):
        from taskpilots.evidence import faults

        peer = PEERS[peer_name]
        queue = f"{self.workers.queue}-{peer.server}-{moment}-{uuid.uuid4().hex[:4]}"
        env = {
            "TASKPILOTS_QUEUE": queue,
            faults.CRASH_AT[moment]: peer.tool,
            # A chaos worker never judges others: it would take a dead worker's steps back
            # onto its own queue and make them its own case (the recovery worker judges).
            "TASKPILOTS_WORKER_DEAD_SECONDS": "3600",
        }
        if moment == "during_call":
            env[HOLD_ENV] = peer.write_tool
            env[faults.CRASH_DURING_CALL_LOG] = str(self.workdir.log(peer))
        name = f"chaos-{peer.server}-{moment}-{uuid.uuid4().hex[:4]}"
        return self.workers.start(name=name, listen=queue, wait=False, **env)

    def _install_rules(self) -> None:
        """Quick retries of transient failures and outages (a stdio server slow to start) for
        the two workflows: a flushed test database has no default rules."""
        from approvals.models import EscalationRule

        for peer in PEERS.values():
            for failure_class in ("transient", "outage"):
                rule, _ = EscalationRule.objects.get_or_create(
                    name=f"{self.tag}: {failure_class} in {peer.workflow}",
                    defaults={
                        "position": 0,
                        "workflow": peer.workflow,
                        "failure_class": failure_class,
                        "action": "retry",
                        "max_attempts": 8,
                        "backoff_base_seconds": 0.2,
                        "backoff_cap_seconds": 1.0,
                        "queue": "ops",
                    },
                )
                self._rules.add(rule.pk)

    # -- one case ---------------------------------------------------------------------------
    def run_case(self, peer_name: str, moment: str) -> Case:
        from runs.models import Run

        peer = PEERS[peer_name]
        case = Case(peer_name, moment, next(self._numbers))
        self.cases.append(case)
        started = time.monotonic()
        self._install_rules()
        chaos = (self._chaos.get((peer_name, moment)) or [None]).pop(0)
        if chaos is None or not chaos.alive:
            chaos = self._start_chaos(peer_name, moment)
        _wait_ready(chaos)
        _wait_ready(self.recovery)
        world = self._world(peer, case)
        run = self._start_run(peer, case, world, queue=chaos.listen)
        case.run_id, case.key = str(run.pk), self._key_of(run, peer)
        self._wait(lambda: not chaos.alive, what=f"the {moment} crash", timeout=60)
        case.key = case.key or self._key_of(run, peer)
        case.crashed = not chaos.alive and self._died_where_armed(chaos, moment, case.key)
        case.writes_before_crash = len(self._writes(peer, case))
        final = self._wait(
            self._settled(run.pk), what="the run to finish or park", timeout=self.settle_timeout
        ) or Run.objects.get(pk=run.pk)
        self._measure(peer, case, final, world)
        case.seconds = round(time.monotonic() - started, 2)
        self.say(self.line(case))
        return case

    def _world(self, peer: Peer, case: Case) -> dict:
        """The input of the case's run, and the receiving side as it was before."""
        name = f"case-{case.number}-{case.moment}.txt"
        content = f"TaskPilots peer drill, case {case.number}: {peer.name} {case.moment}\n"
        if peer.name == "filesystem":
            return {"input": {"path": name, "content": content}, "content": content}
        (self.workdir.repo / name).write_text(content)
        message = f"Add {name} ({case.moment})"
        return {
            "input": {"repo": str(self.workdir.repo), "file": name, "message": message},
            "commits_before": int(git(self.workdir.repo, "rev-list", "--count", "HEAD")),
            "message": message,
        }

    def _start_run(self, peer: Peer, case: Case, world: dict, *, queue: str):
        from runs import engine
        from taskpilots.celery import app as celery_app

        default = celery_app.conf.task_default_queue
        celery_app.conf.task_default_queue = queue  # its first hint goes to the chaos worker
        try:
            run, _ = engine.start_run(
                peer.workflow,
                world["input"],
                business_key=f"{self.tag}-{case.number}",
                principal="agent:peer-drill",
            )
        finally:
            celery_app.conf.task_default_queue = default
        return run

    def _key_of(self, run, peer: Peer) -> str:
        from runs.models import SideEffect

        effect = SideEffect.objects.filter(run=run, tool=peer.tool).first()
        return effect.idempotency_key if effect else ""

    def _died_where_armed(self, chaos, moment: str, key: str) -> bool:
        """The chaos worker's last words (taskpilots/evidence/faults.py) name the moment, and
        the key of this case's call where they can."""
        said = "".join(chaos.output)
        if moment == "after_answer":
            return "exiting after" in said
        words = "SIGKILL before sending" if moment == "before_send" else "SIGKILL during the call"
        return any(words in line and key in line for line in chaos.output)

    def _writes(self, peer: Peer, case: Case) -> list[dict]:
        if not case.key:
            return []
        return mcp_proxy.requests(self.workdir.log(peer), tool=peer.write_tool, key=case.key)

    def _settled(self, run_id):
        from runs import engine
        from runs.models import Run

        def check():
            engine.sweep()  # as beat would: rechecks and retries that are due
            run = Run.objects.get(pk=run_id)
            return run if run.status in (Run.TERMINAL | Run.HUMAN) else None

        return check

    def _wait(self, predicate, *, what: str, timeout: float):
        from django.db import close_old_connections

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(0.2)
            close_old_connections()
        self.say(f"    gave up waiting for {what} after {timeout:.0f} s")
        return None

    def _measure(self, peer: Peer, case: Case, run, world: dict) -> None:
        from runs.models import SideEffect

        case.status, case.attention_reason = run.status, (run.attention_reason or "")[:300]
        case.key = case.key or self._key_of(run, peer)
        case.writes = len(self._writes(peer, case))
        case.answer_held = any(
            e.get("held")
            for e in mcp_proxy.read_log(self.workdir.log(peer))
            if e.get("dir") == "answer" and e.get("key") == case.key
        )
        effect = SideEffect.objects.filter(run_id=run.pk, tool=peer.tool).first()
        if effect is not None:
            case.external_id, case.confirmed_by = effect.external_id, effect.confirmed_by
        if peer.name == "filesystem":
            path = self.workdir.files / world["input"]["path"]
            there = path.read_text() if path.exists() else None
            case.effects = int(there == world["content"])
            case.content_ok = there == world["content"]
            case.expected_external_id = reference.file_proof(
                world["input"]["path"], world["content"]
            )
        else:
            repo = self.workdir.repo
            case.effects = int(git(repo, "rev-list", "--count", "HEAD")) - world["commits_before"]
            messages = git(repo, "log", "--format=%B%x00", f"-{max(case.effects, 1)}").split("\0")
            case.content_ok = [m.strip() for m in messages if m.strip()] == [world["message"]]
            case.expected_external_id = git(repo, "rev-parse", "HEAD") if case.effects else ""
        if not case.crashed:
            case.problems.append("the worker did not die where it was armed to")
        if case.effects > 1 or (case.without_person and case.effects != 1):
            case.problems.append(f"{case.effects} effects on the receiving side")
        if case.writes > 1:
            case.problems.append(f"{case.writes} write requests reached the server")
        if case.without_person and not case.external_id:
            case.problems.append("no commit proof in the receipt")
        elif case.without_person and case.external_id != case.expected_external_id:
            case.problems.append(
                f"receipt {case.external_id!r}, the effect implies {case.expected_external_id!r}"
            )

    @staticmethod
    def line(case: Case) -> str:
        return (
            f"    {case.peer} {case.moment}: {case.status}"
            f"{' (' + case.confirmed_by + ')' if case.confirmed_by else ''}, "
            f"{case.writes} write{'s' if case.writes != 1 else ''} reached the server "
            f"({case.writes_before_crash} before the crash), {case.effects} effect"
            f"{'s' if case.effects != 1 else ''}, {case.seconds} s"
            + (f" — {'; '.join(case.problems)}" if case.problems else "")
        )


def _wait_ready(worker, timeout: float = 60) -> None:
    from taskpilots.celery import READY_LINE

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if READY_LINE in "".join(worker.output):
            return
        if not worker.alive:
            break
        time.sleep(0.05)
    raise RuntimeError(f"worker {worker.name} did not start:\n" + "".join(worker.output[-40:]))


# --------------------------------------------------------------------------------------------
# The drill


SETTLED = ("succeeded", "failed", "cancelled", "compensated", "needs_human", "taken_over")


def _lost(case: Case) -> bool:
    """Never settled, or finished as if done with nothing done."""
    return case.status not in SETTLED or (case.without_person and case.effects == 0)


def report(cases: list[Case], mode: str) -> dict:
    """Per peer: crashes, runs finished without a person, local_recovery_rate (the second ÷ the
    first), write requests that reached the server, resends, cases whose effect was not
    exactly one (a run parked for a person before anything was sent has none, rightly),
    receipts without a commit proof and receipts whose proof the effect does not bear out."""
    per_peer = {}
    for name in PEERS:
        mine = [c for c in cases if c.peer == name]
        crashes = [c for c in mine if c.crashed]
        alone = [c for c in crashes if c.without_person]
        per_peer[name] = {
            "crashes": len(crashes),
            "finished_without_person": len(alone),
            "needs_human": sum(1 for c in crashes if c.status in ("needs_human", "taken_over")),
            "local_recovery_rate": round(len(alone) / len(crashes), 4) if crashes else None,
            "writes_reached_server": sum(c.writes for c in mine),
            # Write requests beyond the first for one run: a blind resend (harmless only when
            # the write is, and nobody changed the file meanwhile).
            "extra_writes": sum(max(c.writes - 1, 0) for c in mine),
            "resent": sum(1 for c in mine if c.resent),
            "not_exactly_one_effect": sum(1 for c in mine if c.effects != 1),
            "receipts_without_proof": sum(
                1 for c in mine if c.without_person and not c.external_id
            ),
            "wrong_receipts": sum(
                1
                for c in mine
                if c.without_person and c.external_id and c.external_id != c.expected_external_id
            ),
        }
    return {
        "mode": mode,
        "peers": per_peer,
        "cases": [c.as_dict() for c in cases],
        "crashes_missed": sum(1 for c in cases if not c.crashed),
        "lost": sum(1 for c in cases if _lost(c)),
        "duplicate_effects": sum(1 for c in cases if c.effects > 1),
        "wrong_receipts": sum(p["wrong_receipts"] for p in per_peer.values()),
    }


def run_drill(
    *,
    rounds: int = 1,
    mode: str = "reference",
    progress: Callable[[str], None] | None = None,
    workdir: Path | None = None,
    worker_env: dict[str, str] | None = None,
) -> dict:
    """The whole matrix, `rounds` times, in a workdir of its own (removed afterwards)."""
    import shutil
    import tempfile

    started = time.monotonic()
    folder = Path(workdir or tempfile.mkdtemp(prefix="tp-peers-"))
    matrix_cases = [(peer, moment) for _ in range(rounds) for peer in PEERS for moment in MOMENTS]
    try:
        with PeerMatrix(folder, mode=mode, progress=progress, worker_env=worker_env) as matrix:
            matrix.say(f"starting {len(matrix_cases)} chaos workers, one per crash")
            matrix.prepare(matrix_cases)
            for index, (peer, moment) in enumerate(matrix_cases):
                matrix.say(f"[{index + 1}/{len(matrix_cases)}] {peer}: SIGKILL {moment}")
                matrix.run_case(peer, moment)
            result = report(matrix.cases, mode)
    finally:
        if workdir is None:
            with contextlib.suppress(OSError):
                shutil.rmtree(folder)
    result["elapsed_s"] = round(time.monotonic() - started, 1)
    return result

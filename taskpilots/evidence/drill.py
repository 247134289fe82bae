"""Recovery drills from the source articles, run against the sandbox with real workers.

Each drill kind starts a batch of runs of the `drill.*` copies of the demo workflows, injects its
fault, lets the real workers and the sweeper recover, plays the person where the seeds say a person
decides (reading only the snapshot), and waits until every run is finished or parked for a person.
The figures are computed afterwards from the database and the sandbox ledger, never from counters
the drill keeps itself.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import signal
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import kombu.exceptions
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import InterfaceError, OperationalError, close_old_connections, connections
from django.utils import timezone

from approvals import actions
from approvals.models import ApprovalRequest, EscalationRule
from runs import engine
from runs.models import Run, SideEffect, Snapshot, Step, Wait
from taskpilots.celery import app as celery_app
from taskpilots.env import format_database_url
from taskpilots.evidence import faults, stalls
from taskpilots.evidence.blackhole import BlackHoleProxy, database_address
from taskpilots.evidence.drill_chaos import OUTAGE_WINDOW_SECONDS, Chaos
from taskpilots.evidence.drill_report import compute_report
from taskpilots.evidence.workers import WorkerProcess, Workers
from taskpilots.sandbox.client import SandboxClient, SandboxError, start_sandbox

KINDS = (
    "interrupt_before",  # the call times out before the system commits
    "half_success",  # the write lands, the caller gets an error (lookup, or a person decides)
    "disconnect",  # the connection is reset mid-request
    "duplicate_trigger",  # the same run started twice, its message delivered three times
    "outage_long",  # the system is down longer than the wait window: escalate, then retry
    "worker_kill",  # a worker is SIGKILLed in the middle of a call
    "restart_waiting",  # every worker restarts while runs wait for a callback
    "approval_delayed",  # an approval is given later, and the run resumes from it
    "local_record_failed",  # the side effect is done but the worker dies before recording it
    "zombie",  # a worker is SIGSTOPped mid-step past its lease, then SIGCONTed
    "partition",  # a worker's PostgreSQL connection is black-holed mid-step, then healed or cut
    "degrade_write",  # the write tool is down and a rule degrades: its fallback writes, once
    "changed_result",  # a recovered refund is found by key with another amount: a person confirms
    "external_mismatch",  # a committed mail changes out there: the consistency check finds it
)
DRILL_WORKFLOWS = ("drill.support.reply", "drill.refund.approval", "drill.crm.lead_sync")
LEASE_SECONDS = 2
# A drill run takes a few seconds of waiting (its faults' timeouts, the outage window, the
# lease); a batch's settling time grows with the runs each worker thread carries.
BATCH_SECONDS_PER_RUN = 3.0
# What the drill's workers run with (short, so that faults show within seconds); overridden by
# DrillConfig.worker_env (`drill --worker-env NAME=VALUE`), e.g. to try an engine's heartbeat
# settings. Everything else the workers inherit from the drill's environment.
WORKER_ENV = {
    "TASKPILOTS_LEASE_SECONDS": str(LEASE_SECONDS),
    "TASKPILOTS_TOOL_TIMEOUT_SECONDS": "1",
    "TASKPILOTS_INLINE_BUDGET_SECONDS": "2",
}


@dataclass
class DrillConfig:
    runs: int = 18
    faults: tuple[str, ...] = KINDS
    seed: int = 1
    workers: int = 2
    # Threads per worker: 1 keeps each fault on one run at a time; more is how production runs
    # (a SIGKILL or a stall then hits every run the worker holds), and what a long soak needs.
    concurrency: int = 1
    # How long a batch may take to settle before its open runs count as lost: this much, plus
    # BATCH_SECONDS_PER_RUN for each run a worker thread has to carry.
    batch_timeout: float = 90.0
    progress: Callable[[str], None] | None = None
    # Chaos soak: while the drills run, SIGKILL workers, restart the broker and PostgreSQL, and
    # drop the simulated systems for longer than the wait window.
    chaos: bool = False
    chaos_interval: tuple[float, float] = (4.0, 9.0)
    # The simulated systems to use; None starts a sandbox of the drill's own, so the faults it
    # injects and clears never touch the sandbox of the install it runs beside.
    sandbox_url: str | None = None
    # Environment for the drill's workers, over WORKER_ENV.
    worker_env: dict[str, str] = field(default_factory=dict)


@dataclass
class Batch:
    kind: str
    run_ids: list = field(default_factory=list)
    started_at: datetime | None = None


def parse_faults(value: str) -> tuple[str, ...]:
    if value in ("all", ""):
        return KINDS
    kinds = tuple(part.strip() for part in value.split(",") if part.strip())
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise ValueError(f"unknown drill kinds {unknown}; choose from: {', '.join(KINDS)}, all")
    return kinds


class Drill(Chaos):
    def __init__(self, config: DrillConfig):
        self.config = config
        self.rng = random.Random(config.seed)
        self.tag = f"drill-{uuid.uuid4().hex[:8]}"
        self.batches: list[Batch] = []
        self._sandbox_process = None
        self._stop_chaos = threading.Event()
        self._chaos: threading.Thread | None = None
        self.chaos_log: list[dict] = []
        self._workers: Workers | None = None
        self._stop_sweeper = threading.Event()
        self._sweeper: threading.Thread | None = None
        self._rules: list[int] = []
        self._previous: dict[str, Any] = {}
        self.person = None
        # The zombie and partition drills (taskpilots/evidence/stalls.py): the folder the
        # workers' stall hooks and logs share with the drill, each stall, and the database
        # proxy of each worker while workers run through one (the partition drill, the soak).
        self.stall_folder: stalls.StallFolder | None = None
        self.episodes: list[stalls.Episode] = []
        self.proxies: dict[str, BlackHoleProxy] = {}
        self._proxied = False
        # While a stall batch runs: the environment its workers need (replacements too), and
        # the process group of the worker stalled right now (the soak leaves it alone).
        self._batch_env: dict[str, str] = {}
        self.stalled_pgid: int | None = None
        self.worker_env = {**WORKER_ENV, **config.worker_env}
        self.lease_seconds = float(self.worker_env["TASKPILOTS_LEASE_SECONDS"])

    # -- environment ---------------------------------------------------------------------------
    def say(self, message: str) -> None:
        if self.config.progress:
            self.config.progress(message)

    def __enter__(self) -> Drill:
        self._previous = {
            "sandbox": settings.TASKPILOTS["SANDBOX_URL"],
            "dispatch": settings.TASKPILOTS["DISPATCH"],
            "queue": celery_app.conf.task_default_queue,
        }
        if self.config.chaos or not self.config.sandbox_url:
            # Its own sandbox: the chaos soak stops and restarts it, and the drill's faults must
            # never reach the sandbox of an install (its seeded outage, its ledger).
            self.say("starting the simulated external systems (sandbox)")
            self._sandbox_process = start_sandbox()
            settings.TASKPILOTS["SANDBOX_URL"] = self._sandbox_process.url
            self.sandbox = self._sandbox_process.client
        else:
            settings.TASKPILOTS["SANDBOX_URL"] = self.config.sandbox_url
            self.sandbox = SandboxClient(self.config.sandbox_url, timeout=5)
        self.sandbox.clear_faults()
        self._install_rules()
        self.person, _ = get_user_model().objects.get_or_create(
            username="drill-operator", defaults={"email": "drill@example.com"}
        )
        # Human actions check the acting user's role like the console does.
        self.person.groups.add(Group.objects.get_or_create(name="support")[0])
        self.stall_folder = stalls.StallFolder()
        self._workers = Workers(
            f"tp-{self.tag}",
            {**self.worker_env, faults.STALL_DIR: str(self.stall_folder.path)},
        )
        celery_app.conf.task_default_queue = self._workers.queue
        settings.TASKPILOTS["DISPATCH"] = "celery"
        # The soak black-holes a worker's database now and then: every worker runs through a
        # proxy of its own there.
        self._proxied = self.config.chaos
        self.say(f"starting {self.config.workers} Celery workers on queue {self._workers.queue}")
        for _ in range(self.config.workers):
            self._start_worker()
        self._sweeper = threading.Thread(target=self._sweep_loop, daemon=True, name="sweeper")
        self._sweeper.start()
        if self.config.chaos:
            self._chaos = threading.Thread(target=self._chaos_loop, daemon=True, name="chaos")
            self._chaos.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop_chaos.set()
        if self._chaos:
            self._chaos.join(120)
        self._stop_sweeper.set()
        if self._sweeper:
            self._sweeper.join(5)
        if self._workers:
            self._continue_stopped_workers()
            self._workers.close()
            self._workers.delete_queue()
        for proxy in self.proxies.values():
            proxy.close()
        if self.stall_folder is not None:
            self.stall_folder.close()
        close_old_connections()
        self._survive(lambda: EscalationRule.objects.filter(pk__in=self._rules).delete())
        with contextlib.suppress(Exception):
            self.sandbox.clear_faults()
        if self._sandbox_process is not None:
            self._sandbox_process.close()
        settings.TASKPILOTS["SANDBOX_URL"] = self._previous["sandbox"]
        settings.TASKPILOTS["DISPATCH"] = self._previous["dispatch"]
        celery_app.conf.task_default_queue = self._previous["queue"]

    def _sandbox_up(self) -> bool:
        try:
            return self.sandbox.health()
        except Exception:
            return False

    def _install_rules(self) -> None:
        # Fast retries and a short outage window for the drill copies of the workflows only.
        for workflow in DRILL_WORKFLOWS:
            for failure_class, action, extra in (
                (
                    "transient",
                    "retry",
                    {"max_attempts": 8, "backoff_base_seconds": 0.1, "backoff_cap_seconds": 0.5},
                ),
                (
                    "outage",
                    "wait",
                    {"wait_window_seconds": OUTAGE_WINDOW_SECONDS, "probe_interval_seconds": 1},
                ),
            ):
                rule = EscalationRule.objects.create(
                    position=0,
                    name=f"{self.tag}: {failure_class} in {workflow}",
                    workflow=workflow,
                    failure_class=failure_class,
                    action=action,
                    queue="ops",
                    **extra,
                )
                self._rules.append(rule.pk)

    def _sweep_loop(self) -> None:
        while not self._stop_sweeper.wait(1.0):
            try:
                engine.sweep()
            except Exception as exc:  # keep sweeping: a failed pass is retried next time
                self.say(f"sweeper pass failed: {exc}")
            finally:
                close_old_connections()
        connections.close_all()

    def _restart_workers(self, **env: str) -> None:
        for worker in self._workers.alive:
            worker.kill()
        self._close_dead_proxies()
        for _ in range(self.config.workers):
            # Under chaos the broker may be restarting: a worker comes up when it can.
            self._start_worker(wait=not self.config.chaos, **env)

    def _replace_dead_workers(self) -> None:
        dead = len(self._workers.started) - len(self._workers.alive)
        if dead and len(self._workers.alive) < self.config.workers:
            self._close_dead_proxies()
            for _ in range(self.config.workers - len(self._workers.alive)):
                self._start_worker(wait=not self.config.chaos)

    def _start_worker(self, wait: bool = True, **env: str) -> WorkerProcess:
        """A worker; while workers run proxied, its database traffic goes through a black-hole
        proxy of its own (taskpilots/evidence/blackhole.py)."""
        env = {**self._batch_env, **env}
        if not self._proxied:
            return self._workers.start(concurrency=self.config.concurrency, wait=wait, **env)
        name = f"w{len(self._workers.started) + 1}-{uuid.uuid4().hex[:6]}"
        database = connections["default"].settings_dict
        proxy = BlackHoleProxy(database_address(database), name=name).start()
        self.proxies[name] = proxy
        db = {**database, "HOST": "127.0.0.1", "PORT": proxy.port}
        env = {
            "DATABASE_URL": format_database_url(db),
            faults.DB_PROXY: proxy.control_address,
            **env,
        }
        return self._workers.start(name=name, concurrency=self.config.concurrency, wait=wait, **env)

    def proxy_at(self, control_address: str) -> BlackHoleProxy | None:
        return next(
            (p for p in self.proxies.values() if p.control_address == control_address), None
        )

    def _close_dead_proxies(self) -> None:
        alive = {w.name for w in self._workers.alive}
        for name in [n for n in self.proxies if n not in alive]:
            self.proxies.pop(name).close()

    def _continue_stopped_workers(self) -> None:
        """Never leave a stopped process behind (a zombie stall, the soak's SIGSTOP)."""
        for worker in self._workers.alive:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(worker.process.pid, signal.SIGCONT)

    # -- running -------------------------------------------------------------------------------
    def run(self) -> dict:
        kinds = self.config.faults
        per_kind = max(1, math.ceil(self.config.runs / len(kinds)))
        remaining = self.config.runs
        started = time.monotonic()
        for index, kind in enumerate(kinds):
            count = min(per_kind, remaining - (len(kinds) - index - 1))
            count = max(count, 1)
            remaining -= count
            batch = Batch(kind, started_at=timezone.now())
            self.batches.append(batch)
            self.say(f"[{index + 1}/{len(kinds)}] {kind}: {count} runs")
            self._survive(getattr(self, f"_drill_{kind}"), batch, count)
            self._finish(batch)
            self._survive(self.sandbox.clear_faults)
            self.say(f"    {kind}: {self._survive(self._batch_line, batch)}")
        if self.config.chaos:
            self._stop_chaos.set()
            self._chaos.join(120)
            self.say("chaos over: letting every run come to rest")
            for batch in self.batches:
                self._finish(batch)
        report = self._survive(
            compute_report,
            self.all_run_ids(),
            self.sandbox,
            self.batches,
            episodes=self.episodes,
            stall_folder=self.stall_folder,
        )
        if self.config.chaos:
            report["chaos"] = self.chaos_log
        report["elapsed_s"] = round(time.monotonic() - started, 1)
        return report

    def all_run_ids(self) -> list:
        return [run_id for batch in self.batches for run_id in batch.run_ids]

    def _batch_line(self, batch: Batch) -> str:
        counts = Counter(Run.objects.filter(pk__in=batch.run_ids).values_list("status", flat=True))
        return ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))

    def _start(self, batch: Batch, workflow: str, input: dict, *, key: str | None = None) -> Run:
        key = key or f"{self.tag}-{batch.kind}-{len(batch.run_ids)}"
        run, created = self._survive(
            engine.start_run,
            f"drill.{workflow}",
            input,
            business_key=key,
            principal="agent:drill",
            session_context_ref=f"{self.tag}/{batch.kind}",
        )
        if created:
            batch.run_ids.append(run.pk)
        return run

    def _reply_input(self, n: int) -> dict:
        # The same for the same n: a batch started again after a restart (_survive) starts the
        # same runs, and a business key used before finds its run instead of a conflict.
        topics = ["I want a refund", "Where is my package?", "password reset"]
        topic = random.Random(self.config.seed * 1_000_003 + n).choice(topics)
        return {
            "message": topic,
            "email": f"customer{n}@example.com",
            "ticket_id": f"T-{n}",
            "subject": topic,
        }

    def _refund_input(self, n: int, amount: float) -> dict:
        return {"payment_id": f"pay_{self.tag}_{n}", "amount": amount}

    def _lead_input(self, n: int) -> dict:
        return {
            "email": f"lead{n}.{self.tag}@example.com",
            "name": f"Lead {n}",
            "company": self.rng.choice(["Acme", "Globex", "Initech"]),
            "employees": self.rng.choice([20, 800]),
        }

    # The drill kinds -----------------------------------------------------------------------
    def _drill_interrupt_before(self, batch: Batch, count: int) -> None:
        self.sandbox.inject("mail", "timeout_before_commit", action="send", count=count, seconds=2)
        for n in range(count):
            self._start(batch, "support.reply", self._reply_input(n))

    def _drill_half_success(self, batch: Batch, count: int) -> None:
        crm = max(1, count // 3)
        mail = count - crm
        self.sandbox.inject("mail", "commit_then_500", action="send", count=max(mail, 1))
        self.sandbox.inject("crm", "commit_then_500", action="create", count=crm)
        for n in range(mail):
            self._start(batch, "support.reply", self._reply_input(100 + n))
        for n in range(crm):
            self._start(batch, "crm.lead_sync", self._lead_input(n))

    def _drill_disconnect(self, batch: Batch, count: int) -> None:
        self.sandbox.inject("tickets", "reset", action="update", count=count)
        for n in range(count):
            self._start(batch, "support.reply", self._reply_input(200 + n))

    def _drill_duplicate_trigger(self, batch: Batch, count: int) -> None:
        from runs.tasks import advance_run

        self.sandbox.inject("mail", "latency", action="send", count=count, latency_ms=300)
        for n in range(count):
            key = f"{self.tag}-dup-{n}"
            run = self._start(batch, "support.reply", self._reply_input(300 + n), key=key)
            again = self._start(batch, "support.reply", run.input, key=key)
            assert again.pk == run.pk
            for _ in range(3):
                self._survive(advance_run.delay, str(run.pk))

    def _drill_outage_long(self, batch: Batch, count: int) -> None:
        self.sandbox.inject("payments", "outage", seconds=OUTAGE_WINDOW_SECONDS + 3)
        for n in range(count):
            self._start(batch, "refund.approval", self._refund_input(n, 20 + n))

    def _drill_worker_kill(self, batch: Batch, count: int) -> None:
        self.sandbox.inject("mail", "latency", action="send", count=count, latency_ms=1200)
        for n in range(count):
            self._start(batch, "support.reply", self._reply_input(400 + n))
        self._wait(
            lambda: SideEffect.objects.filter(
                run_id__in=batch.run_ids, tool="mail.send", status="intended"
            ).exists(),
            what="a mail call in flight",
        )
        self.say("    SIGKILL every worker mid-call, then start new ones")
        self._restart_workers()

    def _drill_restart_waiting(self, batch: Batch, count: int) -> None:
        for n in range(count):
            self._start(batch, "refund.approval", self._refund_input(500 + n, 30))
        self._wait(lambda: self._all_waiting(batch), what="runs waiting for settlement")
        self.say("    restart every worker while the runs wait for their callback")
        self._restart_workers()

    def _drill_approval_delayed(self, batch: Batch, count: int) -> None:
        for n in range(count):
            self._start(batch, "refund.approval", self._refund_input(600 + n, 150 + n))
        self._wait(
            lambda: (
                ApprovalRequest.objects.filter(run_id__in=batch.run_ids, status="pending").count()
                == count
            ),
            what="approvals to be requested",
        )
        time.sleep(0.5)  # "later": the run sits parked with no worker holding anything
        for index, approval in enumerate(
            ApprovalRequest.objects.filter(run_id__in=batch.run_ids, status="pending")
        ):
            if index % 2:
                edited = {**approval.proposed_params, "amount": 99.0}
                actions.decide_approval(
                    approval.pk,
                    self.person,
                    "approved_with_edits",
                    edited_params=edited,
                    comment="partial refund",
                )
            else:
                actions.decide_approval(approval.pk, self.person, "approved")

    def _drill_local_record_failed(self, batch: Batch, count: int) -> None:
        self.say("    workers that die right after the mail system commits")
        self._restart_workers(TASKPILOTS_CHAOS_CRASH_AFTER_CALL="mail.send")
        for n in range(count):
            self._start(batch, "support.reply", self._reply_input(700 + n))
        # Every mail call lands and its worker process dies before recording it (prefork
        # replaces the child; the message is redelivered; the lease and the settle window run
        # out; the next claim asks the mail system by key).
        self._wait(
            lambda: all(self.sandbox.ledger(system="mail", run=str(r)) for r in batch.run_ids),
            what="every mail to land",
            timeout=self._batch_timeout(batch),
        )
        # Back to ordinary workers: they must reconcile what the chaos ones left behind.
        self._restart_workers()

    def _drill_changed_result(self, batch: Batch, count: int) -> None:
        # The refund lands, its answer is lost and the lookup cannot answer at first; meanwhile
        # the record under the key gets another amount. The person accepts what the bank says.
        self.sandbox.inject("payments", "commit_then_500", action="refund", count=count)
        self.sandbox.inject("payments", "503", action="by-key", count=4 * count)
        for n in range(count):
            self._start(batch, "refund.approval", self._refund_input(800 + n, 20.0))

        def landed():
            return [self.sandbox.ledger(system="payments", run=str(r)) for r in batch.run_ids]

        # Under the chaos soak a refund may still be on its way when the wait gives up: only
        # the ones that landed get their record changed (the run's end is checked either way).
        self._wait(
            lambda: all(landed()), what="every refund to land", timeout=self._batch_timeout(batch)
        )
        for [record, *_] in filter(None, landed()):
            changed = {**record["response"], "amount": record["response"]["amount"] + 1}
            self.sandbox.alter("payments", record["idempotency_key"], response=changed)

    def _drill_external_mismatch(self, batch: Batch, count: int) -> None:
        from runs.engine.consistency import check_consistency

        for n in range(count):
            self._start(batch, "support.reply", self._reply_input(900 + n))
        self._wait(
            lambda: self._settled(batch),
            what="the replies to finish",
            timeout=self._batch_timeout(batch),
        )
        mail = SideEffect.objects.filter(run_id=batch.run_ids[0], tool="mail.send").first()
        if mail is not None and mail.status == SideEffect.Status.COMMITTED:
            # Planted: the provider now says the mail bounced (same id, so the drill's own
            # ledger check, which compares ids, does not see it; the consistency check does).
            bounced = {**mail.receipt.get("response", {}), "status": "bounced"}
            self.sandbox.alter("mail", mail.idempotency_key, response=bounced)
        for _ in range(2):  # the second pass must not count it again
            check_consistency(since=batch.started_at)

    def _drill_zombie(self, batch: Batch, count: int) -> None:
        # One stall at a time: a worker SIGSTOPped at the next moment of a mail step, kept
        # stopped until another worker took the step back, then SIGCONTed.
        self._stalls("zombie", batch, count)

    def _drill_partition(self, batch: Batch, count: int) -> None:
        # Every worker behind a black-hole proxy of its own; one stall at a time: the worker's
        # database black-holed at the next moment of a mail step past its lease, then healed or
        # cut.
        self._stalls("partition", batch, count)

    def _drill_degrade_write(self, batch: Batch, count: int) -> None:
        rule = EscalationRule.objects.create(
            position=0,
            name=f"{self.tag}: degrade the relay",
            workflow="drill.mail.degrade",
            tool="mail.relay_down",
            action="degrade",
            queue="ops",
        )
        self._rules.append(rule.pk)
        for n in range(count):
            self._start(batch, "mail.degrade", {"email": f"customer{600 + n}@example.com"})

    def _stalls(self, kind: str, batch: Batch, count: int) -> None:
        """Workers for the stalls (on the engine's ordinary path, where the claim, the intent,
        the call and the record are separate commits, unless --worker-env says which path;
        behind proxies for a partition), the stalls, then the usual workers again."""
        env = {} if "TASKPILOTS_HOT_PATH" in self.worker_env else {"TASKPILOTS_HOT_PATH": "0"}
        hot_path = env_flag(self.worker_env.get("TASKPILOTS_HOT_PATH", "0"))
        proxied = kind == "partition" and not self._proxied
        if env or proxied:
            self.say(
                "    workers on the engine's "
                + ("hot" if hot_path else "ordinary")
                + " path"
                + (", their PostgreSQL behind black-hole proxies" if kind == "partition" else "")
            )
            self._proxied = self._proxied or proxied
            self._batch_env = env
            self._restart_workers()
        try:
            stalls.StallRunner(self, self.lease_seconds, hot_path=hot_path).run(kind, batch, count)
        finally:
            if env or proxied:
                self._finish(batch)  # settle on these workers before they go
                self._proxied = self.config.chaos
                self._batch_env = {}
                self._restart_workers()

    # -- settling ------------------------------------------------------------------------------
    def _all_waiting(self, batch: Batch) -> bool:
        return Run.objects.filter(pk__in=batch.run_ids).exclude(status="waiting").count() == 0

    def _wait(self, predicate, *, what: str, timeout: float | None = None) -> None:
        deadline = time.monotonic() + (timeout or self.config.batch_timeout)
        while time.monotonic() < deadline:
            if self._survive(predicate):
                return
            time.sleep(0.1)
        self.say(f"    gave up waiting for {what}")

    def _survive(self, fn, *args, **kwargs):
        """Call fn, riding out a database, broker or sandbox restart (the chaos soak's)."""
        deadline = time.monotonic() + 120
        while True:
            try:
                return fn(*args, **kwargs)
            except (
                OperationalError,
                InterfaceError,
                ConnectionError,
                OSError,
                SandboxError,
                kombu.exceptions.OperationalError,  # the broker restarting under a publish
            ) as exc:
                if time.monotonic() > deadline:
                    raise
                self.say(f"    waiting out: {type(exc).__name__}: {str(exc)[:120]}")
                close_old_connections()
                time.sleep(1.0)

    def _settled(self, batch: Batch) -> bool:
        open_runs = Run.objects.filter(pk__in=batch.run_ids).exclude(
            status__in=[*Run.TERMINAL, *Run.HUMAN]
        )
        return not open_runs.exclude(
            status="waiting", waits__kind="event", waits__status="pending"
        ).exists()

    def _batch_timeout(self, batch: Batch) -> float:
        slots = max(1, self.config.workers * self.config.concurrency)
        return self.config.batch_timeout + BATCH_SECONDS_PER_RUN * len(batch.run_ids) / slots

    def _finish(self, batch: Batch) -> None:
        """Deliver callbacks and play the person until every run of the batch is at rest."""
        deadline = time.monotonic() + self._batch_timeout(batch)
        while time.monotonic() < deadline:
            self._survive(self._replace_dead_workers)
            self._survive(self._deliver_settlements, batch)
            acted = self._survive(self._play_the_person, batch)
            if (
                not acted
                and self._survive(self._settled, batch)
                and not self._survive(self._waiting_for_events, batch)
            ):
                return
            time.sleep(0.2)
        self.say(f"    {batch.kind}: batch timed out; unsettled runs count as lost")

    def _waiting_for_events(self, batch: Batch) -> bool:
        return Wait.objects.filter(
            run_id__in=batch.run_ids, kind="event", status="pending"
        ).exists()

    def _deliver_settlements(self, batch: Batch) -> None:
        for wait in Wait.objects.filter(run_id__in=batch.run_ids, kind="event", status="pending"):
            engine.deliver_event(
                f"{self.tag}-settle-{wait.pk}",
                wait.event_type,
                wait.correlation_key,
                {"settled": True},
                source="drill",
            )

    def _play_the_person(self, batch: Batch) -> bool:
        """The person of the seeds, who only reads the snapshot: check the external system by
        the snapshot's idempotency key and confirm; retry an outage once the system is back."""
        acted = False
        for run in Run.objects.filter(pk__in=batch.run_ids, status="needs_human"):
            step = (
                Step.objects.filter(run=run, status__in=Step.UNFINISHED)
                .order_by("position")
                .first()
            )
            if step is None:
                continue
            try:
                if step.status == Step.Status.UNKNOWN_OUTCOME:
                    snapshot = Snapshot.objects.filter(step=step).order_by("-id").first()
                    entries = self.sandbox.ledger(key=snapshot.idempotency_key)
                    actions.confirm_outcome(
                        step.pk,
                        self.person,
                        happened=bool(entries),
                        proof=entries[0]["external_id"] if entries else "",
                        comment="checked the target system by idempotency key",
                    )
                    acted = True
                elif step.error_class == "outage" and (
                    batch.kind == "outage_long" or self.config.chaos
                ):
                    # Operations: once the system is back, retry what the outage escalated.
                    if not self._outage_over() or not self._sandbox_up():
                        acted = True  # not yet: the person waits for the system to come back
                        continue
                    actions.retry_step(run.pk, self.person, comment="the system is back")
                    acted = True
                elif step.kind == "approval":
                    approval = ApprovalRequest.objects.filter(step=step, status="pending").first()
                    if approval:
                        actions.decide_approval(approval.pk, self.person, "approved")
                        acted = True
            except (actions.DecisionConflict, actions.ActionRefused):
                continue
        return acted

    def _outage_over(self) -> bool:
        return not any(f["mode"] == "outage" for f in self.sandbox.faults())


def env_flag(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


def progress_to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)

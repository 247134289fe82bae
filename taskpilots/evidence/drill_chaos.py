"""The chaos soak's actions (`drill --chaos`): every few seconds one of them, at random, kills or
stops a worker, black-holes its database connections, restarts the broker or PostgreSQL, or
drops the sandbox, while the drill's runs go on. A mixin of taskpilots.evidence.drill.Drill,
which holds the workers, proxies, services and the chaos log these act on."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from urllib.parse import urlsplit

from django.conf import settings
from django.db import close_old_connections, connections

from taskpilots import embedded
from taskpilots.evidence.workers import WorkerProcess

# The outage window of the drill's rules (wait for the outage this long), and how long the chaos
# soak drops the simulated systems (a little longer).
OUTAGE_WINDOW_SECONDS = 2


class Chaos:
    """The chaos actions of a Drill (see the module docstring)."""

    def _chaos_loop(self) -> None:
        actions = [
            self._chaos_kill_worker,
            self._chaos_kill_worker,
            self._chaos_stop_worker,
            self._chaos_partition_worker,
            self._chaos_restart_broker,
            self._chaos_restart_postgres,
            self._chaos_drop_sandbox,
        ]
        while not self._stop_chaos.wait(self.rng.uniform(*self.config.chaos_interval)):
            action = self.rng.choice(actions)
            started = time.monotonic()
            try:
                what = action()
            except Exception as exc:  # the soak goes on; what failed is reported
                what = f"{action.__name__} failed: {exc}"
            finally:
                close_old_connections()
            if what:
                self.chaos_log.append(
                    {"action": what, "seconds": round(time.monotonic() - started, 2)}
                )
                self.say(f"    chaos: {what}")
        connections.close_all()

    def _chaos_kill_worker(self) -> str:
        alive = self._workers.alive
        if not alive:
            return ""
        victim = self.rng.choice(alive)
        victim.kill()
        self._start_worker(wait=False)  # no waiting on its start-up: the soak goes on
        return f"SIGKILL worker {victim.name}; started a replacement"

    def _chaos_victims(self) -> list[WorkerProcess]:
        """Workers the soak may fault now: not the one a stall holds."""
        return [w for w in self._workers.alive if w.process.pid != self.stalled_pgid]

    def _chaos_stop_worker(self) -> str:
        """A zombie: the whole worker stopped past its lease, then continued."""
        alive = self._chaos_victims()
        if not alive:
            return ""
        victim = self.rng.choice(alive)
        seconds = round(self.lease_seconds + self.rng.uniform(1, 3), 1)
        try:
            os.killpg(victim.process.pid, signal.SIGSTOP)
            self._stop_chaos.wait(seconds)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(victim.process.pid, signal.SIGCONT)
        return f"SIGSTOP worker {victim.name} for {seconds} s, then SIGCONT"

    def _chaos_partition_worker(self) -> str:
        """A partition: one worker's PostgreSQL connections black-holed past its lease."""
        candidates = [w for w in self._chaos_victims() if w.name in self.proxies]
        if not candidates:
            return ""
        victim = self.rng.choice(candidates)
        proxy = self.proxies[victim.name]
        seconds = round(self.lease_seconds + self.rng.uniform(1, 3), 1)
        end = self.rng.choice(("heal", "cut"))
        proxy.hole()
        try:
            self._stop_chaos.wait(seconds)
        finally:
            if end == "heal":
                proxy.heal()
            else:
                proxy.cut()
        return f"black-holed worker {victim.name}'s database for {seconds} s, then {end}"

    def _chaos_restart_broker(self) -> str:
        broker = settings.CELERY_BROKER_URL
        if broker.startswith(("redis://", "rediss://")):
            port = urlsplit(broker).port or 6379
            _run(["redis-cli", "-u", broker, "shutdown", "nosave"], check=False)
            _run(
                [
                    "redis-server",
                    "--daemonize",
                    "yes",
                    "--bind",
                    "127.0.0.1",
                    "-::1",
                    "--port",
                    str(port),
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    "/var/lib/redis",
                    "--logfile",
                    "/var/log/redis/ci.log" if port == 6379 else f"/var/log/redis/drill-{port}.log",
                ]
            )
            _wait_port(port)
            return "restarted Redis (the broker)"
        if broker.startswith(("amqp://", "pyamqp://")):
            _run(["rabbitmqctl", "-q", "stop_app"])
            _run(["rabbitmqctl", "-q", "start_app"])
            _wait_port(5672)
            return "restarted RabbitMQ (the broker)"
        return ""

    def _chaos_restart_postgres(self) -> str:
        db = connections["default"].settings_dict
        server = embedded.status(settings.VAR_DIR)
        if server is not None and db["HOST"] == str(server.socket_dir):
            # The embedded PostgreSQL (nothing configured): a fast stop, then the same start
            # make run does. Open transactions roll back, as with a restarted cluster.
            connections.close_all()
            embedded.stop(settings.VAR_DIR)
            embedded.ensure_running(settings.VAR_DIR)
            return "restarted the embedded PostgreSQL"
        port = int(db["PORT"] or 5432)
        cluster = _local_cluster(port) if db["HOST"] in ("127.0.0.1", "localhost", "") else None
        if cluster is None:
            return ""
        connections.close_all()
        _run(["pg_ctlcluster", "--skip-systemctl-redirect", *cluster, "restart", "-m", "fast"])
        _wait_port(port)
        return f"restarted PostgreSQL (cluster {'/'.join(cluster)})"

    def _chaos_drop_sandbox(self) -> str:
        if self._sandbox_process is None:
            return ""
        self._sandbox_process.stop()
        self._stop_chaos.wait(OUTAGE_WINDOW_SECONDS + 2)
        self._sandbox_process.start()
        return f"dropped the simulated systems for {OUTAGE_WINDOW_SECONDS + 2} s"


def _local_cluster(port: int) -> tuple[str, str] | None:
    """The Debian cluster (version, name) that listens on this port, from pg_lsclusters; None
    where there is no such tool or no such cluster (the drill then leaves PostgreSQL alone)."""
    try:
        listing = subprocess.run(
            ["pg_lsclusters", "--no-header"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in listing.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[2] == str(port):
            return fields[0], fields[1]
    return None


def _run(args: list[str], check: bool = True) -> None:
    subprocess.run(args, check=check, capture_output=True, timeout=120)


def _wait_port(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            sock.settimeout(0.5)
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.3)
    raise RuntimeError(f"nothing listens on port {port} after {timeout} s")

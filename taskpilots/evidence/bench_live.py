"""`manage.py bench inbox [--consoles 50] [--seconds 20] [--runs N]`: what N open inboxes cost.

In a scratch database (`<configured>_live`, dropped afterwards) it loads N fake runs, starts
gunicorn as `make run` does (bench_console.gunicorn: 2 sync workers, a query-count header),
logs `--consoles` sessions in and measures twice for `--seconds` each:

1. idle: nobody polls; what the database does anyway (autovacuum, the stats collector);
2. polling: after each console's first poll (a 200 and its ETag, untimed), each polls the
   inbox's live fragment every 5 s, as templates/console/inbox.html does, sending back the ETag
   (as the browser's cache does), staggered over the 5 s.

For each phase it reads this database's pg_stat_database counters (transactions, tuples
returned and fetched, buffer reads) and the CPU time of the backends connected to this database
(/proc, when PostgreSQL runs on this machine). Ends with one JSON line: requests/s, p50/p95 ms,
the answers (304 / 200), queries per unchanged poll, and the phases' deltas.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from django.db import connection

from runs.models import Run
from taskpilots.evidence import scratch
from taskpilots.evidence.bench import percentile
from taskpilots.evidence.bench_console import _request, bench_user, gunicorn, load, log_in
from taskpilots.evidence.querycount import HEADER

Say = Callable[[str], None]
POLL_SECONDS = 5.0  # templates/console/inbox.html: hx-trigger="every 5s"
PATH = "/console/live/inbox/"
COUNTERS = ("xact_commit", "tup_returned", "tup_fetched", "blks_hit", "blks_read")


def run_in_scratch_database(argv: list[str], say: Say) -> int:
    with scratch.scratch_database("live", say) as url:
        return scratch.run_here("bench", argv, url)


def _pg_counters() -> dict[str, int]:
    time.sleep(1.2)  # backends flush their statistics about once a second
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            f"SELECT {', '.join(COUNTERS)} FROM pg_stat_database WHERE datname = current_database()"
        )
        return dict(zip(COUNTERS, cursor.fetchone(), strict=True))


def _backend_cpu() -> dict[int, float]:
    """CPU seconds (utime + stime, /proc) of each backend connected to this database: the web
    workers keep theirs (CONN_MAX_AGE). Empty where /proc cannot tell (another machine)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid()"
        )
        pids = [row[0] for row in cursor.fetchall()]
    ticks, found = os.sysconf("SC_CLK_TCK"), {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        found[pid] = (int(fields[11]) + int(fields[12])) / ticks
    return found


def _phase(seconds: float, work: Callable[[float], None]) -> dict:
    before, cpu_before = _pg_counters(), _backend_cpu()
    work(time.monotonic() + seconds)
    after, cpu_after = _pg_counters(), _backend_cpu()
    deltas = {name: after[name] - before[name] for name in COUNTERS}
    # Less this process's own two reads of the counters (and their clear_snapshot).
    deltas["xact_commit"] = max(0, deltas["xact_commit"] - 2)
    cpu = sum(now - cpu_before.get(pid, 0.0) for pid, now in cpu_after.items())
    return {"seconds": seconds, "pg": deltas, "backend_cpu_s": round(cpu, 2)}


def stamp_ms(samples: int = 20) -> float:
    """The inbox stamp's execution time in PostgreSQL (EXPLAIN ANALYZE), the median of `samples`."""
    from approvals.live import _INBOX_STAMP, _sql

    times = []
    with connection.cursor() as cursor:
        for _ in range(samples):
            cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + _sql(_INBOX_STAMP))
            times.append(cursor.fetchone()[0][0]["Execution Time"])
    return round(percentile(times, 50), 3)


class _Console(threading.Thread):
    """One open inbox: poll every POLL_SECONDS until `deadline`, with If-None-Match."""

    def __init__(self, port, cookies: dict, etag: str, offset: float, deadline: float, lock, out):
        super().__init__(daemon=True)
        self.port, self.cookies, self.etag = port, cookies, etag
        self.offset, self.deadline, self.lock, self.out = offset, deadline, lock, out

    def run(self) -> None:
        etag, next_at = self.etag, time.monotonic() + self.offset
        while next_at < self.deadline:
            time.sleep(max(0.0, next_at - time.monotonic()))
            headers = {"HX-Request": "true", "HX-Target": "inbox-live"}
            if etag:
                headers["If-None-Match"] = etag
            started = time.perf_counter()
            status, _body, answer = _request(self.port, "GET", PATH, self.cookies, headers=headers)
            elapsed = (time.perf_counter() - started) * 1000
            etag = answer.get("ETag", etag)
            with self.lock:
                self.out.append((status, elapsed, int(answer.get(HEADER, -1))))
            next_at += POLL_SECONDS


def _p95(polls, status: int) -> float | None:
    times = [elapsed for answer, elapsed, _q in polls if answer == status]
    return round(percentile(times, 95), 1) if times else None


def bench_inbox(
    runs: int, consoles: int, seconds: float, say: Say, *, workers: int = 2, vacuum: bool = True
) -> dict:
    load(runs, say, vacuum=vacuum)
    bench_user()
    waiting = Run.objects.filter(status__in=Run.HUMAN).count()
    say(f"{Run.objects.count()} runs, {waiting} waiting for a person (the inbox)")
    with gunicorn(workers, say) as port:
        say(f"logging {consoles} consoles in")
        sessions = [log_in(port) for _ in range(consoles)]
        say("each console's first poll (a 200 and its ETag), untimed")
        headers = {"HX-Request": "true", "HX-Target": "inbox-live"}
        first = [_request(port, "GET", PATH, cookies, headers=headers) for cookies in sessions]
        if any(status != 200 for status, _b, _h in first):
            raise RuntimeError(f"first polls answered {sorted({s for s, _b, _h in first})}")
        etags = [answer["ETag"] for _status, _body, answer in first]
        say(f"idle for {seconds:.0f} s (nobody polls)")
        idle = _phase(seconds, lambda deadline: time.sleep(max(0, deadline - time.monotonic())))
        say(f"idle: {idle}")
        polls: list[tuple[int, float, int]] = []
        lock = threading.Lock()

        def poll(deadline: float) -> None:
            threads = [
                _Console(port, cookies, etag, i * POLL_SECONDS / consoles, deadline, lock, polls)
                for i, (cookies, etag) in enumerate(zip(sessions, etags, strict=True))
            ]
            for thread in threads:
                thread.start()
            while any(t.is_alive() for t in threads):
                time.sleep(min(5.0, max(0.1, deadline - time.monotonic())))
                say(f"  {len(polls)} polls so far")
            for thread in threads:
                thread.join()

        say(f"{consoles} consoles polling every {POLL_SECONDS:.0f} s for {seconds:.0f} s")
        polling = _phase(seconds, poll)
        say(f"polling: {polling}")
    times = [elapsed for _status, elapsed, _q in polls]
    unchanged = [q for status, _e, q in polls if status == 304]
    return {
        "benchmark": "inbox",
        "runs": runs,
        "consoles": consoles,
        "seconds": seconds,
        "requests": len(polls),
        "requests_per_s": round(len(polls) / seconds, 1),
        "p50_ms": round(percentile(times, 50) or 0, 1),
        "p95_ms": round(percentile(times, 95) or 0, 1),
        # Unchanged polls, and the renders (the once-a-minute refresh, or a change).
        "p95_ms_304": _p95(polls, 304),
        "p95_ms_200": _p95(polls, 200),
        "answers": {
            str(s): sum(1 for st, _e, _q in polls if st == s) for s in {p[0] for p in polls}
        },
        "queries_per_unchanged_poll": max(unchanged) if unchanged else None,
        "waiting_runs": waiting,
        "stamp_query_ms": stamp_ms(),
        "idle": idle,
        "polling": polling,
        "pg_xacts_per_poll": round(
            (polling["pg"]["xact_commit"] - idle["pg"]["xact_commit"]) / max(1, len(polls)), 2
        ),
    }

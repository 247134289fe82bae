"""`manage.py bench console [--runs N]`: every console page, timed through gunicorn at N runs.

In a scratch database (`<configured>_console`, dropped afterwards) it loads N fake runs with
`load_fake_runs` and stores their metrics rows (the rollup beat runs in production), starts
gunicorn as `make run` does (2 sync workers, the web process's settings: JIT off) with a
response header that counts each request's queries, logs in as a user with every role, and
requests each page `requests` times after warming it up. It prints progress on stderr and ends
with one JSON line: per page its p50 and p95 in ms (client side: the whole HTTP request), its
query count, and the pages over the 100 ms budget.

The times vary with the machine; the query counts do not (`tests/approvals` guards them on small
data: a page costs the same queries at 30 runs as at 300).
"""

from __future__ import annotations

import http.client
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.cookies import SimpleCookie
from urllib.parse import urlencode

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from approvals import paging
from approvals.models import EscalationRule
from runs.models import Run, TimelineEvent
from taskpilots.evidence import scratch
from taskpilots.evidence.bench import percentile
from taskpilots.evidence.loadgen import load_fake_runs
from taskpilots.evidence.querycount import HEADER
from taskpilots.evidence.workers import ROOT, database_url

Say = Callable[[str], None]
BUDGET_MS = 100.0
USERNAME = "bench.console"
PASSWORD = "bench-console-password-1"  # a throwaway user in a throwaway database
# Untimed requests first, so that each gunicorn worker has served the page once or more.
WARMUP = 5


@dataclass(frozen=True)
class Page:
    name: str
    path: str


def run_in_scratch_database(argv: list[str], say: Say) -> int:
    """`manage.py bench console ... --here` against a scratch database of its own (not the other
    benchmarks' `_bench`, which may be in use at the same time)."""
    with scratch.scratch_database("console", say) as url:
        return scratch.run_here("bench", argv, url)


# --------------------------------------------------------------------------------------------
# The data


def load(runs: int, say: Say, *, vacuum: bool = True) -> None:
    """Top the database up to `runs` runs, and store their metrics rows."""
    missing = runs - Run.objects.count()
    if missing > 0:
        say(f"loading {missing} fake runs (load_fake_runs)")
        started = time.monotonic()
        load_fake_runs(missing, batch_size=5000, progress=say)
        say(f"loaded in {time.monotonic() - started:.0f} s; storing their metrics rows")
        call_command("rollup_metrics", "--full", stdout=_Discard(), stderr=_Discard())
    # As a database in service is: vacuumed (the visibility map lets index-only scans skip
    # the heap) and analysed.
    if vacuum:
        say("VACUUM ANALYZE")
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE")


class _Discard:
    def write(self, *_args) -> None:
        pass

    def flush(self) -> None:
        pass


def bench_user() -> None:
    """A user with every console role (support, auditor, admin)."""
    user, _created = get_user_model().objects.get_or_create(username=USERNAME)
    user.set_password(PASSWORD)
    user.save()
    user.groups.set(
        Group.objects.get_or_create(name=name)[0] for name in ("support", "auditor", "admin")
    )


def pages() -> list[Page]:
    """Every console page, with its deepest page and its emptiest filter: the paths to time."""
    paused = Run.objects.filter(status=Run.Status.NEEDS_HUMAN).order_by("-created_at").first()
    paused = paused or Run.objects.order_by("-created_at").first()
    longest = (
        TimelineEvent.objects.filter(seq__gte=20).order_by("-seq").values_list("run_id", flat=True)
    ).first() or paused.pk
    second_page = Run.objects.order_by("-created_at", "-id")[paging.PAGE_SIZE - 1]
    humans = Run.objects.filter(status__in=Run.HUMAN).count()
    inbox_last = max(1, -(-humans // paging.PAGE_SIZE))
    rule = EscalationRule.objects.order_by("position", "id").first()
    run, timeline = f"/console/runs/{paused.pk}/", f"/console/runs/{longest}/timeline/"
    audit = "/console/audit/"
    refunds = {"workflow": "refund.approval", "outcome": "approved"}
    by_user = {"actor": "mei.support", "outcome": "human_decision"}
    listed = [
        ("inbox", "/console/"),
        ("inbox, reason approval", "/console/?reason=approval"),
        ("inbox, mine", "/console/?owner=mine"),
        ("inbox, last page", f"/console/?page={inbox_last}"),
        ("all runs", "/console/runs/"),
        ("all runs, second page", f"/console/runs/?after={paging.Position.of(second_page)}"),
        ("all runs, last page", "/console/runs/?last=1"),
        ("all runs, failed, last page", "/console/runs/?status=failed&last=1"),
        ("all runs, by run id", f"/console/runs/?q={paused.pk}"),
        ("run detail", run),
        ("run detail, events", f"{run}?tab=events"),
        ("run detail, rehydration", f"{run}?tab=rehydration"),
        ("timeline", timeline),
        ("audit search", audit),
        ("audit search, last page", f"{audit}?last=1"),
        ("audit, refunds approved", f"{audit}?{urlencode(refunds)}"),
        ("audit, refunds approved, last page", f"{audit}?{urlencode({**refunds, 'last': 1})}"),
        ("audit, a user's decisions, last page", f"{audit}?{urlencode({**by_user, 'last': 1})}"),
        ("audit, tool and target, last page", f"{audit}?tool=payments.refund&target=pay&last=1"),
        ("audit, a filter matching nothing", f"{audit}?actor=nobody-at-all"),
        ("metrics, 24 h", "/console/metrics/?window=24h"),
        ("metrics, 7 d", "/console/metrics/"),
        ("metrics, 30 d", "/console/metrics/?window=30d"),
        ("metrics.json, 30 d", "/console/metrics.json?window=30d"),
        ("/metrics", "/metrics"),
        ("rules", "/console/rules/"),
        ("rules, tester", "/console/rules/?tool=payments.refund&failure_class=outage"),
        ("rule form", f"/console/rules/{rule.pk}/" if rule else "/console/rules/new/"),
        ("tools", "/console/rules/tools/"),
        ("channels", "/console/rules/channels/"),
    ]
    return [Page(name, path) for name, path in listed]


# --------------------------------------------------------------------------------------------
# The web process


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def gunicorn(workers: int, say: Say) -> Iterator[int]:
    """gunicorn as `make run` starts it (taskpilots/devrun.py), on a free port; yields the port."""
    port = _free_port()
    # As the scratch database's commands run (scratch.scratch_env): plain HTTP on localhost
    # (no redirect to HTTPS, no Secure cookies) and static files without collectstatic.
    env = {**os.environ, "TASKPILOTS_BENCH_QUERY_HEADER": "1", "TASKPILOTS_TESTING": "1"}
    env["DATABASE_URL"] = database_url()  # the database this process loaded (a test's too)
    command = [sys.executable, "-m", "gunicorn", "taskpilots.wsgi"]
    command += ["--config", "python:taskpilots.gunicorn_conf", "--bind", f"127.0.0.1:{port}"]
    command += ["--workers", str(workers), "--no-control-socket", "--log-level", "warning"]
    process = subprocess.Popen(command, cwd=ROOT, env=env)
    try:
        _wait_until_up(port, process)
        say(f"gunicorn up on port {port} with {workers} workers")
        yield port
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_until_up(port: int, process: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"gunicorn exited with {process.returncode}")
        try:
            status, _body, _headers = _request(port, "GET", "/accounts/login/", {})
            if status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError("gunicorn did not answer within a minute")


# --------------------------------------------------------------------------------------------
# The client


def _request(port: int, method: str, path: str, cookies: dict, body: str = "", headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Host": "127.0.0.1", **(headers or {})}
    if cookies:
        headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in cookies.items())
    if body:
        headers["Content-Type"] = "application/x-www-form-urlencoded"
        headers["Referer"] = f"http://127.0.0.1:{port}/accounts/login/"
    try:
        conn.request(method, path, body=body or None, headers=headers)
        response = conn.getresponse()
        data = response.read()
        return response.status, data, response.headers
    finally:
        conn.close()


def _cookies_from(headers, cookies: dict) -> dict:
    for value in headers.get_all("Set-Cookie") or []:
        jar = SimpleCookie()
        jar.load(value)
        cookies.update({name: morsel.value for name, morsel in jar.items()})
    return cookies


def log_in(port: int) -> dict:
    """The session cookies of the bench user, through the login form (CSRF and all)."""
    status, body, headers = _request(port, "GET", "/accounts/login/", {})
    cookies = _cookies_from(headers, {})
    token = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', body).group(1).decode()
    form = urlencode(
        {"csrfmiddlewaretoken": token, "username": USERNAME, "password": PASSWORD, "time_zone": ""}
    )
    status, _body, headers = _request(port, "POST", "/accounts/login/", cookies, form)
    cookies = _cookies_from(headers, cookies)
    if status != 302 or "sessionid" not in cookies:
        raise RuntimeError(f"could not log in as {USERNAME}: {status}")
    return cookies


def measure(port: int, cookies: dict, page: Page, requests: int) -> dict:
    """`requests` timed requests of one page (after WARMUP untimed ones): p50, p95 and the
    query count each response reported."""
    times, queries, statuses = [], set(), set()
    for index in range(WARMUP + requests):
        started = time.perf_counter()
        status, _body, headers = _request(port, "GET", page.path, cookies)
        elapsed = (time.perf_counter() - started) * 1000
        statuses.add(status)
        if index >= WARMUP:
            times.append(elapsed)
            queries.add(int(headers.get(HEADER, -1)))
    return {
        "path": page.path,
        "p50_ms": round(percentile(times, 50), 1),
        "p95_ms": round(percentile(times, 95), 1),
        "max_ms": round(max(times), 1),
        "queries": max(queries),
        "queries_constant": len(queries) == 1,
        "status": sorted(statuses),
    }


# --------------------------------------------------------------------------------------------
# The benchmark


def bench_console(
    runs: int, say: Say, *, requests: int = 20, workers: int = 2, vacuum: bool = True
) -> dict:
    if not settings.TESTING:
        # gunicorn runs with it (see gunicorn()): its password hasher must be this process's.
        raise CommandError("bench console --here needs TASKPILOTS_TESTING=1, as in its scratch")
    load(runs, say, vacuum=vacuum)
    bench_user()
    listed = pages()
    events = TimelineEvent.objects.count()
    say(f"{Run.objects.count()} runs, {events} timeline events; {len(listed)} pages")
    results = {}
    with gunicorn(workers, say) as port:
        cookies = log_in(port)
        for page in listed:
            results[page.name] = measure(port, cookies, page, requests)
            r = results[page.name]
            say(
                f"{page.name:40} p50 {r['p50_ms']:7.1f} ms  p95 {r['p95_ms']:7.1f} ms  "
                f"{r['queries']:3} queries  {r['status']}"
            )
    over = [name for name, r in results.items() if r["p95_ms"] > BUDGET_MS]
    failed = [name for name, r in results.items() if r["status"] != [200]]
    return {
        "benchmark": "console",
        "runs": Run.objects.count(),
        "timeline_events": events,
        "requests_per_page": requests,
        "gunicorn_workers": workers,
        "budget_ms": BUDGET_MS,
        "pages": results,
        "over_budget": over,
        "not_200": failed,
        "slowest_p95_ms": max(r["p95_ms"] for r in results.values()),
    }

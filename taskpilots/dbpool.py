"""The database connection budget: a bounded pool per process, and a worker that refuses to start
when it could exhaust PostgreSQL's connections.

Every process (web, worker, beat, commands) takes its connections from one psycopg pool of at
most TASKPILOTS_DB_POOL_SIZE (Django's `OPTIONS["pool"]`). A Celery worker runs many threads
(`--pool threads`), each waiting on a tool call or a model turn most of the time; no
transaction is open during a call, so the engine gives its connection back to the pool for the
call (runs.engine.calls) and the threads share a few connections instead of holding one each.

A pooled connection is checked before it is handed out at most every few seconds
(`check_now_and_then`): checking it every time would cost a round trip per tool call, and one
that sat through a PostgreSQL restart is still replaced before it is used.
"""

from __future__ import annotations

import time
import weakref

from django.core.exceptions import ImproperlyConfigured

# A pooled connection is checked (one round trip) at most this often.
CHECK_EVERY_SECONDS = 2.0
_checked_at: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def check_now_and_then(conn) -> None:
    """The pool's `check` hook, run when it hands a connection out: a round trip for a
    connection not checked in the last CHECK_EVERY_SECONDS (one that sat through a PostgreSQL
    restart is replaced), none for one in constant use."""
    from psycopg_pool import ConnectionPool

    now = time.monotonic()
    checked = _checked_at.get(conn)
    if checked is None or now - checked > CHECK_EVERY_SECONDS:
        ConnectionPool.check_connection(conn)
        _checked_at[conn] = now


def pool_options(size: int, timeout: float) -> dict:
    """Django's OPTIONS["pool"]: at most `size` connections, one kept open when idle."""
    return {
        "min_size": 1,
        "max_size": size,
        "timeout": timeout,
        "check": check_now_and_then,
    }


def worker_connection_options(idle_in_transaction_s: float) -> dict:
    """What a worker's connections add, so a worker cut off from PostgreSQL mid-transaction (a
    network partition) can neither hold a run's lock for long nor hang forever: the server
    ends a session idle in a transaction after `idle_in_transaction_s`, TCP keepalives and a
    user timeout end a connection whose peer went silent, and a connection attempt that gets no
    answer gives up after 5 s (the pool tries again) instead of holding one of the pool's
    connecting threads for as long as the partition lasts."""
    return {
        "options": f"-cidle_in_transaction_session_timeout={int(idle_in_transaction_s * 1000)}",
        "connect_timeout": 5,
        "keepalives": 1,
        "keepalives_idle": 10,
        "keepalives_interval": 3,
        "keepalives_count": 3,
        "tcp_user_timeout": 15000,
    }


def apply_worker_options(options: dict, idle_in_transaction_s: float) -> None:
    """Merge worker_connection_options into a DATABASES OPTIONS dict (a configured `options`
    string is kept and extended)."""
    extra = worker_connection_options(idle_in_transaction_s)
    configured = options.get("options", "")
    options.update(extra)
    if configured:
        options["options"] = f"{configured} {extra['options']}"


# What a web process's connections add: no JIT. The console's and the API's reads are short and
# interactive, and PostgreSQL JIT-compiles any plan whose estimated cost passes jit_above_cost:
# an audit filter that matches nothing is planned to read every run, and compiling it took
# ~190 ms for a 30 ms query. Set as a connection option (no statement per request); the
# workers' connections keep the server's setting.
WEB_CONNECTION_OPTIONS = "-cjit=off"


def apply_web_options(options: dict) -> None:
    """Merge WEB_CONNECTION_OPTIONS into a DATABASES OPTIONS dict (taskpilots/wsgi.py and
    asgi.py, before the first connection); a configured `options` string is kept."""
    configured = options.get("options", "")
    if WEB_CONNECTION_OPTIONS not in configured:
        options["options"] = f"{configured} {WEB_CONNECTION_OPTIONS}".strip()


# --------------------------------------------------------------------------------------------
# The budget a worker checks at start-up


def worker_demand(pool: str, concurrency: int, pool_size: int | None) -> int:
    """The most connections a Celery worker of this pool and concurrency can hold at once: its
    pool (or a connection per thread or pool process), and each process's heartbeat."""
    processes = concurrency if pool == "prefork" else 1
    if pool_size:  # one pool per process: threads share it
        return processes * (pool_size + 1)
    return concurrency + processes  # each thread (or pool process) holds its own connection


def check_budget(*, pool: str, concurrency: int, pool_size: int | None, server) -> None:
    """Refuse a worker that could take more connections than PostgreSQL has left.

    `server` is (max_connections, reserved for superusers and roles, connections in use now).
    Raises ImproperlyConfigured naming what to change.
    """
    if pool == "prefork" and pool_size:
        # Celery's Django fixup closes a prefork child's pool after every task: each task would
        # open new connections.
        raise ImproperlyConfigured(
            "The prefork pool cannot share TaskPilots' connection pool (Celery closes it after "
            "every task). Run the worker with --pool threads (the production pool: "
            "docs/deploy.md), or set TASKPILOTS_DB_POOL_SIZE=0 for prefork."
        )
    max_connections, reserved, in_use = server
    demand = worker_demand(pool, concurrency, pool_size)
    # The worker's own check connection is among those in use: it is not double-counted.
    free = max_connections - reserved - (in_use - 1)
    if demand <= free:
        return
    if pool_size:
        whose = f"each of its {concurrency} pool processes" if pool == "prefork" else "its"
        how = f"{whose} connection pool holds up to TASKPILOTS_DB_POOL_SIZE={pool_size}"
        fix = (
            "lower TASKPILOTS_DB_POOL_SIZE (threads share the pool: a few connections serve "
            "hundreds of threads, because no connection is held during a tool call)"
        )
        if pool == "prefork":
            fix = "run --pool threads (one pool for all threads), or " + fix
    else:
        slots = "pool processes" if pool == "prefork" else pool
        how = f"each of its {concurrency} {slots} holds its own connection: no pool"
        fix = "set TASKPILOTS_DB_POOL_SIZE (a pool shared by the threads), or lower --concurrency"
    raise ImproperlyConfigured(
        f"This worker could open {demand} PostgreSQL connections ({how}), but the server has "
        f"{free} left (max_connections={max_connections}, {reserved} reserved, {in_use - 1} in "
        f"use by others). Refusing to start: {fix}, or raise max_connections on the server, or "
        "put PgBouncer (transaction pooling) in front of it."
    )


def server_budget(cursor) -> tuple[int, int, int]:
    """(max_connections, reserved connections, connections in use) as the server reports."""
    cursor.execute(
        "SELECT current_setting('max_connections')::int, "
        "current_setting('superuser_reserved_connections')::int + "
        "COALESCE(current_setting('reserved_connections', true)::int, 0), "
        "(SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')"
    )
    return cursor.fetchone()


def check_worker(pool: str, concurrency: int) -> None:
    """Celery's worker_init: refuse to start a worker that could exhaust the server."""
    from django.conf import settings
    from django.db import connection

    size = (settings.DATABASES["default"]["OPTIONS"].get("pool") or {}).get("max_size")
    # The heartbeat's own connection (runs/engine/liveness.py) comes on top of the pool.
    with connection.cursor() as cursor:
        server = server_budget(cursor)
    connection.close()
    if connection.pool is not None:
        connection.close_pool()  # the worker's processes and threads open their own
    if server is None:
        raise ImproperlyConfigured("could not read max_connections from PostgreSQL")
    check_budget(pool=pool, concurrency=concurrency, pool_size=size, server=server)

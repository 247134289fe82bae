"""The sandbox: simulated external systems with a durable ledger and fault injection.

Standard library only, and no Django import, so `python -m taskpilots.sandbox.server` starts in a
fraction of a second and can be killed and restarted by tests and drills. Everything that must
survive a restart (the ledger, per-system switches, injected faults and outages) lives in one
sqlite file. Reference: docs/sandbox.md.
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import socket
import sqlite3
import struct
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import parse_qs, urlsplit

from taskpilots.sandbox.systems import (
    ALWAYS_UP,
    DEFAULT_CONFIG,
    READS,
    SYSTEMS,
    WRITES,
    Conflict,
    InvalidInput,
    WriteAction,
    actions_of,
    now_iso,
)

MAX_BODY_BYTES = 1_000_000
MAX_KEY_LENGTH = 255
DEFAULT_SLEEP_SECONDS = 30.0

FAULT_MODES = (
    "latency",
    "503",
    "429",
    "reset",
    "timeout_before_commit",
    "commit_then_500",
    "commit_then_timeout",
    "outage",
)

SCHEMA = """
CREATE TABLE IF NOT EXISTS ledger (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    at TEXT NOT NULL,
    system TEXT NOT NULL,
    action TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    run TEXT,
    step TEXT,
    target TEXT,
    request TEXT NOT NULL,
    external_id TEXT NOT NULL,
    response TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS ledger_system_key ON ledger (system, idempotency_key);
CREATE INDEX IF NOT EXISTS ledger_system_target ON ledger (system, action, target);
CREATE TABLE IF NOT EXISTS config (
    system TEXT PRIMARY KEY,
    dedupes INTEGER NOT NULL,
    lookup INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS faults (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    system TEXT NOT NULL,
    action TEXT,
    mode TEXT NOT NULL,
    remaining INTEGER NOT NULL,
    latency_ms REAL,
    seconds REAL,
    until REAL,
    created_at TEXT NOT NULL
);
"""


class BadRequest(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        field: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.extra = {"field": field} if field else {}
        self.headers = headers or {}


@dataclass(frozen=True)
class Fault:
    mode: str
    latency_ms: float = 0.0
    seconds: float | None = None

    def sleep_seconds(self) -> float:
        return DEFAULT_SLEEP_SECONDS if self.seconds is None else self.seconds


# --- the store -----------------------------------------------------------------------------------


class Store:
    """The sqlite file behind the sandbox; one connection guarded by one lock.

    One lock is plenty for a test double, and it makes "check the key, then commit" atomic.
    """

    def __init__(self, db_path: str) -> None:
        if db_path != ":memory:":
            Path(db_path).parent.mkdir(parents=True, exist_ok=True)
        self.lock = threading.Lock()
        self.db = sqlite3.connect(db_path, check_same_thread=False, isolation_level=None)
        # WAL + NORMAL survives a killed process (the drills' concern), not a power cut.
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        with self.lock:
            self.db.executescript(SCHEMA)
            self._insert_default_config()

    def close(self) -> None:
        with self.lock:
            self.db.close()

    def _insert_default_config(self) -> None:
        for system, switches in DEFAULT_CONFIG.items():
            self.db.execute(
                "INSERT OR IGNORE INTO config (system, dedupes, lookup) VALUES (?, ?, ?)",
                (system, switches["dedupes"], switches["lookup"]),
            )

    # config

    def config(self) -> dict[str, dict[str, bool]]:
        with self.lock:
            rows = self.db.execute("SELECT system, dedupes, lookup FROM config").fetchall()
        return {row[0]: {"dedupes": bool(row[1]), "lookup": bool(row[2])} for row in rows}

    def configure(self, system: str, dedupes: bool | None, lookup: bool | None) -> dict[str, bool]:
        with self.lock:
            if dedupes is not None:
                self.db.execute("UPDATE config SET dedupes = ? WHERE system = ?", (dedupes, system))
            if lookup is not None:
                self.db.execute("UPDATE config SET lookup = ? WHERE system = ?", (lookup, system))
        return self.config()[system]

    # ledger

    def commit_write(
        self,
        system: str,
        action: str,
        write: WriteAction,
        body: dict[str, Any],
        idempotency_key: str,
        run: str | None,
        step: str | None,
    ) -> tuple[dict[str, Any], bool]:
        """Commit one write, or replay it; returns (response, replayed).

        1. If the system dedupes and the key is already committed there, return that response.
        2. Otherwise perform the action against the ledger (may raise InvalidInput / Conflict).
        3. Append the ledger row.
        """
        with self.lock:
            if self._switch(system, "dedupes"):
                row = self.db.execute(
                    "SELECT response FROM ledger WHERE system = ? AND idempotency_key = ? "
                    "ORDER BY seq LIMIT 1",
                    (system, idempotency_key),
                ).fetchone()
                if row is not None:
                    return json.loads(row[0]), True
            external_id, target, response = write.perform(self.db, body)
            self.db.execute(
                "INSERT INTO ledger (at, system, action, idempotency_key, run, step, target, "
                "request, external_id, response) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    now_iso(),
                    system,
                    action,
                    idempotency_key,
                    run,
                    step,
                    target,
                    json.dumps(body),
                    external_id,
                    json.dumps(response),
                ),
            )
        return response, False

    def read(self, reader: Callable[[sqlite3.Connection, dict[str, str]], dict], query: dict):
        with self.lock:
            return reader(self.db, query)

    def lookup(self, system: str, idempotency_key: str) -> dict[str, Any] | None:
        with self.lock:
            rows = self.db.execute(
                "SELECT external_id, response FROM ledger WHERE system = ? AND idempotency_key = ? "
                "ORDER BY seq",
                (system, idempotency_key),
            ).fetchall()
        if not rows:
            return None
        # `count` > 1 tells a reconciler the write landed more than once.
        return {
            "found": True,
            "id": rows[0][0],
            "response": json.loads(rows[0][1]),
            "count": len(rows),
        }

    def _switch(self, system: str, name: str) -> bool:
        row = self.db.execute(f"SELECT {name} FROM config WHERE system = ?", (system,)).fetchone()
        return bool(row and row[0])

    def switch(self, system: str, name: str) -> bool:
        with self.lock:
            return self._switch(system, name)

    def ledger(self, filters: dict[str, str]) -> list[dict[str, Any]]:
        columns = {
            "system": "system",
            "action": "action",
            "run": "run",
            "step": "step",
            "key": "idempotency_key",
        }
        clauses = [f"{columns[name]} = ?" for name in filters]
        sql = (
            "SELECT seq, at, system, action, idempotency_key, run, step, request, external_id, "
            "response FROM ledger"
        )
        if clauses:
            sql += " WHERE " + " AND ".join(clauses)
        with self.lock:
            rows = self.db.execute(sql + " ORDER BY seq", tuple(filters.values())).fetchall()
        return [
            {
                "seq": row[0],
                "at": row[1],
                "system": row[2],
                "action": row[3],
                "idempotency_key": row[4],
                "run": row[5],
                "step": row[6],
                "request": json.loads(row[7]),
                "external_id": row[8],
                "response": json.loads(row[9]),
            }
            for row in rows
        ]

    def alter(self, system: str, idempotency_key: str, response: dict | None, delete: bool) -> int:
        """Change what the system holds under a key behind the caller's back (a record edited
        or removed by someone else): the drills' and tests' way to plant a mismatch. Returns
        how many ledger rows it touched."""
        where = "WHERE system = ? AND idempotency_key = ?"
        with self.lock:
            if delete:
                cursor = self.db.execute(f"DELETE FROM ledger {where}", (system, idempotency_key))
            else:
                cursor = self.db.execute(
                    f"UPDATE ledger SET response = ? {where}",
                    (json.dumps(response), system, idempotency_key),
                )
        return cursor.rowcount

    def reset(self, config: bool) -> None:
        with self.lock:
            self.db.execute("DELETE FROM ledger")
            self.db.execute("DELETE FROM faults")
            if config:
                self.db.execute("DELETE FROM config")
                self._insert_default_config()

    # faults

    def add_fault(
        self,
        system: str,
        action: str | None,
        mode: str,
        count: int,
        latency_ms: float | None,
        seconds: float | None,
    ) -> dict[str, Any]:
        until = time.time() + (seconds if seconds is not None else DEFAULT_SLEEP_SECONDS)
        with self.lock:
            cursor = self.db.execute(
                "INSERT INTO faults (system, action, mode, remaining, latency_ms, seconds, until, "
                "created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    system,
                    action,
                    mode,
                    count,
                    latency_ms,
                    seconds,
                    until if mode == "outage" else None,
                    now_iso(),
                ),
            )
            fault_id = cursor.lastrowid
        return next(fault for fault in self.faults() if fault["id"] == fault_id)

    def faults(self) -> list[dict[str, Any]]:
        with self.lock:
            self._drop_expired_outages()
            rows = self.db.execute(
                "SELECT id, system, action, mode, remaining, latency_ms, seconds, until, "
                "created_at FROM faults ORDER BY id"
            ).fetchall()
        return [
            {
                "id": row[0],
                "system": row[1],
                "action": row[2],
                "mode": row[3],
                "count": None if row[3] == "outage" else row[4],
                "latency_ms": row[5],
                "seconds": row[6],
                "outage_until": row[7],
                "created_at": row[8],
            }
            for row in rows
        ]

    def clear_faults(self) -> None:
        with self.lock:
            self.db.execute("DELETE FROM faults")

    def _drop_expired_outages(self) -> None:
        self.db.execute("DELETE FROM faults WHERE mode = 'outage' AND until <= ?", (time.time(),))

    def outage_until(self, system: str) -> float | None:
        with self.lock:
            self._drop_expired_outages()
            row = self.db.execute(
                "SELECT MAX(until) FROM faults WHERE mode = 'outage' AND system = ?", (system,)
            ).fetchone()
        return row[0] if row else None

    def take_fault(self, system: str, action: str) -> Fault | None:
        """Consume one use of the oldest fault matching this request, if any."""
        with self.lock:
            row = self.db.execute(
                "SELECT id, mode, remaining, latency_ms, seconds FROM faults "
                "WHERE mode != 'outage' AND system = ? AND (action IS NULL OR action = ?) "
                "ORDER BY id LIMIT 1",
                (system, action),
            ).fetchone()
            if row is None:
                return None
            fault_id, mode, remaining, latency_ms, seconds = row
            if remaining == 1:
                self.db.execute("DELETE FROM faults WHERE id = ?", (fault_id,))
            elif remaining > 1:
                self.db.execute(
                    "UPDATE faults SET remaining = remaining - 1 WHERE id = ?", (fault_id,)
                )
        return Fault(mode=mode, latency_ms=latency_ms or 0.0, seconds=seconds)


# --- HTTP ----------------------------------------------------------------------------------------


class DropConnection(Exception):
    """Raised by a handler to abort the request with a TCP reset instead of a response."""


def parse_fault_header(value: str) -> Fault:
    """Parse `X-Sandbox-Fault: mode[;latency_ms=..][;seconds=..]`."""
    mode, *params = (part.strip() for part in value.split(";"))
    if mode not in FAULT_MODES:
        raise InvalidInput("X-Sandbox-Fault", f"unknown fault mode {mode!r}")
    numbers: dict[str, float] = {}
    for param in params:
        name, _, raw = param.partition("=")
        name = name.strip()
        if name not in ("latency_ms", "seconds"):
            raise InvalidInput("X-Sandbox-Fault", f"unknown fault parameter {name!r}")
        try:
            number = float(raw)
        except ValueError:
            raise InvalidInput("X-Sandbox-Fault", f"{name} must be a number") from None
        if not math.isfinite(number) or number < 0:
            raise InvalidInput("X-Sandbox-Fault", f"{name} must be >= 0")
        numbers[name] = number
    return Fault(
        mode=mode, latency_ms=numbers.get("latency_ms", 0.0), seconds=numbers.get("seconds")
    )


class SandboxServer(ThreadingHTTPServer):
    # Sleeping fault handlers must neither block shutdown nor be joined on close.
    daemon_threads = True
    block_on_close = False
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], store: Store, log_requests: bool = False) -> None:
        self.store = store
        self.log_requests = log_requests
        super().__init__(address, SandboxHandler)


class SandboxHandler(BaseHTTPRequestHandler):
    server: SandboxServer
    server_version = "TaskPilotsSandbox/1"
    # A client that stops sending must not pin a thread forever.
    timeout = 60

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.log_requests:
            super().log_message(format, *args)

    # -- plumbing

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def _dispatch(self, method: str) -> None:
        url = urlsplit(self.path)
        query = {name: values[-1] for name, values in parse_qs(url.query).items()}
        parts = [part for part in url.path.split("/") if part]
        try:
            raw_body = self._read_body()
            if len(parts) == 2 and parts[0] == "_admin":
                self._admin(method, parts[1], query, raw_body)
            elif len(parts) == 2 and parts[0] in SYSTEMS:
                self._system(method, parts[0], parts[1], query, raw_body)
            else:
                self._send(404, {"error": "not found"})
        except InvalidInput as exc:
            self._send(422, {"error": exc.message, "field": exc.field})
        except Conflict as exc:
            self._send(409, {"error": exc.message, "field": exc.field})
        except BadRequest as exc:
            self._send(exc.status, {"error": exc.message, **exc.extra}, exc.headers)
        except DropConnection:
            self._reset_connection()

    def _read_body(self) -> bytes:
        length_header = self.headers.get("Content-Length") or "0"
        try:
            length = int(length_header)
        except ValueError:
            raise BadRequest(400, "Content-Length is not a number") from None
        if length < 0 or length > MAX_BODY_BYTES:
            raise BadRequest(413, "body too large")
        return self.rfile.read(length) if length else b""

    def _json_body(self, raw_body: bytes) -> dict[str, Any]:
        if not raw_body:
            return {}
        try:
            body = json.loads(raw_body)
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise BadRequest(400, "body is not valid JSON", field="body") from None
        if not isinstance(body, dict):
            raise BadRequest(400, "body must be a JSON object", field="body")
        return body

    def _send(
        self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None
    ) -> None:
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            # The caller gave up (its timeout fired during a commit_then_timeout sleep); that is
            # the scenario being simulated, not a server error.
            self.close_connection = True

    def _reset_connection(self) -> None:
        # SO_LINGER with a zero timeout makes close() send RST instead of FIN: the client sees a
        # connection reset, not a clean end of stream.
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.close()
        self.close_connection = True

    # -- admin

    def _admin(self, method: str, name: str, query: dict[str, str], raw_body: bytes) -> None:
        store = self.server.store
        if name == "health":
            self._require(method, "GET")
            self._send(200, {"status": "ok"})
        elif name == "ledger":
            self._require(method, "GET")
            allowed = ("system", "action", "run", "step", "key")
            filters = {name: query[name] for name in allowed if query.get(name)}
            entries = store.ledger(filters)
            self._send(200, {"entries": entries, "count": len(entries)})
        elif name == "reset":
            self._require(method, "POST")
            body = self._json_body(raw_body)
            store.reset(config=body.get("config") is True)
            self._send(200, {"status": "reset", "config": store.config()})
        elif name == "alter":
            self._require(method, "POST")
            body = self._json_body(raw_body)
            system, key = body.get("system"), body.get("key")
            if system not in DEFAULT_CONFIG:
                raise InvalidInput("system", f"system must be one of {', '.join(DEFAULT_CONFIG)}")
            if not isinstance(key, str) or not key:
                raise InvalidInput("key", "key is required")
            delete, response = body.get("delete") is True, body.get("response")
            if not delete and not isinstance(response, dict):
                raise InvalidInput("response", "give a response object, or delete: true")
            altered = store.alter(system, key, response, delete)
            self._send(200, {"altered": altered})
        elif name == "config":
            if method == "GET":
                self._send(200, {"config": store.config()})
                return
            self._require(method, "GET", "POST")
            body = self._json_body(raw_body)
            system = body.get("system")
            if system not in DEFAULT_CONFIG:
                raise InvalidInput("system", f"system must be one of {', '.join(DEFAULT_CONFIG)}")
            switches: dict[str, bool | None] = {}
            for switch in ("dedupes", "lookup"):
                value = body.get(switch)
                if value is not None and not isinstance(value, bool):
                    raise InvalidInput(switch, f"{switch} must be true, false or null")
                switches[switch] = value
            config = store.configure(system, switches["dedupes"], switches["lookup"])
            self._send(200, {"system": system, **config})
        elif name == "faults":
            if method == "GET":
                self._send(200, {"faults": store.faults()})
            elif method == "DELETE":
                store.clear_faults()
                self._send(200, {"faults": []})
            else:
                self._require(method, "GET", "POST", "DELETE")
                self._send(201, {"fault": self._add_fault(self._json_body(raw_body))})
        else:
            self._send(404, {"error": "not found"})

    def _add_fault(self, body: dict[str, Any]) -> dict[str, Any]:
        system = body.get("system")
        if system not in SYSTEMS:
            raise InvalidInput("system", f"system must be one of {', '.join(SYSTEMS)}")
        action = body.get("action")
        if action is not None and action not in actions_of(system):
            raise InvalidInput("action", f"{system} has no action {action!r}")
        mode = body.get("mode")
        if mode not in FAULT_MODES:
            raise InvalidInput("mode", f"mode must be one of {', '.join(FAULT_MODES)}")
        count = body.get("count", 1)
        if isinstance(count, bool) or not isinstance(count, int) or count == 0 or count < -1:
            raise InvalidInput("count", "count must be a positive integer, or -1 for until cleared")
        numbers: dict[str, float | None] = {}
        for field in ("latency_ms", "seconds"):
            value = body.get(field)
            if value is not None and (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value < 0
            ):
                raise InvalidInput(field, f"{field} must be a number >= 0")
            numbers[field] = value
        return self.server.store.add_fault(
            system, action, mode, count, numbers["latency_ms"], numbers["seconds"]
        )

    def _require(self, method: str, *allowed: str) -> None:
        if method not in allowed:
            raise BadRequest(405, "method not allowed", headers={"Allow": ", ".join(allowed)})

    # -- systems

    def _system(
        self, method: str, system: str, action: str, query: dict[str, str], raw_body: bytes
    ) -> None:
        store = self.server.store
        route = (system, action)
        if route in WRITES:
            self._require(method, "POST")
        elif route in READS or action == "by-key":
            self._require(method, "GET")
        else:
            self._send(404, {"error": "not found"})
            return

        # Faults first: a real outage or dropped connection happens before auth or validation.
        fault: Fault | None = None
        if route not in ALWAYS_UP:
            until = store.outage_until(system)
            if until is not None:
                self._send_outage(until)
                return
            header = self.headers.get("X-Sandbox-Fault")
            fault = parse_fault_header(header) if header else store.take_fault(system, action)
            if fault is not None and fault.mode == "outage":
                # A per-request outage header starts an outage for the whole system.
                added = store.add_fault(system, None, "outage", -1, None, fault.seconds)
                self._send_outage(added["outage_until"])
                return
            if fault is not None and self._apply_pre_commit_fault(fault):
                return

        self._check_auth()
        if route in WRITES:
            response, replayed = self._write(system, action, raw_body)
        elif route in READS:
            response, replayed = store.read(READS[route], query), False
        else:
            self._lookup(system, query)
            return

        if fault is not None and fault.mode == "commit_then_500":
            self._send(500, {"error": "internal error (injected after commit)"})
            return
        if fault is not None and fault.mode == "commit_then_timeout":
            time.sleep(fault.sleep_seconds())
        headers = {"Idempotent-Replayed": "true"} if replayed else None
        self._send(200, response, headers)

    def _send_outage(self, until: float) -> None:
        retry_after = max(1, math.ceil(until - time.time()))
        self._send(
            503,
            {"error": "service unavailable (outage)"},
            {"X-Sandbox-Outage": "1", "Retry-After": str(retry_after)},
        )

    def _apply_pre_commit_fault(self, fault: Fault) -> bool:
        """Apply the part of a fault that happens before any commit; True if it answered."""
        if fault.mode == "latency":
            time.sleep(fault.latency_ms / 1000)
        elif fault.mode == "503":
            self._send(503, {"error": "service unavailable (injected)"})
            return True
        elif fault.mode == "429":
            retry_after = max(1, math.ceil(fault.seconds or 1))
            self._send(429, {"error": "too many requests"}, {"Retry-After": str(retry_after)})
            return True
        elif fault.mode == "reset":
            raise DropConnection
        elif fault.mode == "timeout_before_commit":
            time.sleep(fault.sleep_seconds())
            self._send(504, {"error": "gateway timeout (nothing committed)"})
            return True
        return False

    def _check_auth(self) -> None:
        if self.headers.get("Authorization", "").strip() == "Bearer deny":
            raise BadRequest(401, "unauthorized", headers={"WWW-Authenticate": "Bearer"})
        if self.headers.get("X-Sandbox-Deny", "").strip() == "1":
            raise BadRequest(403, "forbidden")

    def _write(self, system: str, action: str, raw_body: bytes) -> tuple[dict[str, Any], bool]:
        idempotency_key = (self.headers.get("Idempotency-Key") or "").strip()
        if not idempotency_key:
            raise BadRequest(400, "Idempotency-Key header is required", field="Idempotency-Key")
        if len(idempotency_key) > MAX_KEY_LENGTH:
            raise BadRequest(400, "Idempotency-Key is too long", field="Idempotency-Key")
        write = WRITES[(system, action)]
        body = write.validate(self._json_body(raw_body))
        return self.server.store.commit_write(
            system,
            action,
            write,
            body,
            idempotency_key,
            run=self.headers.get("X-TaskPilots-Run"),
            step=self.headers.get("X-TaskPilots-Step"),
        )

    def _lookup(self, system: str, query: dict[str, str]) -> None:
        store = self.server.store
        if system not in DEFAULT_CONFIG or not store.switch(system, "lookup"):
            self._send(501, {"error": f"{system} does not support lookup by key"})
            return
        key = query.get("key", "")
        if not key:
            raise InvalidInput("key", "key is required")
        found = store.lookup(system, key)
        if found is None:
            self._send(404, {"found": False})
        else:
            self._send(200, found)


def serve(
    host: str,
    port: int,
    db_path: str,
    log_requests: bool = False,
    ready: Callable[[str], None] | None = None,
) -> None:
    """Run the sandbox in the foreground until SIGTERM / SIGINT."""
    store = Store(db_path)
    server = SandboxServer((host, port), store, log_requests=log_requests)

    def stop(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    bound_port = server.server_address[1]
    url = f"http://{f'[{host}]' if ':' in host else host}:{bound_port}"
    if ready is not None:
        ready(url)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        store.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m taskpilots.sandbox.server", description=__doc__
    )
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback)")
    parser.add_argument("--port", type=int, default=8765, help="0 picks a free port")
    parser.add_argument("--db", default="var/sandbox.sqlite3", help="sqlite file for the ledger")
    parser.add_argument("--log-requests", action="store_true", help="log each request to stderr")
    args = parser.parse_args(argv)

    def announce(url: str) -> None:
        # start_sandbox() reads this line to learn the port when it asked for port 0.
        print(f"sandbox listening on {url}", flush=True)

    serve(args.host, args.port, args.db, log_requests=args.log_requests, ready=announce)


if __name__ == "__main__":
    sys.exit(main())

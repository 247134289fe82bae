"""The target of `bench crash`: an HTTP server that counts, where the calls land, what a crashed
caller cannot see for itself.

    python -m taskpilots.evidence.crash_target --latency-ms 500 [--port 0]

Prints `listening on <port>` once ready; `CrashTarget(latency_ms).start()` runs the same server
in a thread of the calling process. Every call goes through three moments, each recorded with
its time so a kill schedule can aim at them:

    arrived   the request is in the target's hands, not yet applied; for L/2 ms the target
              watches the connection, and a request whose caller has gone meanwhile (a killed
              process: the kernel closes its socket) is dropped — as if it never arrived
    landed    the effect is applied: from here on it has happened, whatever the caller hears
    answered  after another L/2 ms the answer is written back

Two kinds of system, each counted per calling system (`taskpilots`, `dbos`, …):

    POST /dedupe/<system>          Idempotency-Key header. A key that already landed is answered
                                   with its first answer and is NOT a new effect (a repeated call
                                   absorbed by the target)
    GET  /dedupe/<system>/lookup?key=
                                   200 {"found": true, "id": ...} when an effect landed under
                                   the key, else 404: the caller can ask whether a call landed
    POST /plain/<system>           every call that lands is an effect; there is no lookup, so an
                                   interrupted caller cannot find out whether it landed
    GET  /_stats                   per kind and system: calls, dropped, effects, distinct and
                                   duplicated keys, repeated calls absorbed (?keys=1: per key)
    POST /_reset                   forget everything
"""

from __future__ import annotations

import argparse
import contextlib
import json
import select
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

KINDS = ("dedupe", "plain")
PHASES = ("arrived", "dropped", "landed", "answered")


@dataclass
class Tally:
    calls: int = 0  # requests that arrived
    dropped: int = 0  # arrived, caller gone before the effect was applied: not an effect
    effects: Counter = field(default_factory=Counter)  # key → effects that landed under it
    absorbed: Counter = field(default_factory=Counter)  # key → repeated calls answered (dedupe)
    answers: dict = field(default_factory=dict)  # key → the first answer (dedupe)

    def summary(self, with_keys: bool) -> dict:
        duplicated = sorted(key for key, count in self.effects.items() if count > 1)
        summary = {
            "calls": self.calls,
            "dropped": self.dropped,
            "effects": sum(self.effects.values()),
            "distinct_keys": len(self.effects),
            "duplicated_keys": len(duplicated),
            "duplicate_examples": duplicated[:5],
            "repeated_calls_absorbed": sum(self.absorbed.values()),
        }
        if with_keys:
            summary["keys"] = dict(self.effects)
            summary["absorbed_keys"] = dict(self.absorbed)
        return summary


@dataclass(frozen=True)
class Event:
    at: float  # time.time() on this machine
    kind: str
    system: str
    key: str
    phase: str


class CrashTarget:
    def __init__(self, latency_ms: float, port: int = 0):
        self.latency = latency_ms / 1000
        self.lock = threading.Condition()
        self.tallies: dict[tuple[str, str], Tally] = {}
        self.events: list[Event] = []
        target = self

        class Handler(_Handler):
            owner = target

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread: threading.Thread | None = None

    # -- the server in a thread of this process

    def start(self) -> CrashTarget:
        self._thread = threading.Thread(
            target=self.server.serve_forever, name="crash-target", daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> CrashTarget:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- what the kill schedule and the counts read (in this process)

    def tally(self, kind: str, system: str) -> Tally:
        return self.tallies.setdefault((kind, system), Tally())

    def stats(self, with_keys: bool = False) -> dict:
        with self.lock:
            out: dict = {kind: {} for kind in KINDS}
            for (kind, system), tally in self.tallies.items():
                out[kind][system] = tally.summary(with_keys)
            return out

    def key_events(self, key: str) -> list[Event]:
        with self.lock:
            return [event for event in self.events if event.key == key]

    def wait_for(
        self, key: str, phase: str, *, after: float = 0.0, timeout: float = 30
    ) -> Event | None:
        """The first `phase` event of `key` at or after `after`, waiting up to `timeout` s."""
        deadline = time.monotonic() + timeout
        with self.lock:
            while True:
                for event in self.events:
                    if event.key == key and event.phase == phase and event.at >= after:
                        return event
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self.lock.wait(remaining)

    def reset(self) -> None:
        with self.lock:
            self.tallies.clear()
            self.events.clear()

    def _note(self, kind: str, system: str, key: str, phase: str) -> None:
        # Called with the lock held.
        self.events.append(Event(time.time(), kind, system, key, phase))
        self.lock.notify_all()

    # -- one call

    def call(self, kind: str, system: str, key: str, connection: socket.socket) -> dict | None:
        """The call's answer, or None when its caller went away before it landed."""
        with self.lock:
            tally = self.tally(kind, system)
            tally.calls += 1
            self._note(kind, system, key, "arrived")
        if _caller_gone_within(connection, self.latency / 2):
            with self.lock:
                tally.dropped += 1
                self._note(kind, system, key, "dropped")
            return None
        with self.lock:
            if kind == "dedupe" and key and key in tally.answers:
                tally.absorbed[key] += 1  # the same key again: the first answer, no new effect
                answer = tally.answers[key]
            else:
                tally.effects[key] += 1
                answer = {"id": f"{kind[0]}-{key}-{tally.effects[key]}", "key": key}
                if kind == "dedupe":
                    tally.answers[key] = answer
            self._note(kind, system, key, "landed")
        time.sleep(self.latency / 2)
        return answer

    def answered(self, kind: str, system: str, key: str) -> None:
        with self.lock:
            self._note(kind, system, key, "answered")

    def lookup(self, system: str, key: str) -> dict | None:
        with self.lock:
            return self.tally("dedupe", system).answers.get(key)


def _caller_gone_within(connection: socket.socket, seconds: float) -> bool:
    """Watch the connection for `seconds`: True when the caller closed it meanwhile (a caller
    waiting for its answer sends nothing, so a readable socket here is its end)."""
    deadline = time.monotonic() + seconds
    while (remaining := deadline - time.monotonic()) > 0:
        readable, _, _ = select.select([connection], [], [], remaining)
        if readable:
            try:
                if connection.recv(1, socket.MSG_PEEK) == b"":
                    return True
            except OSError:
                return True
            time.sleep(min(0.01, max(0.0, deadline - time.monotonic())))  # pipelined bytes
    return False


class _Handler(BaseHTTPRequestHandler):
    owner: CrashTarget
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet: the counts are the output
        pass

    def handle(self) -> None:
        # A killed caller resets its connections: that is the benchmark, not an error.
        with contextlib.suppress(ConnectionError):
            super().handle()

    def _reply(self, status: int, payload: dict) -> None:
        body = json.dumps(payload, separators=(",", ":")).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        parts = [part for part in url.path.split("/") if part]
        query = parse_qs(url.query)
        if len(parts) == 3 and parts[0] == "dedupe" and parts[2] == "lookup":
            answer = self.owner.lookup(parts[1], query.get("key", [""])[0])
            if answer is None:
                return self._reply(404, {"found": False})
            return self._reply(200, {"found": True, **answer})
        if parts == ["_stats"]:
            return self._reply(200, self.owner.stats(query.get("keys") == ["1"]))
        self._reply(404, {"error": f"no such endpoint: GET {url.path}"})

    def do_POST(self) -> None:
        url = urlsplit(self.path)
        parts = [part for part in url.path.split("/") if part]
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        if parts == ["_reset"]:
            self.owner.reset()
            return self._reply(200, {"reset": True})
        if len(parts) != 2 or parts[0] not in KINDS:
            return self._reply(404, {"error": f"no such endpoint: POST {url.path}"})
        kind, system = parts
        key = self.headers.get("Idempotency-Key", "")
        answer = self.owner.call(kind, system, key, self.connection)
        if answer is None:
            self.close_connection = True
            return
        try:
            self._reply(200, answer)
        except OSError:  # the caller is gone: the effect landed all the same
            self.close_connection = True
            return
        self.owner.answered(kind, system, key)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--latency-ms", type=float, required=True)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    target = CrashTarget(args.latency_ms, args.port)
    print(f"listening on {target.server.server_address[1]}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        target.server.serve_forever()


if __name__ == "__main__":
    main()

"""A small TCP proxy that can black-hole the connections through it: the partition drill's.

A worker's DATABASE_URL points at the proxy, which forwards to PostgreSQL. On `hole()` it keeps
every socket open and keeps reading (so the kernel acknowledges everything, exactly as a healthy
peer would) but forwards nothing in either direction: the worker waits for an answer that does
not come, and PostgreSQL waits for statements that do not come. Not a reset: nothing tells either
side that something is wrong. Then `heal()` delivers what was held back, in order, and forwarding
goes on; or `cut()` resets every connection (both sides see the connection die; PostgreSQL rolls
back the open transaction). Connections opened during a hole are accepted and held as well.

`hole_after(b"COMMIT", port)` forwards the next chunk that the client connection from `port`
sends with those bytes in it, and opens the hole right after it: the statement reaches
PostgreSQL, its answer does not (a commit the worker cannot know happened, or a lock it holds
inside the hole). A worker that gives up by itself during a hole (closes its socket) is noticed
and counted.

The worker's fault hook opens the hole at an exact moment of a step through the control port
(one line per command: `hole`, `hole-after PORT|- BYTES`, `heal`, `cut`, `status`; answer: one
JSON line). The drill heals or cuts it from its own process by calling the methods directly.
"""

from __future__ import annotations

import contextlib
import json
import selectors
import socket
import struct
import threading
import time
from dataclasses import dataclass, field

FORWARDING, HOLE = "forwarding", "hole"
CHUNK = 65536


@dataclass
class _Pipe:
    """One client connection and its upstream connection, with what is held back each way."""

    client: socket.socket
    upstream: socket.socket
    to_upstream: bytearray = field(default_factory=bytearray)
    to_client: bytearray = field(default_factory=bytearray)
    client_port: int = 0
    client_closed: bool = False
    upstream_closed: bool = False

    def peer(self, sock: socket.socket) -> socket.socket:
        return self.upstream if sock is self.client else self.client


class BlackHoleProxy:
    def __init__(self, upstream: tuple[str, int] | str, *, name: str = "proxy"):
        """`upstream`: PostgreSQL's host and port, or the path of its Unix socket."""
        self.upstream = upstream
        self.name = name
        self.state = FORWARDING
        self.hole_since: float | None = None
        self.holes: list[dict] = []  # one entry per hole: when, how it ended, who gave up
        self._trigger: bytes | None = None
        self._trigger_port: int | None = None
        self._pipes: dict[socket.socket, _Pipe] = {}
        self._selector = selectors.DefaultSelector()
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._listener = self._listen()
        self._control = self._listen()
        self.port = self._listener.getsockname()[1]
        self.control_address = f"127.0.0.1:{self._control.getsockname()[1]}"
        self._selector.register(self._listener, selectors.EVENT_READ, "accept")
        self._selector.register(self._control, selectors.EVENT_READ, "control")
        self._thread = threading.Thread(target=self._loop, daemon=True, name=f"blackhole-{name}")

    @staticmethod
    def _listen() -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))  # a free port
        sock.listen(64)
        sock.setblocking(False)
        return sock

    def start(self) -> BlackHoleProxy:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        with self._lock:
            for pipe in list(self._pipes.values()):
                self._close_pipe(pipe, reset=True)
            for sock in (self._listener, self._control):
                with contextlib.suppress(Exception):
                    self._selector.unregister(sock)
                sock.close()
        self._selector.close()

    # -- the switch ------------------------------------------------------------------------
    def hole(self) -> dict:
        with self._lock:
            if self.state == FORWARDING:
                self.state = HOLE
                self.hole_since = time.time()
                self.holes.append(
                    {"opened_at": self.hole_since, "ended": "", "held_s": None, "gave_up": []}
                )
            return self.status()

    def hole_after(self, trigger: bytes, port: int | None = None) -> dict:
        """Open the hole once the next chunk containing `trigger` from the client connection at
        `port` (any, when None) has been forwarded."""
        with self._lock:
            self._trigger, self._trigger_port = trigger, port
            return self.status()

    def heal(self) -> dict:
        """Deliver what was held back, in order, and forward again."""
        with self._lock:
            self._end_hole("healed")
            for pipe in list(self._pipes.values()):
                self._flush(pipe)
            return self.status()

    def cut(self) -> dict:
        """Reset every connection (what a firewall that dropped the flow does once it answers
        again), then forward new connections normally."""
        with self._lock:
            self._end_hole("cut")
            for pipe in list(self._pipes.values()):
                self._close_pipe(pipe, reset=True)
            return self.status()

    def _end_hole(self, how: str) -> None:
        self._trigger = None
        if self.state == HOLE:
            self.holes[-1].update(ended=how, held_s=round(time.time() - self.hole_since, 3))
        self.state = FORWARDING
        self.hole_since = None

    def status(self) -> dict:
        with self._lock:
            return {
                "name": self.name,
                "state": self.state,
                "armed": self._trigger.decode() if self._trigger else "",
                "connections": len(self._pipes) // 2,
                "holes": [dict(h) for h in self.holes],
            }

    # -- the loop ----------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            for key, _ in self._selector.select(timeout=0.1):
                with self._lock:
                    if key.data == "accept":
                        self._accept()
                    elif key.data == "control":
                        self._accept_control()
                    elif isinstance(key.data, _Control):
                        key.data.readable(self)
                    else:
                        self._readable(key.fileobj, key.data)

    def _accept(self) -> None:
        try:
            client, _ = self._listener.accept()
        except BlockingIOError:
            return
        try:
            upstream = self._connect_upstream()
        except OSError:
            _reset(client)
            return
        for sock in (client, upstream):
            sock.setblocking(False)
            if sock.family != socket.AF_UNIX:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        pipe = _Pipe(client, upstream, client_port=client.getpeername()[1])
        self._pipes[client] = self._pipes[upstream] = pipe
        self._selector.register(client, selectors.EVENT_READ, pipe)
        self._selector.register(upstream, selectors.EVENT_READ, pipe)

    def _connect_upstream(self) -> socket.socket:
        if isinstance(self.upstream, str):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(5)
            try:
                sock.connect(self.upstream)
            except OSError:
                sock.close()
                raise
            return sock
        return socket.create_connection(self.upstream, timeout=5)

    def _readable(self, sock: socket.socket, pipe: _Pipe) -> None:
        if sock not in self._pipes:
            return
        try:
            data = sock.recv(CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._closed_by(sock, pipe)
            return
        held = pipe.to_upstream if sock is pipe.client else pipe.to_client
        held += data
        if self.state == FORWARDING:
            triggered = (
                sock is pipe.client
                and self._trigger is not None
                and self._trigger_port in (None, pipe.client_port)
                and self._trigger in bytes(held)
            )
            self._flush(pipe)
            if triggered:
                # The statement went out; everything after it, and its answer, is held.
                self._trigger = None
                self.hole()

    def _flush(self, pipe: _Pipe) -> None:
        for buffer, target, closed in (
            (pipe.to_upstream, pipe.upstream, pipe.client_closed),
            (pipe.to_client, pipe.client, pipe.upstream_closed),
        ):
            if buffer:
                try:
                    target.setblocking(True)
                    target.sendall(buffer)
                except OSError:
                    self._close_pipe(pipe, reset=True)
                    return
                finally:
                    with contextlib.suppress(OSError):
                        target.setblocking(False)
                buffer.clear()
            if closed:
                self._close_pipe(pipe, reset=False)
                return

    def _closed_by(self, sock: socket.socket, pipe: _Pipe) -> None:
        if sock is pipe.client:
            pipe.client_closed = True
            if self.state == HOLE:
                # The worker gave up by itself: its own timeout worked.
                self.holes[-1]["gave_up"].append(round(time.time() - self.hole_since, 3))
        else:
            pipe.upstream_closed = True
        with contextlib.suppress(Exception):
            self._selector.unregister(sock)
        if self.state == FORWARDING:
            self._flush(pipe)

    def _close_pipe(self, pipe: _Pipe, *, reset: bool) -> None:
        for sock in (pipe.client, pipe.upstream):
            self._pipes.pop(sock, None)
            with contextlib.suppress(Exception):
                self._selector.unregister(sock)
            if reset:
                _reset(sock)
            else:
                with contextlib.suppress(OSError):
                    sock.close()

    # -- control ---------------------------------------------------------------------------
    def _accept_control(self) -> None:
        try:
            conn, _ = self._control.accept()
        except BlockingIOError:
            return
        conn.setblocking(False)
        self._selector.register(conn, selectors.EVENT_READ, _Control(conn))

    def command(self, line: str) -> dict:
        verb, _, argument = line.strip().partition(" ")
        if verb == "hole":
            return self.hole()
        if verb == "hole-after" and " " in argument:
            port, _, trigger = argument.partition(" ")
            return self.hole_after(trigger.encode(), None if port == "-" else int(port))
        if verb == "heal":
            return self.heal()
        if verb == "cut":
            return self.cut()
        if verb == "status":
            return self.status()
        return {"error": f"unknown command {line.strip()!r}"}


@dataclass
class _Control:
    conn: socket.socket
    received: bytearray = field(default_factory=bytearray)

    def readable(self, proxy: BlackHoleProxy) -> None:
        try:
            data = self.conn.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            with contextlib.suppress(Exception):
                proxy._selector.unregister(self.conn)
            self.conn.close()
            return
        self.received += data
        while b"\n" in self.received:
            line, _, rest = bytes(self.received).partition(b"\n")
            self.received[:] = rest
            answer = json.dumps(proxy.command(line.decode(errors="replace"))) + "\n"
            try:
                self.conn.setblocking(True)
                self.conn.sendall(answer.encode())
                self.conn.setblocking(False)
            except OSError:
                pass


def _reset(sock: socket.socket) -> None:
    """Close with a TCP reset (SO_LINGER 0), not an orderly FIN."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


def control(address: str, line: str, timeout: float = 5.0) -> dict:
    """Send one command to a proxy's control port (from another process) and read its answer."""
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as conn:
        conn.sendall(line.encode() + b"\n")
        answer = b""
        while not answer.endswith(b"\n"):
            chunk = conn.recv(4096)
            if not chunk:
                break
            answer += chunk
    return json.loads(answer or b"{}")


def database_address(db: dict) -> tuple[str, int] | str:
    """Where a Django database's PostgreSQL listens, for a proxy in front of it: host and port,
    or the Unix socket's path. No port means libpq's default, 5432 (the embedded server on its
    default port leaves it out of its URL)."""
    port = int(db.get("PORT") or 5432)
    host = db.get("HOST") or "/var/run/postgresql"
    if host.startswith("/"):
        return f"{host}/.s.PGSQL.{port}"
    return (host, port)

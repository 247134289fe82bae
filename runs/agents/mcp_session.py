"""The sessions behind MCP tool calls (runs.agents.mcp), and one call with every failure
classified.

McpServer says how to reach a server: a stdio command or a streamable HTTP URL. A stdio server
is started on the first call in a process and kept for the next ones (_StdioConnection), which
take their turn; its session is closed when the worker shuts down or the interpreter exits
(close_connections). Streamable HTTP, and a stdio server with keep_alive=False, open a session
per call. `call_tool` makes one call under a hard timeout and maps what went wrong onto
TaskPilots' failure classes (see runs.agents.mcp).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.util
import os
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import anyio

from runs.agents import MissingExtra
from runs.models import FailureClass
from runs.tools import ToolError

# mcp is imported where it is used (importing it takes most of a second); that it is there at all
# (the optional `agents` extra) is checked now, so a missing extra is found at import.
if importlib.util.find_spec("mcp") is None:
    raise MissingExtra("mcp")


class McpSetupError(ValueError):
    pass


@dataclass(frozen=True)
class McpServer:
    """How to reach one MCP server: a stdio command or a streamable HTTP URL."""

    name: str
    command: Sequence[str] = ()
    url: str = ""
    # Extra environment for a stdio server; a function is called at every start (so it can
    # read settings that change, e.g. in tests).
    env: Mapping[str, str] | Callable[[], Mapping[str, str]] | None = None
    cwd: str | None = None
    # The hard timeout of a call when the tool sets none (connecting included).
    timeout: float = 30.0
    # stdio: keep the server running between calls in this process (see _StdioConnection);
    # False starts it for every call. Streamable HTTP always uses a session per call.
    keep_alive: bool = True

    def __post_init__(self) -> None:
        if bool(self.command) == bool(self.url):
            raise McpSetupError(f"MCP server {self.name!r}: give either command or url")

    def client(self):
        from mcp import Client
        from mcp.client.stdio import StdioServerParameters, stdio_client

        if self.url:
            return Client(self.url, cache=None)
        env = self.env() if callable(self.env) else self.env
        params = StdioServerParameters(
            command=self.command[0],
            args=list(self.command[1:]),
            env=dict(env) if env else None,
            cwd=self.cwd,
        )
        # The server's stderr goes to a real file descriptor: inside a Celery worker sys.stderr
        # is a logging proxy without one, and mcp binds its default at import time.
        return Client(stdio_client(params, errlog=_server_errlog()), cache=None)


def _server_errlog():
    stream = sys.__stderr__
    try:
        stream.fileno()
        return stream
    except (AttributeError, OSError, ValueError):
        return open(os.devnull, "w")  # noqa: SIM115  (lives as long as the server process)


def _leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


class _NotSent(Exception):
    """The session could not be opened: the request never left this process."""


class _StdioConnection:
    """A stdio server kept running for this worker process, so a call does not pay for
    starting it (a Python MCP server takes about a second to import).

    One owner task in a private event loop opens the client session, serves requests one at a
    time, and closes the session in the task that opened it (anyio requires it). After a
    timeout or a broken connection the session is dropped and the next call starts afresh.
    """

    def __init__(self, server: McpServer):
        self.loop = asyncio.new_event_loop()
        self.opened: concurrent.futures.Future = concurrent.futures.Future()
        self.closed = threading.Event()
        self.alive = True
        threading.Thread(
            target=self.loop.run_forever, daemon=True, name=f"mcp-{server.name}"
        ).start()
        self.queue: asyncio.Queue = asyncio.run_coroutine_threadsafe(
            self._make_queue(), self.loop
        ).result()
        asyncio.run_coroutine_threadsafe(self._owner(server), self.loop)

    async def _make_queue(self) -> asyncio.Queue:
        return asyncio.Queue()

    async def _owner(self, server: McpServer) -> None:
        from mcp.shared.exceptions import MCPError

        try:
            async with server.client() as client:
                self.opened.set_result(True)
                while True:
                    item = await self.queue.get()
                    if item is None:  # close(): leave the session, which stops the server
                        return
                    request, future, limit, started = item
                    started.set()
                    try:
                        with anyio.fail_after(limit):
                            value = await request(client)
                    except BaseException as exc:  # handed to the caller
                        future.set_exception(_leaf(exc))
                        if not isinstance(_leaf(exc), MCPError):
                            return  # the session may be broken: start afresh next time
                    else:
                        future.set_result(value)
        except BaseException as exc:
            if not self.opened.done():
                self.opened.set_exception(_leaf(exc))
        finally:
            self.alive = False
            while not self.queue.empty():
                item = self.queue.get_nowait()
                if item is not None:
                    item[1].set_exception(_NotSent("the MCP session closed"))
            self.loop.call_soon(self.loop.stop)  # and the thread ends
            self.closed.set()

    def close(self, wait: float = 5.0) -> None:
        """End the session (the stdio server exits with it), after the call in progress."""
        if self.alive and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.queue.put_nowait, None)
            self.closed.wait(wait)

    def run(self, request, limit: float):
        try:
            self.opened.result(timeout=limit)
        except concurrent.futures.TimeoutError:
            raise _NotSent(f"could not start the server within {limit}s") from None
        except Exception as exc:
            raise _NotSent(f"{type(exc).__name__}: {exc}") from exc
        if not self.alive:
            raise _NotSent("the MCP session closed")
        future: concurrent.futures.Future = concurrent.futures.Future()
        started = threading.Event()
        self.loop.call_soon_threadsafe(self.queue.put_nowait, (request, future, limit, started))
        try:
            return future.result(timeout=limit + 5)
        except concurrent.futures.TimeoutError:
            if not started.is_set():  # the session ended before taking the request
                raise _NotSent("the MCP session closed") from None
            raise


_CONNECTIONS: dict[tuple, _StdioConnection] = {}
_CONNECTIONS_LOCK = threading.Lock()


def _connection(server: McpServer) -> _StdioConnection:
    env = server.env() if callable(server.env) else server.env
    key = (os.getpid(), server.name, tuple(server.command), tuple(sorted((env or {}).items())))
    with _CONNECTIONS_LOCK:
        connection = _CONNECTIONS.get(key)
        if connection is None or not connection.alive:
            _close_at_exit()
            connection = _CONNECTIONS[key] = _StdioConnection(server)
        return connection


def close_connections() -> int:
    """Close this process's MCP sessions (their stdio servers exit): at worker shutdown, and
    at interpreter exit. Returns how many were open."""
    with _CONNECTIONS_LOCK:
        mine = [k for k in _CONNECTIONS if k[0] == os.getpid()]
        connections = [_CONNECTIONS.pop(k) for k in mine]
    alive = [c for c in connections if c.alive]
    for connection in alive:
        connection.close()
    return sum(1 for c in alive if c.closed.is_set())


_EXIT_HOOKS: set[int] = set()


def _close_at_exit() -> None:
    """Once per process: close the sessions when it ends. Celery's pool children leave with
    os._exit (no atexit), so its worker_process_shutdown signal closes them there."""
    if os.getpid() in _EXIT_HOOKS:
        return
    _EXIT_HOOKS.add(os.getpid())
    import atexit

    atexit.register(close_connections)
    try:
        from celery import signals
    except ImportError:  # pragma: no cover - celery is a dependency
        return
    signals.worker_process_shutdown.connect(_on_worker_shutdown, weak=False)
    signals.worker_shutdown.connect(_on_worker_shutdown, weak=False)


def _on_worker_shutdown(*args, **kwargs) -> None:
    close_connections()


def _run(server: McpServer, request, limit: float):
    """Run `request(client)` against the server under a hard timeout.

    Raises _NotSent when the session could not be opened; anything else may have happened after
    the request went out.
    """
    if server.command and server.keep_alive:
        # One stdio session at a time per process: calls wait their turn.
        with _connection_lock(server):
            return _connection(server).run(request, limit)
    opened = False

    async def once():
        nonlocal opened
        with anyio.fail_after(limit):
            async with server.client() as client:
                opened = True
                return await request(client)

    try:
        return _run_to_completion(once)
    except BaseException as raised:  # anyio may wrap what happened in an exception group
        exc = _leaf(raised)
        if not isinstance(exc, Exception) or opened:
            raise exc from None
        raise _NotSent(f"{type(exc).__name__}: {exc}") from None


def _run_to_completion(make_coroutine):
    """anyio.run here, or in a helper thread when this thread already runs an event loop (a
    caller in async code, or a library that keeps one running, such as Playwright's sync API)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return anyio.run(make_coroutine)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="mcp-call") as pool:
        return pool.submit(anyio.run, make_coroutine).result()


_CALL_LOCKS: dict[str, threading.Lock] = {}


def _connection_lock(server: McpServer) -> threading.Lock:
    with _CONNECTIONS_LOCK:
        return _CALL_LOCKS.setdefault(server.name, threading.Lock())


def call_tool(
    server: McpServer,
    name: str,
    arguments: dict,
    *,
    meta: dict | None = None,
    timeout: float | None = None,
    write: bool,
):
    """One tool call, every failure classified (returns the CallToolResult)."""
    from mcp.shared.exceptions import MCPError
    from mcp.types import INVALID_PARAMS, METHOD_NOT_FOUND

    limit = timeout or server.timeout
    where = f"MCP {server.name}/{name}"
    after_send = FailureClass.UNKNOWN_OUTCOME if write else FailureClass.TRANSIENT
    try:
        return _run(server, lambda c: c.call_tool(name, arguments, meta=meta or None), limit)
    except _NotSent as exc:
        # The server could not be started or reached: the call was never made.
        raise ToolError(FailureClass.OUTAGE, f"{where}: cannot reach the server: {exc}") from None
    except MCPError as exc:
        if exc.code == INVALID_PARAMS:
            raise ToolError(FailureClass.INVALID_INPUT, f"{where}: {exc.message}") from None
        if exc.code == METHOD_NOT_FOUND:
            # The server does not offer the method any more: every call fails the same way.
            raise ToolError(FailureClass.API_DRIFT, f"{where}: {exc.message}") from None
        raise ToolError(after_send, f"{where}: error {exc.code}: {exc.message}") from None
    except (TimeoutError, concurrent.futures.TimeoutError):
        raise ToolError(after_send, f"{where}: no answer within {limit}s") from None
    except Exception as exc:
        raise broken_answer(exc, where, write=write) from None


# How the MCP client says an answer broke the tool's own output schema (mcp.client.session).
_SHAPE_BROKEN = (
    "Invalid structured content returned by tool",
    "has an output schema but did not return structured content",
)


def broken_answer(exc: Exception, where: str, *, write: bool) -> ToolError:
    """The class of a call that broke after it was sent. An answer that does not match the
    schema the server declares for it is API drift for a read (it will not parse next time
    either); for a write the call was answered, so it may have happened: unknown outcome,
    reconciled by key. Anything else is a broken connection."""
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, RuntimeError) and any(part in str(exc) for part in _SHAPE_BROKEN):
        text = f"the answer does not match the tool's output schema: {exc}"
        if not write:
            return ToolError(FailureClass.API_DRIFT, f"{where}: {text}")
        return ToolError(FailureClass.UNKNOWN_OUTCOME, f"{where}: {text}")
    after_send = FailureClass.UNKNOWN_OUTCOME if write else FailureClass.TRANSIENT
    return ToolError(after_send, f"{where}: the connection broke: {text}")

"""The generic HTTP tool adapter: what each way a call can fail means for a write.

A call that never left (refused, connect timeout) did not happen; one that went out and got no
answer (read timeout, a connection dropped after sending) may have, so for a write it is an
unknown outcome that reconciliation settles, never a retry. Real sockets, no database.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx2
import pytest

from runs import tools
from runs.tools import CallContext, ToolError, http_request, http_tool
from taskpilots.httpclient import SharedClient


class Receiver:
    """An HTTP/1.1 (keep-alive) JSON endpoint that records requests and the connections used."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.connections: set[tuple[str, int]] = set()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                receiver.connections.add(self.client_address)
                receiver.requests.append(
                    {
                        "method": self.command,
                        "path": self.path,
                        "headers": dict(self.headers),
                        "body": json.loads(body) if body else None,
                    }
                )
                payload = json.dumps({"id": f"ext-{len(receiver.requests)}"}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.send_header("Set-Cookie", "session=from-the-first-call; Path=/")
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = _answer

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Silent:
    """A TCP server that reads the request and then either never answers or hangs up."""

    def __init__(self, *, hang_up: bool) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.received = threading.Event()
        self.hang_up = hang_up
        self.done = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with self.listener.accept()[0] as conn:
            conn.recv(65536)
            self.received.set()
            if not self.hang_up:
                self.done.wait(10)

    def close(self) -> None:
        self.done.set()
        self.listener.close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    yield server
    server.close()


def ctx(timeout: float = 2.0) -> CallContext:
    return CallContext(
        idempotency_key="tp-run-1-refund", run_id="run-1", step="refund", attempt=1, timeout=timeout
    )


def failure(call) -> ToolError:
    with pytest.raises(ToolError) as caught:
        call()
    return caught.value


def refused_url() -> str:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}/refund"


@pytest.mark.parametrize("write", [True, False])
def test_a_refused_connection_is_an_outage_for_reads_and_writes(write):
    error = failure(lambda: http_request("POST", refused_url(), body={}, timeout=2, write=write))
    # Nothing reached the server: even a write did not happen.
    assert error.failure_class == "outage"
    assert "connection refused" in error.message


@pytest.mark.parametrize("write, expected", [(True, "unknown_outcome"), (False, "transient")])
def test_no_answer_after_sending_is_unknown_for_a_write(write, expected):
    silent = Silent(hang_up=False)
    try:
        error = failure(lambda: http_request("POST", silent.url, body={}, timeout=0.3, write=write))
    finally:
        silent.close()
    assert silent.received.is_set()
    assert (error.failure_class, error.message) == (
        expected,
        f"no answer from {silent.url[7:]} within 0.3s",
    )


@pytest.mark.parametrize("write, expected", [(True, "unknown_outcome"), (False, "transient")])
def test_a_connection_dropped_after_sending_is_unknown_for_a_write(write, expected):
    silent = Silent(hang_up=True)
    try:
        error = failure(lambda: http_request("POST", silent.url, body={}, timeout=2, write=write))
    finally:
        silent.close()
    assert silent.received.is_set()
    assert error.failure_class == expected
    assert "broke" in error.message


@pytest.mark.parametrize(
    "exc, expected",
    [
        (httpx2.ConnectTimeout("connect timed out"), "transient"),
        (httpx2.PoolTimeout("no connection free"), "transient"),
        (httpx2.ConnectError("[Errno -2] Name or service not known"), "outage"),
        (httpx2.UnsupportedProtocol("ftp"), "invalid_input"),
        (httpx2.WriteTimeout("write timed out"), "unknown_outcome"),
        (httpx2.WriteError("broken pipe"), "unknown_outcome"),
        (httpx2.RemoteProtocolError("server disconnected"), "unknown_outcome"),
    ],
)
def test_each_transport_failure_of_a_write_has_its_class(monkeypatch, exc, expected):
    def fail(request):
        raise exc

    monkeypatch.setattr(tools, "_http_client", SharedClient(transport=httpx2.MockTransport(fail)))
    error = failure(
        lambda: http_request("POST", "http://tickets.test/update", body={}, timeout=1, write=True)
    )
    assert error.failure_class == expected


def test_a_write_carries_the_key_run_and_step(receiver):
    tool = http_tool("refund", "POST", receiver.url + "/refund", side_effect=True)

    result = tool.invoke({"amount": 5}, ctx())

    assert result.external_id == "ext-1"
    sent = receiver.requests[0]
    assert (sent["method"], sent["path"], sent["body"]) == ("POST", "/refund", {"amount": 5})
    assert sent["headers"]["Idempotency-Key"] == "tp-run-1-refund"
    assert (sent["headers"]["X-TaskPilots-Run"], sent["headers"]["X-TaskPilots-Step"]) == (
        "run-1",
        "refund",
    )


def test_a_read_sends_query_parameters_and_no_key(receiver):
    tool = http_tool("lookup", "GET", receiver.url + "/lookup")

    tool.invoke({"email": "ada@example.com"}, ctx())

    sent = receiver.requests[0]
    assert sent["path"] == "/lookup?email=ada%40example.com" and sent["body"] is None
    assert "Idempotency-Key" not in sent["headers"]


def test_calls_share_a_connection_but_never_a_cookie(receiver):
    tool = http_tool("lookup", "GET", receiver.url + "/lookup")

    for _ in range(3):
        tool.invoke({"q": "x"}, ctx())

    # One pooled connection for all three calls (the receiver keeps it alive)...
    assert len(receiver.connections) == 1
    # ...and a cookie one call was given is not sent by the next (another run, another tool).
    assert all("Cookie" not in sent["headers"] for sent in receiver.requests)


def test_a_forked_child_builds_its_own_client(monkeypatch):
    shared = SharedClient()
    parent = shared()
    assert shared() is parent
    # In a child after fork the pid differs: the parent's pooled sockets are not used.
    monkeypatch.setattr("os.getpid", lambda: -1)
    assert shared() is not parent

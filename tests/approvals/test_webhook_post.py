"""The webhook sender itself (approvals.notifications.post_json), against a real socket: it
reads a bounded part of the answer, follows no redirect, and calls a non-2xx a failure."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from approvals import notifications


class Answer:
    """A server that answers every connection with `head`, then `body`, then stalls."""

    def __init__(self, head: bytes, body: bytes = b"") -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/hook"
        self.head, self.body = head, body
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with self.listener.accept()[0] as conn:
            conn.recv(65536)
            conn.sendall(self.head + self.body)
            self.stop.wait(10)

    def close(self) -> None:
        self.stop.set()
        self.listener.close()


@pytest.fixture(autouse=True)
def local_hooks_allowed(settings):
    # The test servers listen on 127.0.0.1, which webhooks may reach only when it is named.
    settings.TASKPILOTS = {**settings.TASKPILOTS, "NOTIFY_ALLOWED_HOSTS": ["127.0.0.1"]}


@pytest.fixture
def answer() -> Iterator[type[Answer]]:
    servers: list[Answer] = []

    def start(head: bytes, body: bytes = b"") -> Answer:
        servers.append(Answer(head, body))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def test_a_huge_answer_is_read_only_up_to_the_limit(answer):
    # Announces 100 MB, sends 1 MiB and stalls: reading it all would time out.
    limit = notifications.WEBHOOK_MAX_RESPONSE_BYTES
    server = answer(b"HTTP/1.1 200 OK\r\nContent-Length: 100000000\r\n\r\n", b"x" * (16 * limit))

    assert notifications.post_json(server.url, {"text": "hi"}, timeout=1) == 200


def test_a_redirect_is_refused_without_following_it(answer):
    server = answer(
        b"HTTP/1.1 307 Temporary Redirect\r\nLocation: http://10.0.0.1/\r\n"
        b"Content-Length: 0\r\n\r\n"
    )

    with pytest.raises(notifications.DeliveryError, match="redirecting to http://10.0.0.1/"):
        notifications.post_json(server.url, {"text": "hi"}, timeout=1)


def test_an_error_status_is_a_failure(answer):
    server = answer(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n")

    with pytest.raises(RuntimeError, match="answered 500"):
        notifications.post_json(server.url, {"text": "hi"}, timeout=1)

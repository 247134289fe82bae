"""The API behind the real production server (gunicorn, as `make run` and docs/deploy.md start
it), for what the test client cannot show: chunked request bodies as gunicorn hands them over,
and the requests gunicorn refuses itself before Django runs."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import subprocess
import sys
import time

import pytest

from runs.api.models import ApiClient, ApiScope
from runs.models import Run
from taskpilots.evidence.workers import ROOT, database_url

pytestmark = pytest.mark.django_db(transaction=True)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def server(django_db_setup):
    """gunicorn on a free port against the test database; yields (host, port)."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env.update(
        DATABASE_URL=database_url(),
        TASKPILOTS_TESTING="1",
        TASKPILOTS_DISPATCH="none",
        TASKPILOTS_WORKFLOW_MODULES="taskpilots.demo.tools,tests.runs.flows",
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "taskpilots.wsgi", "--bind", f"127.0.0.1:{port}",
         "--config", "python:taskpilots.gunicorn_conf", "--workers", "1", "--no-control-socket"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    process.kill()
                    output = process.communicate()[0]
                    raise RuntimeError(f"gunicorn did not start:\n{output}") from None
                time.sleep(0.1)
        yield "127.0.0.1", port
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()


@pytest.fixture
def token(db):
    _, credentials = ApiClient.issue("server-agent", ApiScope.values)
    return credentials.token


def post_chunked(server, path: str, body: bytes, token: str) -> tuple[int, dict]:
    connection = http.client.HTTPConnection(*server, timeout=20)
    chunks = (body[i : i + 16 * 1024] for i in range(0, len(body), 16 * 1024))
    # The server may answer (413) and close before the rest is sent.
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        connection.request(
            "POST", f"/api/v1{path}", body=chunks, encode_chunked=True,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json",
                     "Transfer-Encoding": "chunked"},
        )  # fmt: skip
    response = connection.getresponse()
    data = json.loads(response.read())
    connection.close()
    return response.status, data


def test_a_chunked_start_reaches_the_api_whole(server, token):
    body = json.dumps(
        {"workflow": "test.kb", "business_key": "chunked-1", "input": {"q": "x" * 20_000}}
    ).encode()
    status, data = post_chunked(server, "/runs", body, token)
    assert status == 201, data
    assert Run.objects.get(pk=data["id"]).input == {"q": "x" * 20_000}


def test_an_oversized_chunked_body_is_413_in_the_error_format(server, token):
    body = json.dumps({"workflow": "test.kb", "business_key": "chunked-2",
                       "input": {"q": ["x" * 1000] * 600}}).encode()  # fmt: skip
    status, data = post_chunked(server, "/runs", body, token)
    assert status == 413 and data["error"]["code"] == "body_too_large"
    assert Run.objects.count() == 0


def get(server, path: str, headers: dict) -> tuple[int, str, dict]:
    connection = http.client.HTTPConnection(*server, timeout=20)
    connection.request("GET", path, headers=headers)
    response = connection.getresponse()
    body = response.read()
    connection.close()
    return response.status, response.getheader("Content-Type"), json.loads(body)


def test_headers_over_gunicorns_limit_are_431_json(server, token):
    # gunicorn refuses a header line over 8190 bytes before Django sees the request.
    status, content_type, data = get(server, "/api/v1/runs", {"X-Padding": "x" * 9000})
    assert (status, content_type) == (431, "application/json")
    assert data["error"]["code"] == "headers_too_large"


def test_a_request_line_over_gunicorns_limit_is_414_json(server):
    status, content_type, data = get(server, "/api/v1/runs?workflow=" + "x" * 5000, {})
    assert (status, content_type) == (414, "application/json")
    assert data["error"]["code"] == "uri_too_long"


def test_headers_under_gunicorns_limit_but_over_the_apis_are_431_json(server, token):
    headers = {f"X-Padding-{i}": "x" * 4000 for i in range(5)}
    status, content_type, data = get(server, "/api/v1/runs", headers)
    assert (status, content_type) == (431, "application/json")

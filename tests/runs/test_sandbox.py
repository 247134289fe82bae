"""The sandbox process: ledger, dedupe and lookup switches, fault modes, restarts.

These tests talk to a real server process over HTTP and need no database.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import pytest

from taskpilots.sandbox.client import SandboxClient, SandboxProcess, SandboxResponse, start_sandbox
from tests.worker import wait_for

MAIL = {"to": "ada@example.com", "subject": "Your refund", "body": "It is on its way."}


@pytest.fixture(scope="module")
def sandbox() -> Iterator[SandboxProcess]:
    with start_sandbox() as process:
        yield process


@pytest.fixture
def client(sandbox: SandboxProcess) -> SandboxClient:
    sandbox.client.reset(config=True)
    return sandbox.client


def in_background(client: SandboxClient, timeout: float) -> threading.Thread:
    """Send a mail from a thread whose caller expects it to fail (timeout, dropped connection)."""

    def call() -> None:
        with contextlib.suppress(OSError):
            send_mail(client, timeout=timeout)

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    return thread


def wait_until_in_flight(client: SandboxClient) -> None:
    """The background request has reached the sandbox: it took its one-shot fault and sleeps."""
    wait_for(lambda: client.faults() == [], timeout=10, what="the request to reach the sandbox")


def send_mail(client: SandboxClient, key: str = "key-1", **kw: object) -> SandboxResponse:
    return client.write("mail", "send", MAIL, key=key, run="run-1", step="notify", **kw)


# --- commits, dedupe, lookup --------------------------------------------------------------------


def test_it_records_a_commit_with_key_run_and_step(client: SandboxClient) -> None:
    response = send_mail(client)

    assert response.status == 200
    assert response.json["status"] == "sent"
    assert response.json["id"].startswith("msg_")
    [entry] = client.ledger(system="mail")
    assert entry["idempotency_key"] == "key-1"
    assert (entry["run"], entry["step"]) == ("run-1", "notify")
    assert entry["action"] == "send"
    assert entry["request"] == MAIL
    assert entry["external_id"] == response.json["id"]
    assert entry["response"] == response.json


def test_a_system_that_dedupes_commits_a_repeated_key_once(client: SandboxClient) -> None:
    body = {"ticket_id": "T-1", "status": "solved"}
    first = client.write("tickets", "update", body, key="tk-1")
    second = client.write("tickets", "update", body, key="tk-1")

    assert second.status == 200
    assert second.replayed
    assert not first.replayed
    assert second.json == first.json
    assert len(client.ledger(system="tickets", key="tk-1")) == 1


def test_a_system_without_dedupe_commits_a_repeated_key_twice(client: SandboxClient) -> None:
    # mail does not dedupe: a blind retry sends a second message. The ledger keeps run+step, so
    # the duplicate is visible even if the engine had regenerated the key.
    send_mail(client)
    second = send_mail(client)

    assert not second.replayed
    entries = client.ledger(run="run-1")
    assert len(entries) == 2
    assert {(entry["run"], entry["step"]) for entry in entries} == {("run-1", "notify")}


def test_the_dedupe_switch_is_configurable_and_persisted(
    client: SandboxClient, sandbox: SandboxProcess
) -> None:
    assert client.configure("mail", dedupes=True) == {
        "system": "mail",
        "dedupes": True,
        "lookup": True,
    }
    sandbox.restart()

    send_mail(client)
    assert send_mail(client).replayed
    assert len(client.ledger(system="mail")) == 1


def test_lookup_by_key_finds_a_committed_write(client: SandboxClient) -> None:
    sent = send_mail(client)

    found = client.lookup("mail", "key-1")
    assert found.status == 200
    assert found.json["found"] is True
    assert found.json["id"] == sent.json["id"]
    assert found.json["response"] == sent.json

    missing = client.lookup("mail", "never-sent")
    assert missing.status == 404
    assert missing.json == {"found": False}


def test_lookup_answers_501_where_the_system_cannot_look_up(client: SandboxClient) -> None:
    assert client.lookup("crm", "any").status == 501
    assert client.lookup("tickets", "any").status == 501

    client.configure("crm", lookup=True)
    assert client.lookup("crm", "any").status == 404


def test_reads_reflect_committed_writes(client: SandboxClient) -> None:
    created = client.write("crm", "create", {"email": "Ada@Example.com", "name": "Ada"}, key="c1")
    contact_id = created.json["id"]
    client.write("crm", "tag", {"contact_id": contact_id, "tag": "vip"}, key="c2")

    contact = client.read("crm", "lookup", {"email": "ada@example.com"}).json
    assert contact["found"] is True
    assert contact["contact"]["id"] == contact_id
    assert contact["contact"]["tags"] == ["vip"]
    assert client.read("crm", "lookup", {"email": "bob@example.com"}).json["found"] is False

    client.write("tickets", "update", {"ticket_id": "T-9", "comment": "Called back"}, key="t1")
    ticket = client.read("tickets", "get", {"ticket_id": "T-9"}).json
    assert ticket["comments"] == ["Called back"]
    assert ticket["status"] == "open"


def test_a_refund_can_be_voided_once(client: SandboxClient) -> None:
    refund = client.write("payments", "refund", {"payment_id": "pay_1", "amount": 12.5}, key="r1")
    refund_id = refund.json["id"]

    voided = client.write("payments", "void", {"refund_id": refund_id}, key="v1")
    assert voided.status == 200
    assert voided.json["status"] == "voided"
    # A compensation regenerated with a fresh key is refused, not silently repeated.
    again = client.write("payments", "void", {"refund_id": refund_id}, key="v2")
    assert again.status == 409
    unknown = client.write("payments", "void", {"refund_id": "re_nope"}, key="v3")
    assert (unknown.status, unknown.json["field"]) == (422, "refund_id")
    assert len(client.ledger(system="payments")) == 2


# --- input and permission errors ----------------------------------------------------------------


def test_a_write_without_idempotency_key_is_refused(client: SandboxClient) -> None:
    response = client.write("mail", "send", MAIL, key=None)

    assert response.status == 400
    assert response.json["field"] == "Idempotency-Key"
    assert client.ledger() == []


@pytest.mark.parametrize(
    ("system", "action", "body", "field"),
    [
        ("mail", "send", {"to": "ada@example.com", "body": "hi"}, "subject"),
        ("mail", "send", {**MAIL, "to": "not-an-address"}, "to"),
        ("payments", "refund", {"payment_id": "pay_1", "amount": 0}, "amount"),
        ("payments", "refund", {"amount": 5}, "payment_id"),
        ("tickets", "update", {"ticket_id": "T-1", "status": "bogus"}, "status"),
        ("crm", "tag", {"contact_id": "con_1"}, "tag"),
    ],
)
def test_invalid_input_is_422_with_the_field(
    client: SandboxClient, system: str, action: str, body: dict, field: str
) -> None:
    response = client.write(system, action, body, key="k")

    assert response.status == 422
    assert response.json["field"] == field
    assert response.json["error"]
    assert client.ledger() == []


def test_permission_errors_are_401_and_403(client: SandboxClient) -> None:
    denied = send_mail(client, headers={"Authorization": "Bearer deny"})
    forbidden = send_mail(client, headers={"X-Sandbox-Deny": "1"})
    read_forbidden = client.read("kb", "search", {"q": "refund"}, headers={"X-Sandbox-Deny": "1"})

    assert denied.status == 401
    assert forbidden.status == 403
    assert read_forbidden.status == 403
    assert client.ledger() == []


def test_wrong_method_is_405_and_unknown_path_404(client: SandboxClient) -> None:
    assert client.request("GET", "/mail/send").status == 405
    assert client.request("GET", "/mail/nope").status == 404


# --- faults -------------------------------------------------------------------------------------


def test_latency_delays_and_then_commits(client: SandboxClient) -> None:
    client.inject("mail", "latency", latency_ms=200)

    started = time.monotonic()
    assert send_mail(client).status == 200
    assert time.monotonic() - started >= 0.2
    assert len(client.ledger()) == 1


def test_503_and_429_commit_nothing(client: SandboxClient) -> None:
    client.inject("mail", "503")
    client.inject("mail", "429", seconds=3)

    assert send_mail(client).status == 503
    throttled = send_mail(client)
    assert throttled.status == 429
    assert throttled.headers["retry-after"] == "3"
    assert client.ledger() == []
    # Both faults were used up: the third call goes through.
    assert send_mail(client).status == 200


def test_a_fault_applies_count_times_and_only_to_its_action(client: SandboxClient) -> None:
    client.inject("crm", "503", action="create", count=2)

    assert client.read("crm", "lookup", {"email": "ada@example.com"}).status == 200
    statuses = [
        client.write("crm", "create", {"email": "a@b.co"}, key=f"k{i}").status for i in range(3)
    ]
    assert statuses == [503, 503, 200]


def test_a_fault_with_count_minus_one_lasts_until_cleared(client: SandboxClient) -> None:
    client.inject("mail", "503", count=-1)
    assert [send_mail(client, key=f"k{i}").status for i in range(3)] == [503, 503, 503]

    client.clear_faults()
    assert send_mail(client).status == 200


def test_reset_drops_the_connection_without_committing(client: SandboxClient) -> None:
    client.inject("mail", "reset")

    with pytest.raises(ConnectionError):
        send_mail(client)
    assert client.ledger() == []


def test_commit_then_500_commits_exactly_once(client: SandboxClient) -> None:
    client.inject("mail", "commit_then_500")

    response = send_mail(client)

    assert response.status == 500
    # The caller saw an error but the write landed: only a lookup by key can tell.
    assert len(client.ledger(key="key-1")) == 1
    assert client.lookup("mail", "key-1").json["found"] is True


def test_timeout_before_commit_commits_nothing(client: SandboxClient) -> None:
    client.inject("mail", "timeout_before_commit", seconds=0.3)
    assert send_mail(client, timeout=3).status == 504

    client.inject("mail", "timeout_before_commit", seconds=1)
    with pytest.raises(TimeoutError):
        send_mail(client, key="key-2", timeout=0.2)
    assert client.ledger() == []


def test_commit_then_timeout_commits_but_the_caller_times_out(client: SandboxClient) -> None:
    client.inject("mail", "commit_then_timeout", seconds=1)

    with pytest.raises(TimeoutError):
        send_mail(client, timeout=0.2)
    assert len(client.ledger(key="key-1")) == 1


def test_a_fault_can_be_requested_per_request_by_header(client: SandboxClient) -> None:
    assert send_mail(client, headers={"X-Sandbox-Fault": "commit_then_500"}).status == 500
    assert send_mail(client, headers={"X-Sandbox-Fault": "bogus"}).status == 422
    assert len(client.ledger()) == 1


def test_an_outage_answers_503_until_it_expires(client: SandboxClient) -> None:
    client.inject("kb", "outage", seconds=0.4)

    down = client.read("kb", "search", {"q": "refund"})
    assert down.status == 503
    assert down.headers["x-sandbox-outage"] == "1"
    # The FAQ is the degraded fallback and stays up.
    assert client.read("kb", "faq", {"q": "refund"}).status == 200

    deadline = time.monotonic() + 3
    while client.read("kb", "search", {"q": "refund"}).status == 503:
        assert time.monotonic() < deadline, "outage did not expire"
        time.sleep(0.05)
    assert client.faults() == []


def test_a_sleeping_request_does_not_block_others(client: SandboxClient) -> None:
    client.inject("mail", "timeout_before_commit", seconds=2)
    slow = in_background(client, timeout=0.5)
    wait_until_in_flight(client)

    started = time.monotonic()
    assert client.health()
    assert client.read("kb", "search", {"q": "refund"}).status == 200
    assert time.monotonic() - started < 0.5
    slow.join()


def test_admin_reset_clears_ledger_and_faults_but_keeps_config(client: SandboxClient) -> None:
    client.configure("crm", dedupes=True)
    client.inject("mail", "503", count=-1)
    client.write("crm", "create", {"email": "a@b.co"}, key="k")

    client.reset()

    assert client.ledger() == []
    assert client.faults() == []
    assert client.config()["crm"]["dedupes"] is True
    client.reset(config=True)
    assert client.config()["crm"]["dedupes"] is False


# --- process lifecycle --------------------------------------------------------------------------


def test_the_ledger_survives_a_restart_and_a_kill(
    client: SandboxClient, sandbox: SandboxProcess
) -> None:
    sent = send_mail(client)
    url = sandbox.url

    sandbox.restart()
    assert sandbox.url == url
    assert [entry["external_id"] for entry in client.ledger()] == [sent.json["id"]]

    send_mail(client, key="key-2")
    sandbox.kill()
    with pytest.raises(ConnectionRefusedError):
        send_mail(client, key="key-3")
    sandbox.restart()
    assert len(client.ledger()) == 2


def test_stop_does_not_wait_for_sleeping_requests(
    client: SandboxClient, sandbox: SandboxProcess
) -> None:
    client.inject("mail", "timeout_before_commit", seconds=30)
    slow = in_background(client, timeout=5)
    wait_until_in_flight(client)

    started = time.monotonic()
    sandbox.stop()
    assert time.monotonic() - started < 2
    slow.join()
    sandbox.start()
    assert client.ledger() == []


def test_start_fails_with_the_servers_stderr(tmp_path) -> None:
    # A directory where the database file should be makes sqlite fail at startup.
    (tmp_path / "db").mkdir()
    with pytest.raises(RuntimeError, match="stderr"):
        start_sandbox(db_path=tmp_path / "db")

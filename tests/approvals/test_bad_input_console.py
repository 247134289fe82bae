"""Bad input to the console (issue 32 §3): every one is a form error the person reads, answered
without a 500, and nothing is written — days with no end in every date filter, JSON that
PostgreSQL or the parser cannot take, NUL and invisible characters in names and free text,
edits the tool's schema refuses, webhooks to private addresses, presence for runs that do not
exist."""

from __future__ import annotations

import io
import json
import socket
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest
from django.core.cache import cache
from django.core.management import CommandError, call_command
from django.db import connection
from django.urls import reverse

from approvals import live, notifications
from approvals.models import (
    ApprovalRequest,
    HumanDecision,
    NotificationChannel,
    NotificationDelivery,
    ToolPause,
)
from approvals.models.bulk import BulkAction
from approvals.viewer_time import SESSION_ZONE
from runs import engine, workflows
from runs.models import Run, Step, TimelineEvent
from runs.workflows import Workflow, approval, compute
from tests.approvals.console_helpers import (  # noqa: F401  (fast_passwords is autouse)
    approval_run,
    fast_passwords,
    fresh,
    invalid_data_run,
)

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "run-main"}
PAUSE, RESUME = "/console/rules/tools/pause/", "/console/rules/tools/resume/"
CHANNELS = "/console/rules/channels/"


def counts() -> dict[str, int]:
    """The rows a refused request must not have written."""
    return {
        "runs": Run.objects.count(),
        "timeline": TimelineEvent.objects.count(),
        "decisions": HumanDecision.objects.count(),
        "bulk": BulkAction.objects.count(),
        "pauses": ToolPause.objects.count(),
        "channels": NotificationChannel.objects.count(),
        "deliveries": NotificationDelivery.objects.count(),
    }


def text_of(response) -> str:
    return response.content.decode()


def in_zone(client, zone: str) -> None:
    session = client.session
    session[SESSION_ZONE] = zone
    session.save()


# --------------------------------------------------------------------------------------------
# 1. Days with no end (or no start) in every date filter


DAY_PAGES = [
    (reverse("console:run-list"), 200),
    (reverse("console:audit"), 200),
    (reverse("console:audit-export", args=["jsonl"]), 422),
    (reverse("console:audit-export", args=["csv"]), 422),
]


@pytest.mark.parametrize(("page", "status"), DAY_PAGES)
@pytest.mark.parametrize("name", ["date_from", "date_to"])
def test_the_last_day_of_the_calendar_is_a_form_error_on_every_page(
    client, admin_user, page, status, name
):
    client.force_login(admin_user)
    run = approval_run()
    before = counts()
    response = client.get(page, {name: "9999-12-31"})
    assert response.status_code == status
    assert "9999-12-31 is outside the dates runs can be searched by." in text_of(response)
    assert str(run.pk) not in text_of(response)  # nothing listed or exported
    assert counts() == before


@pytest.mark.parametrize(("page", "status"), DAY_PAGES)
def test_a_first_day_that_starts_before_year_one_in_the_viewers_zone_is_a_form_error(
    client, admin_user, page, status
):
    # Midnight of 0001-01-01 in Shanghai (local mean time then: UTC+8:05) is in year 0 in UTC.
    client.force_login(admin_user)
    in_zone(client, "Asia/Shanghai")
    response = client.get(page, {"date_from": "0001-01-01"})
    assert response.status_code == status
    assert "0001-01-01 is outside the dates runs can be searched by." in text_of(response)


def test_the_days_around_them_still_filter(client, admin_user):
    client.force_login(admin_user)
    run = approval_run()
    response = client.get(
        reverse("console:run-list"), {"date_from": "0001-01-01", "date_to": "9999-12-30"}
    )
    assert response.status_code == 200
    assert str(run.pk)[:8] in text_of(response)


def test_the_bulk_form_refuses_a_day_with_no_end(client, support_user):
    client.force_login(support_user)
    before = counts()
    response = client.post(reverse("console:bulk-preview"), {"action": "retry",
                                                             "date_to": "9999-12-31"})  # fmt: skip
    assert response.status_code == 422
    assert "9999-12-31 is outside the dates runs can be searched by." in text_of(response)
    assert counts() == before


# --------------------------------------------------------------------------------------------
# 2. JSON typed by a person, NUL and invisible characters


def post_action(client, run, action, data):
    body = {"expected_version": fresh(run).lock_version, **data}
    return client.post(reverse("console:run-action", args=[run.pk, action]), body, **HTMX)


BAD_RESULTS = [
    ("NaN", "NaN is not a number JSON can hold"),
    ('{"total": 1e400}', "1e400 is not a number JSON can hold"),
    ("-Infinity", "-Infinity is not a number JSON can hold"),
    ('{"id": "a\\u0000b"}', "The JSON holds a NUL character"),
    ('"\\ud800"', "The JSON holds an unpaired surrogate"),
    ('{"note": "\\udc00 alone"}', "The JSON holds an unpaired surrogate"),
    ("[" * 100_000 + "]" * 100_000, "The JSON is nested deeper than 20 levels."),
    ("[" * 21 + "]" * 21, "The JSON is nested deeper than 20 levels."),
    ('{"id": 1, "id": 2}', "appears twice in one object"),
    ('{"id": "' + "x" * 40_000 + '"}', "A string in the JSON is longer than 32768 characters."),
    ("{not json", "This is not valid JSON"),
]


@pytest.mark.parametrize(("result", "message"), BAD_RESULTS)
def test_done_by_hand_with_json_the_database_cannot_take_is_a_form_error(
    client, sandbox, support_user, result, message
):
    run = invalid_data_run()
    client.force_login(support_user)
    step_before = Step.objects.filter(run=run).values_list("pk", "status", "result")
    step_before = sorted(step_before)
    before = counts()
    response = post_action(client, run, "complete", {"result": result})
    assert response.status_code == 422
    assert message in text_of(response)
    assert counts() == before
    assert sorted(Step.objects.filter(run=run).values_list("pk", "status", "result")) == step_before


def test_done_by_hand_with_good_json_is_still_recorded(client, sandbox, support_user):
    run = invalid_data_run()
    client.force_login(support_user)
    result = {"id": "T-1", "amount": 1e308, "note": "退款 ✓", "big": 10**30}
    response = post_action(client, run, "complete", {"result": json.dumps(result)})
    assert response.status_code == 200, text_of(response)[:2000]
    assert HumanDecision.objects.filter(run=run, verb="complete_by_hand").exists()


@pytest.fixture
def search_approval(support_user):
    """An approval of kb.search, a tool without flat parameters: edited as one JSON object."""
    workflows.register(
        Workflow("test.console_bad_search", 1, [
            approval("approve", tool="kb.search", params=lambda ctx: {"q": ctx.input["q"]}),
            compute("done", lambda ctx: ctx.results["approve"]["params"]),
        ]),
        replace=True,
    )  # fmt: skip
    run, _ = engine.start_run("test.console_bad_search", {"q": "refunds"})
    run = engine.run_until_quiet(run.pk)
    return run, ApprovalRequest.objects.get(run=run)


@pytest.mark.parametrize(
    ("params", "message"),
    [('{"q": NaN}', "NaN is not a number JSON can hold"),
     ('{"q": "a", "q": "b"}', "appears twice in one object"),
     ('{"q": "\\u0000"}', "The JSON holds a NUL character"),
     ('{"q": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested deeper than 20 levels"),
     ('["q"]', "Give a JSON object."),
     ('{"q": ""}', "q: "),
     ('{"q": 7}', "q: 7 is not of type")],
)  # fmt: skip
def test_edited_json_parameters_are_checked_by_the_same_parser_and_schema(
    client, support_user, search_approval, params, message
):
    run, pending = search_approval
    client.force_login(support_user)
    before = counts()
    response = post_action(client, run, "approve_edits", {"approval": pending.pk,
                                                          "params_json": params})  # fmt: skip
    assert response.status_code == 422
    assert message in text_of(response)
    assert ApprovalRequest.objects.get(pk=pending.pk).status == "pending"
    assert counts() == before


@pytest.mark.parametrize(
    ("fields", "message"),
    [({"param__amount": "-5"}, "less than or equal to the minimum of 0"),
     ({"param__amount": "0"}, "less than or equal to the minimum of 0"),
     ({"param__amount": "1e308"}, "greater than the maximum of 1000000000"),
     ({"param__amount": "1e400"}, "Enter a number."),
     ({"param__amount": "NaN"}, "Enter a number."),
     ({"param__payment_id": "   "}, "payment_id: "),
     ({"param__payment_id": ""}, "This field is required.")],
)  # fmt: skip
def test_edits_the_tools_schema_forbids_are_form_errors(client, support_user, fields, message):
    run = approval_run()
    pending = ApprovalRequest.objects.get(run=run)
    client.force_login(support_user)
    before = counts()
    data = {"approval": pending.pk, "param__payment_id": "pay_1", "param__amount": "120",
            **fields}  # fmt: skip
    response = post_action(client, run, "approve_edits", data)
    assert response.status_code == 422
    assert message in text_of(response)
    assert ApprovalRequest.objects.get(pk=pending.pk).status == "pending"
    assert counts() == before


@pytest.mark.parametrize(
    ("data", "message"),
    [({"tool": "mail.send", "reason": "bounce\x00storm"}, "Null characters are not allowed."),
     ({"tool": "mail\x00send", "reason": "x"}, "Null characters are not allowed."),
     ({"tool": "mail.send\u202e", "reason": "x"}, "U+202E (RIGHT-TO-LEFT OVERRIDE)"),
     ({"tool": "mail.send\u3164", "reason": "x"}, "U+3164 (HANGUL FILLER)")],
)  # fmt: skip
def test_a_tool_pause_with_a_nul_or_an_invisible_character_is_a_form_error(
    client, admin_user, data, message
):
    client.force_login(admin_user)
    before = counts()
    response = client.post(PAUSE, data)
    assert response.status_code == 422
    assert message in text_of(response)
    assert counts() == before


@pytest.mark.parametrize("tool", ["mail\x00send", "mail.send\u2028"])
def test_a_tool_resume_with_a_nul_or_an_invisible_character_is_a_form_error(
    client, admin_user, tool
):
    client.force_login(admin_user)
    assert client.post(PAUSE, {"tool": "mail.send", "reason": "storm"}).status_code == 302
    before = counts()
    response = client.post(RESUME, {"tool": tool})
    assert response.status_code == 422
    assert ToolPause.objects.get().resumed_at is None
    assert counts() == before


@pytest.mark.parametrize(
    ("data", "message"),
    [({"action": "cancel", "comment": "storm\x00"}, "Null characters are not allowed."),
     ({"action": "retry", "workflow": "test\x00reply"}, "Null characters are not allowed."),
     ({"action": "retry", "tool": "mail.send\u202e"}, "U+202E"),
     ({"action": "retry", "queue": "support\u200b"}, "U+200B"),
     ({"action": "retry", "step": "send\u0007"}, "U+0007"),
     ({"action": "reassign", "to": "sam\x00"}, "Null characters are not allowed.")],
)  # fmt: skip
def test_the_bulk_form_refuses_nul_and_invisible_characters(client, admin_user, data, message):
    client.force_login(admin_user)
    before = counts()
    response = client.post(reverse("console:bulk-preview"), data)
    assert response.status_code == 422
    assert message in text_of(response)
    assert counts() == before


# --------------------------------------------------------------------------------------------
# 8. Webhooks to loopback and private addresses (SSRF)

PRIVATE_URLS = [
    "http://127.0.0.1/hook",
    "http://localhost:8080/hook",
    "http://2130706433/hook",  # 127.0.0.1 in decimal
    "http://0x7f.1/hook",  # in hex
    "http://0177.0.0.1/hook",  # in octal
    "http://127.1/hook",
    "http://[::1]/hook",
    "http://[::ffff:127.0.0.1]/hook",  # IPv4-mapped
    "http://[::ffff:a00:1]/hook",  # IPv4-mapped 10.0.0.1
    "http://[64:ff9b::a9fe:a9fe]/hook",  # NAT64 of 169.254.169.254
    "http://[2002:7f00:1::]/hook",  # 6to4 of 127.0.0.1
    "http://10.0.0.5/hook",
    "http://172.16.3.4/hook",
    "http://192.168.1.1/hook",
    "http://169.254.169.254/latest/meta-data/",
    "http://[fe80::1]/hook",
    "http://[fc00::1]/hook",
    "http://224.0.0.1/hook",
    "http://[ff02::1]/hook",
    "http://0.0.0.0/hook",
    "http://[::]/hook",
    "http://240.0.0.1/hook",  # reserved
    "http://100.64.0.1/hook",  # shared address space
]


@pytest.mark.parametrize("url", PRIVATE_URLS)
def test_a_channel_to_a_private_or_local_address_is_refused(client, admin_user, url):
    client.force_login(admin_user)
    response = client.post(CHANNELS, {"queue": "ops", "kind": "webhook", "target": url,
                                      "enabled": "on"})  # fmt: skip
    assert response.status_code == 422
    assert "webhooks go to public addresses only" in text_of(response)
    assert not NotificationChannel.objects.exists()


@pytest.mark.parametrize("queue", ["ops\u200b", "ops\u3164", "o\u202eps"])
def test_a_channel_for_a_queue_name_with_an_invisible_character_is_refused(
    client, admin_user, queue
):
    client.force_login(admin_user)
    response = client.post(CHANNELS, {"queue": queue, "kind": "email", "target": "a@example.com",
                                      "enabled": "on"})  # fmt: skip
    assert response.status_code == 422
    assert "an invisible or control character" in text_of(response)
    assert not NotificationChannel.objects.exists()


def test_a_channel_for_a_queue_nothing_routes_to_is_refused_unless_new(client, admin_user):
    # "supprot" was saved without a word, never notified anyone, and was then offered as a
    # queue to move runs to.
    client.force_login(admin_user)
    data = {"queue": "supprot", "kind": "email", "target": "a@example.com", "enabled": "on"}
    response = client.post(CHANNELS, data)
    assert response.status_code == 422
    assert "No rule or workflow sends runs to the queue “supprot”." in text_of(response)
    assert "Did you mean “support”?" in text_of(response)
    assert not NotificationChannel.objects.exists()
    assert client.post(CHANNELS, {**data, "new_queue": "on"}).status_code == 302
    assert NotificationChannel.objects.get().queue == "supprot"


def test_a_public_address_and_an_allowed_host_are_accepted(client, admin_user, settings, dns):
    client.force_login(admin_user)
    data = {"queue": "ops", "kind": "webhook", "enabled": "on"}
    assert client.post(CHANNELS, {**data, "target": "https://93.184.215.14/x"}).status_code == 302
    settings.TASKPILOTS = {**settings.TASKPILOTS, "NOTIFY_ALLOWED_HOSTS": ["chat.internal"]}
    dns.answers["chat.internal"] = "10.1.2.3"
    assert client.post(CHANNELS, {**data, "target": "http://chat.internal/x"}).status_code == 302
    assert NotificationChannel.objects.count() == 2


class Receiver:
    """A webhook receiver on 127.0.0.1 that records each request's Host header and body."""

    def __init__(self):
        self.received: list[tuple[str, dict]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.received.append((self.headers["Host"], json.loads(body)))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_port
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    server = Receiver()
    yield server
    server.close()


@pytest.fixture
def dns(monkeypatch):
    """What the DNS answers for some names (the test may change it), and who asked."""
    answers: dict[str, str] = {}
    calls: list[str] = []
    real = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):
        if host not in answers:
            return real(host, port, *args, **kwargs)
        calls.append(host)
        family = socket.AF_INET6 if ":" in answers[host] else socket.AF_INET
        return [(family, socket.SOCK_STREAM, 6, "", (answers[host], port))]

    monkeypatch.setattr(notifications.socket, "getaddrinfo", getaddrinfo)
    return SimpleNamespace(answers=answers, calls=calls)


def queued_delivery(url: str) -> NotificationDelivery:
    channel = NotificationChannel.objects.create(queue="support", kind="webhook", target=url)
    run = approval_run()
    notifications.record(run.pk, notifications.QUEUED, "support", 1)
    return NotificationDelivery.objects.get(channel=channel)


def test_a_host_that_resolves_to_a_private_address_by_send_time_gets_nothing(
    client, admin_user, receiver, dns
):
    # Saved while its DNS answered with a public address; by the send it answers 127.0.0.1.
    dns.answers["hooks.example.test"] = "93.184.215.14"
    client.force_login(admin_user)
    url = f"http://hooks.example.test:{receiver.port}/hook"
    response = client.post(CHANNELS, {"queue": "support", "kind": "webhook", "target": url,
                                      "enabled": "on"})  # fmt: skip
    assert response.status_code == 302
    dns.answers["hooks.example.test"] = "127.0.0.1"
    run = approval_run()
    notifications.record(run.pk, notifications.QUEUED, "support", 1)
    delivery = NotificationDelivery.objects.get()
    assert notifications.deliver(delivery.pk) == "failed"
    delivery.refresh_from_db()
    assert "public addresses only" in delivery.last_error
    assert receiver.received == []


def test_a_channel_stored_before_the_rule_is_refused_at_send_time(receiver):
    delivery = queued_delivery(f"http://127.0.0.1:{receiver.port}/hook")
    assert notifications.deliver(delivery.pk) == "failed"
    assert receiver.received == []


def test_the_send_connects_to_the_address_it_checked(receiver, monkeypatch, dns):
    # The name is resolved once; the request goes to that address with the URL's Host header,
    # so a second DNS answer (here: a private address) is never used.
    dns.answers["hooks.example.test"] = "127.0.0.1"
    checked: list[str] = []
    kind = notifications.address_kind

    def as_public_once(address):
        # The test's receiver must be reachable: its address counts as public, once.
        checked.append(str(address))
        dns.answers["hooks.example.test"] = "10.9.9.9"
        return "" if str(address) == "127.0.0.1" else kind(address)

    monkeypatch.setattr(notifications, "address_kind", as_public_once)
    url = f"http://hooks.example.test:{receiver.port}/hook"
    assert notifications.post_json(url, {"text": "hi"}, timeout=2) == 200
    assert dns.calls == ["hooks.example.test"] and checked == ["127.0.0.1"]
    assert receiver.received == [(f"hooks.example.test:{receiver.port}", {"text": "hi"})]


def test_an_allowed_host_is_posted_to(receiver, settings):
    settings.TASKPILOTS = {**settings.TASKPILOTS, "NOTIFY_ALLOWED_HOSTS": ["127.0.0.1"]}
    delivery = queued_delivery(f"http://127.0.0.1:{receiver.port}/hook")
    assert notifications.deliver(delivery.pk) == "sent"
    assert len(receiver.received) == 1


# --------------------------------------------------------------------------------------------
# 9. Presence is kept only for runs that exist


def cache_rows() -> int | None:
    """Rows of the database cache (where presence lives on a fresh machine), if it is one."""
    if "DatabaseCache" not in type(cache).__name__:
        return None
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {connection.ops.quote_name(cache._table)}")
        return cursor.fetchone()[0]


def test_polling_a_run_that_does_not_exist_is_404_and_stores_no_presence(client, support_user):
    client.force_login(support_user)
    missing = uuid.uuid4()

    rows = cache_rows()
    for _ in range(3):
        response = client.get(reverse("console:run-live", args=[missing]) + "?v=1")
        assert response.status_code == 404
    assert cache.get(live._presence_key(missing)) is None
    assert cache_rows() == rows
    assert counts()["runs"] == 0


def test_the_new_form_errors_read_in_chinese(client, admin_user, sandbox):
    zh = {"HTTP_ACCEPT_LANGUAGE": "zh-Hans"}
    client.force_login(admin_user)
    response = client.get(reverse("console:run-list"), {"date_to": "9999-12-31"}, **zh)
    assert "9999-12-31 超出了可用于搜索运行的日期范围。" in text_of(response)
    run = invalid_data_run()
    body = {"expected_version": fresh(run).lock_version, "result": '{"a": 1, "a": 2}'}
    url = reverse("console:run-action", args=[run.pk, "complete"])
    response = client.post(url, body, **HTMX, **zh)
    assert response.status_code == 422
    assert "在同一个对象中出现了两次" in text_of(response)


def test_a_metrics_window_ending_on_the_last_day_of_the_calendar_is_a_400(client, auditor_user):
    client.force_login(auditor_user)
    window = "window=custom&start=9999-12-30&end=9999-12-31"
    page = client.get(f"/console/metrics/?{window}")
    assert page.status_code == 400
    assert "9999-12-31 is outside the dates the metrics cover." in text_of(page)
    response = client.get(f"/console/metrics.json?{window}")
    assert response.status_code == 400 and response.json()["error"]["code"] == "bad_window"


def test_an_export_to_the_last_day_of_the_calendar_says_so(db):
    with pytest.raises(CommandError, match="outside the dates runs can be searched by"):
        call_command("export_audit", "--to", "9999-12-31", stdout=io.StringIO())


@pytest.mark.parametrize("char", ["\u3164", "\u2800", "\u034f", "\u2028", "\u202e"])
def test_an_in_process_start_refuses_an_invisible_session_reference(db, char):
    with pytest.raises(engine.StartError, match="session_context_ref contains U\\+"):
        engine.start_run("test.kb", {"q": "x"}, session_context_ref=f"chat{char}1")
    assert not Run.objects.exists()

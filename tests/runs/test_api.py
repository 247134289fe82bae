"""The HTTP API: idempotent starts, reads, events and signed webhooks, human actions from other
tools, and refusal of bad input with nothing written."""

from __future__ import annotations

import io
import json
import threading
import time
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db import connections
from django.test import Client
from django.utils import timezone

from approvals import actions
from approvals.models import ApprovalRequest, HumanDecision
from runs import engine, workflows
from runs.api.auth import sign
from runs.api.models import ApiClient, ApiScope, PersonalToken
from runs.models import InboundEvent, Run, SideEffect, Step, TimelineEvent
from runs.workflows import Workflow, compute, wait_event
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


def _order_input(data: dict) -> dict:
    if not isinstance(data.get("order"), str):
        raise ValueError("order must be a string")
    return data


# Waits for `order.paid` correlated by the order id (no external system needed).
workflows.register(
    Workflow(
        "test.api_order",
        1,
        [
            compute("accept", lambda ctx: {"order": ctx.input["order"]}, stage="accept"),
            wait_event("paid", "order.paid", correlation=lambda ctx: ctx.input["order"],
                       timeout=timedelta(hours=1), stage="payment"),
            compute("ship", lambda ctx: {"shipped": ctx.results["paid"]["amount"]}),
        ],
        validate_input=_order_input,
    ),
    replace=True,
)  # fmt: skip

ALL_SCOPES = ApiScope.values


@pytest.fixture
def agent(db):
    client, credentials = ApiClient.issue("billing-agent", ALL_SCOPES)
    client.credentials = credentials
    return client


def bearer(client_or_token) -> dict:
    token = getattr(getattr(client_or_token, "credentials", None), "token", client_or_token)
    return {"Authorization": f"Bearer {token}"}


class Api:
    """A tiny wrapper: JSON in, (status, JSON) out."""

    def __init__(self, headers: dict | None = None):
        self.http = Client()
        self.headers = headers or {}

    def call(self, method, path, body=None, *, raw: bytes | None = None, headers=None):
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        kwargs = {"headers": {**self.headers, **(headers or {})}}
        if data is not None:
            kwargs.update(data=data, content_type="application/json")
        response = getattr(self.http, method)(f"/api/v1{path}", **kwargs)
        content = response.content
        return response.status_code, (json.loads(content) if content else None)

    def post(self, path, body=None, **kw):
        return self.call("post", path, body, **kw)

    def get(self, path, **kw):
        return self.call("get", path, **kw)


@pytest.fixture
def api(agent):
    return Api(bearer(agent))


def personal(user, scopes=ALL_SCOPES) -> Api:
    """The API as `user`, with a personal token (the person, not a name in the body)."""
    _, issued = PersonalToken.issue(user, "test", scopes)
    return Api(bearer(issued.token))


def start_body(key="order-1", order="o-1", **extra):
    return {"workflow": "test.api_order", "input": {"order": order}, "business_key": key, **extra}


def signed_headers(client: ApiClient, body: bytes, *, timestamp=None, secret=None) -> dict:
    timestamp = int(time.time()) if timestamp is None else timestamp
    return {
        "X-TaskPilots-Client": client.client_id,
        "X-TaskPilots-Timestamp": str(timestamp),
        "X-TaskPilots-Signature": sign(secret or client.credentials.signing_secret, timestamp,
                                       body),
    }  # fmt: skip


def post_signed(agent, body: dict, **kw):
    raw = json.dumps(body).encode()
    return Api().post("/events", raw=raw, headers=signed_headers(agent, raw, **kw))


def waiting_run(api, order="o-1"):
    status, data = api.post("/runs", start_body(key=f"key-{order}", order=order))
    assert status == 201
    run = engine.run_until_quiet(data["id"])
    assert run.status == "waiting"
    return run


# --------------------------------------------------------------------------------------------
# Starting runs


class TestStartRun:
    def test_it_starts_a_run_attributed_to_the_client(self, api):
        status, data = api.post("/runs", start_body())
        assert status == 201
        run = Run.objects.get(pk=data["id"])
        assert (run.workflow, run.business_key, run.principal) == (
            "test.api_order", "order-1", "api:billing-agent")  # fmt: skip
        created = TimelineEvent.objects.get(run=run, verb="run.created")
        assert created.actor == "api:billing-agent"
        assert data["status"] == "pending" and data["rehydration"]["run_id"] == str(run.pk)

    def test_the_same_key_and_input_again_returns_the_existing_run(self, api):
        _, first = api.post("/runs", start_body())
        status, again = api.post("/runs", start_body())
        assert status == 200 and again["id"] == first["id"]
        assert Run.objects.count() == 1

    def test_the_same_key_with_other_input_is_a_conflict(self, api):
        _, first = api.post("/runs", start_body())
        status, data = api.post("/runs", start_body(order="o-2"))
        assert status == 409
        assert data["error"]["code"] == "business_key_conflict"
        assert data["error"]["field"] == "business_key"
        assert data["error"]["run_id"] == first["id"]
        assert Run.objects.count() == 1

    def test_the_same_key_with_another_workflow_is_a_conflict(self, api):
        # A key names one request to one workflow; it must never answer with a run of another.
        _, first = api.post("/runs", start_body())
        status, data = api.post("/runs", {**start_body(), "workflow": "test.kb"})
        assert status == 409, data
        assert data["error"]["code"] == "business_key_conflict"
        assert data["error"]["run_id"] == first["id"]
        assert "another workflow" in data["error"]["message"]
        assert Run.objects.count() == 1

    def test_another_version_named_explicitly_is_a_conflict(self, api):
        for version in (1, 2):
            workflows.register(
                Workflow("test.api_versioned", version, [compute("a", lambda ctx: 1)]),
                replace=True,
            )
        try:
            body = {"workflow": "test.api_versioned", "input": {}, "business_key": "v"}
            assert api.post("/runs", {**body, "version": 1})[0] == 201
            assert api.post("/runs", {**body, "version": 1})[0] == 200
            assert api.post("/runs", {**body, "version": 2})[0] == 409
        finally:
            workflows.unregister("test.api_versioned", 1)
            workflows.unregister("test.api_versioned", 2)

    def test_a_client_without_read_scope_does_not_get_another_clients_run(self, api):
        _, first = api.post("/runs", start_body())
        _, credentials = ApiClient.issue("writer", [ApiScope.RUNS_WRITE])
        writer = Api(bearer(credentials.token))
        status, data = writer.post("/runs", start_body())
        assert status == 409, data
        assert data["error"]["code"] == "business_key_conflict"
        assert "run_id" not in data["error"]
        assert first["id"] not in json.dumps(data)
        assert Run.objects.count() == 1

    def test_a_client_without_read_scope_gets_its_own_run_again(self, db):
        _, credentials = ApiClient.issue("writer", [ApiScope.RUNS_WRITE])
        writer = Api(bearer(credentials.token))
        status, first = writer.post("/runs", start_body())
        assert status == 201
        status, again = writer.post("/runs", start_body())
        assert status == 200 and again["id"] == first["id"]
        status, data = writer.post("/runs", start_body(order="o-2"))
        assert status == 409 and data["error"]["run_id"] == first["id"]

    def test_an_unknown_workflow_or_version_is_refused_naming_the_field(self, api):
        status, data = api.post("/runs", {**start_body(), "workflow": "nope"})
        assert status == 422 and data["error"]["field"] == "workflow"
        status, data = api.post("/runs", start_body(version=9))
        assert status == 422 and data["error"]["field"] == "version"
        assert Run.objects.count() == 0

    def test_input_the_workflow_rejects_is_422_on_input(self, api):
        status, data = api.post("/runs", {**start_body(), "input": {"order": 5}})
        assert status == 422
        assert data["error"] == {
            "code": "invalid_input",
            "message": "invalid input for test.api_order: order must be a string",
            "field": "input",
        }
        assert Run.objects.count() == 0

    def test_a_whole_number_written_with_a_fraction_is_an_integer(self, api):
        # JSON has one number type and JSON Schema calls 1.0 an integer; strings stay refused.
        assert api.post("/runs", start_body(version=1.0))[0] == 201
        for version in (1.5, "1", True):
            status, data = api.post("/runs", start_body(key="k2", version=version))
            assert (status, data["error"]["field"]) == (422, "version")

    @pytest.mark.parametrize(
        ("body", "field"),
        [
            ({"workflow": "test.api_order", "input": [], "business_key": "k"}, "input"),
            ({"workflow": "test.api_order", "input": {}, "business_key": 7}, "business_key"),
            ({"workflow": "test.api_order", "input": {}, "business_key": "k", "version": "1"},
             "version"),
            ({"workflow": "test.api_order", "input": {}, "business_key": "k", "extra": 1},
             "extra"),
            ({"workflow": "test.api_order", "input": {}}, "business_key"),
            ({"workflow": "test.api_order", "input": {}, "business_key": "k" * 201},
             "business_key"),
        ],
    )  # fmt: skip
    def test_wrong_types_and_missing_fields_are_422_naming_the_field(self, api, body, field):
        status, data = api.post("/runs", body)
        assert status == 422, data
        assert data["error"]["field"] == field
        assert Run.objects.count() == 0


class TestHostileBodies:
    """Bodies that must be refused before they reach the database (PostgreSQL cannot store NUL
    or unpaired surrogates in JSON; unbounded depth or size is a denial of service)."""

    @pytest.mark.parametrize(
        ("raw", "status", "code", "field"),
        [
            (b'{"workflow": "\xff\xfe"}', 400, "invalid_utf8", None),
            (b'{"workflow": ', 400, "invalid_json", None),
            (b'{"input": {"customer": "a\\u0000b"}}', 400, "nul_byte", "input.customer"),
            (b'{"input": {"c": "\\ud800"}}', 400, "invalid_utf8", "input.c"),
            (b'{"input": {"bad\\u0000key": 1}}', 400, "nul_byte", "input.bad\x00key"),
            (b'{"input": {"n": NaN}}', 400, "invalid_json", None),
            (b'{"input": {"n": 1e999}}', 400, "invalid_json", None),
            (b'{"input": ' + b'[' * 30 + b']' * 30 + b'}', 400, "too_deep", None),
            (b'[1, 2]', 422, "invalid_type", None),
        ],
    )  # fmt: skip
    def test_it_refuses_malformed_bodies_in_one_format(self, api, raw, status, code, field):
        got, data = api.post("/runs", raw=raw)
        assert (got, data["error"]["code"]) == (status, code), data
        if field is not None:
            assert data["error"]["field"] == field
        assert Run.objects.count() == 0

    def test_deep_nesting_names_where_it_got_too_deep(self, api):
        nested: dict = {}
        cursor = nested
        for _ in range(25):
            cursor["x"] = {}
            cursor = cursor["x"]
        status, data = api.post("/runs", {**start_body(), "input": nested})
        assert status == 400 and data["error"]["code"] == "too_deep"
        assert data["error"]["field"].startswith("input.x.x")

    def test_overlong_strings_are_refused(self, api):
        status, data = api.post("/runs", {**start_body(), "input": {"note": "x" * 40_000}})
        assert status == 400
        assert data["error"] == {
            "code": "string_too_long",
            "message": "A string is longer than 32768 characters.",
            "field": "input.note",
        }

    def test_a_body_over_the_limit_is_413_without_writing(self, api):
        status, data = api.post("/runs", {**start_body(), "input": {"b": ["x" * 1000] * 300}})
        assert status == 413 and data["error"]["code"] == "body_too_large"
        assert Run.objects.count() == 0


class TestInvisibleCharacters:
    """Keys and identifiers are matched exactly and shown to people: a right-to-left override
    rendered a key reversed in the console, and a zero-width space made a second run."""

    CHARACTERS = ["\u202e", "\u200b", "\u0007", "\ufeff", "\U000e0041", "\u2066", "\u0085"]

    @pytest.mark.parametrize("char", CHARACTERS)
    @pytest.mark.parametrize("field", ["business_key", "workflow", "session_context_ref"])
    def test_a_start_with_one_in_an_identifier_is_422(self, api, field, char):
        body = start_body()
        body[field] = f"order{char}-1"
        status, data = api.post("/runs", body)
        assert status == 422, data
        assert (data["error"]["code"], data["error"]["field"]) == ("invalid_characters", field)
        assert f"U+{ord(char):04X}" in data["error"]["message"]
        assert Run.objects.count() == 0

    def test_a_zero_width_space_does_not_make_a_second_run(self, api):
        assert api.post("/runs", start_body(key="order-1"))[0] == 201
        assert api.post("/runs", start_body(key="order\u200b-1"))[0] == 422
        assert Run.objects.count() == 1

    @pytest.mark.parametrize("field", ["event_id", "event_type", "correlation_key"])
    def test_event_identifiers_are_checked(self, api, field):
        body = {"event_id": "e-1", "event_type": "order.paid", "correlation_key": "o-1"}
        body[field] = "a\u202eb"
        status, data = api.post("/events", body)
        assert (status, data["error"]["field"]) == (422, field)
        assert InboundEvent.objects.count() == 0

    def test_the_acting_user_is_checked(self, api, support_user):
        run = waiting_run(api)
        status, data = api.post(f"/runs/{run.pk}/cancel", {"reason": "x", "user": "sam\u200b"})
        assert (status, data["error"]["field"]) == (422, "user")
        status, data = api.post("/approvals/1/decision",
                                {"user": "sam-support\u202e", "decision": "approved"})  # fmt: skip
        assert (status, data["error"]["field"]) == (422, "user")

    @pytest.mark.parametrize("name", ["business_key", "workflow", "cursor"])
    def test_query_filters_are_checked(self, api, name):
        status, data = api.get(f"/runs?{name}=a%E2%80%AEb")
        assert status == 422, data
        assert (data["error"]["code"], data["error"]["field"]) == ("invalid_characters", name)

    def test_visible_text_in_any_script_is_accepted(self, api):
        status, _ = api.post("/runs", start_body(key="退款-订单-1042 ünïcödé עברית"))
        assert status == 201

    def test_the_schema_pattern_names_exactly_the_characters_identifiers_may_not_hold(self):
        # Controls and format characters, line and paragraph separators, default-ignorable
        # code points and blank symbols (runs/invisible.py); surrogates never occur alone.
        from runs.api.errors import INVISIBLE_RANGES
        from runs.invisible import forbidden_in_identifier

        found, start = [], None
        for code in range(0x110000):
            hidden = not 0xD800 <= code <= 0xDFFF and forbidden_in_identifier(chr(code))
            if hidden and start is None:
                start = code
            elif not hidden and start is not None:
                found.append((start, code - 1))
                start = None
        assert tuple(found) == INVISIBLE_RANGES


class TestBodyLimitsAndMediaType:
    """What reaches the parser: at most TASKPILOTS_API_MAX_BODY_BYTES of application/json."""

    ENDPOINTS = [
        "/runs",
        "/runs/00000000-0000-0000-0000-000000000000/cancel",
        "/events",
        "/approvals/1/decision",
    ]

    def raw_post(self, path, stream, *, headers=None, **environ):
        return Client().generic(
            "POST", f"/api/v1{path}", data=b"x", content_type="application/json",
            headers=headers, **{"wsgi.input": stream, **environ},
        )  # fmt: skip

    @pytest.mark.parametrize("path", ENDPOINTS)
    def test_a_body_over_a_mebibyte_is_413_before_it_is_read(self, agent, path, caplog):
        # Django refuses to read more than DATA_UPLOAD_MAX_MEMORY_SIZE (1 MiB): that used to
        # surface as a 500 with a traceback, because ninja reads the body before the parser.
        size = 2 * 1024 * 1024
        stream = io.BytesIO(b"{" + b" " * (size - 2) + b"}")
        response = self.raw_post(path, stream, CONTENT_LENGTH=str(size), headers=bearer(agent))
        assert response.status_code == 413
        assert response.json()["error"]["code"] == "body_too_large"
        assert stream.tell() == 0  # not a byte read
        assert "Traceback" not in caplog.text and Run.objects.count() == 0

    @pytest.mark.parametrize("path", ENDPOINTS)
    def test_an_oversized_chunked_body_is_413(self, agent, path):
        # Under WSGI a chunked body has no Content-Length; gunicorn de-chunks it and says the
        # stream ends (wsgi.input_terminated). It used to be read as empty (422 "required").
        stream = io.BytesIO(json.dumps({"input": {"b": ["x" * 1000] * 2000}}).encode())
        response = self.raw_post(
            path, stream, CONTENT_LENGTH="", HTTP_TRANSFER_ENCODING="chunked",
            headers=bearer(agent), **{"wsgi.input_terminated": True},
        )  # fmt: skip
        assert response.status_code == 413, response.content
        assert stream.tell() <= 256 * 1024 + 1  # read no further than the limit

    def test_a_chunked_body_within_the_limit_starts_a_run(self, agent):
        stream = io.BytesIO(json.dumps(start_body()).encode())
        response = self.raw_post(
            "/runs", stream, CONTENT_LENGTH="", HTTP_TRANSFER_ENCODING="chunked",
            headers=bearer(agent), **{"wsgi.input_terminated": True},
        )  # fmt: skip
        assert response.status_code == 201, response.content
        assert Run.objects.get().business_key == "order-1"

    def test_a_chunked_body_a_server_cannot_end_is_411(self, agent):
        stream = io.BytesIO(json.dumps(start_body()).encode())
        response = self.raw_post(
            "/runs", stream, CONTENT_LENGTH="", HTTP_TRANSFER_ENCODING="chunked",
            headers=bearer(agent),
        )  # fmt: skip
        assert response.status_code == 411
        assert response.json()["error"]["code"] == "length_required"

    @pytest.mark.parametrize(
        "content_type",
        ["text/plain", "application/x-www-form-urlencoded", "", "application/json; charset=latin-1",
         "application/jsonx", "multipart/form-data; boundary=x"],
    )  # fmt: skip
    @pytest.mark.parametrize("path", ENDPOINTS)
    def test_anything_but_json_is_415(self, api, path, content_type):
        raw = json.dumps(start_body()).encode()
        response = api.http.generic("POST", f"/api/v1{path}", data=raw,
                                    content_type=content_type, headers=api.headers)  # fmt: skip
        assert response.status_code == 415, response.content
        assert response.json()["error"]["code"] == "unsupported_media_type"
        assert Run.objects.count() == 0

    def test_json_with_a_utf8_charset_is_accepted(self, api):
        raw = json.dumps(start_body()).encode()
        response = api.http.generic("POST", "/api/v1/runs", data=raw,
                                    content_type="Application/JSON; charset=UTF-8",
                                    headers=api.headers)  # fmt: skip
        assert response.status_code == 201, response.content


class TestEveryResponseIsTheErrorFormat:
    """Clients parse one error shape; Django and ninja answer some requests before the API's
    handlers run, in HTML (under DEBUG, a 404 page listing every URL of the project)."""

    @pytest.mark.parametrize("debug", [False, True])
    @pytest.mark.parametrize("path", ["/api/v1/nope", "/api/v1/", "/api/v1/runs/x/y/z"])
    def test_unknown_paths_are_404_json(self, client, settings, debug, path):
        settings.DEBUG = debug
        response = client.get(path)
        assert response.status_code == 404
        assert response["Content-Type"] == "application/json"
        assert response.json()["error"]["code"] == "not_found"
        assert b"urlpatterns" not in response.content and b"console/" not in response.content

    @pytest.mark.parametrize(
        ("method", "path", "allowed"),
        [("delete", "/api/v1/runs", "GET, POST"), ("get", "/api/v1/events", "POST"),
         ("put", "/api/v1/runs/00000000-0000-0000-0000-000000000000/cancel", "POST"),
         ("patch", "/api/v1/approvals/1/decision", "POST")],
    )  # fmt: skip
    def test_wrong_methods_are_405_json_with_allow(self, client, method, path, allowed):
        response = getattr(client, method)(path)
        assert response.status_code == 405
        assert response.json()["error"]["code"] == "method_not_allowed"
        assert sorted(response["Allow"].split(", ")) == sorted(allowed.split(", "))

    def test_oversized_headers_are_431_json(self, api):
        status, data = api.get("/runs", headers={"X-Padding": "x" * 20_000})
        assert status == 431 and data["error"]["code"] == "headers_too_large"

    def test_a_host_that_is_not_allowed_is_400_json(self, client):
        response = client.get("/api/v1/runs", headers={"Host": "evil.example"})
        assert response.status_code == 400
        assert response.json()["error"]["code"] == "bad_request"

    def test_the_console_keeps_its_html_pages(self, client):
        response = client.get("/console/nope/")
        assert response.status_code == 404 and "text/html" in response["Content-Type"]


# --------------------------------------------------------------------------------------------
# Authentication and scopes


class TestAuthentication:
    def test_no_credentials_is_401_in_the_error_format(self, agent):
        status, data = Api().post("/runs", start_body())
        assert status == 401 and data["error"]["code"] == "unauthenticated"

    def test_a_wrong_secret_or_unknown_client_is_401(self, agent):
        wrong = f"{agent.client_id}.not-the-secret"
        assert Api(bearer(wrong)).get("/runs")[0] == 401
        assert Api(bearer("tpc_nobody.secret")).get("/runs")[0] == 401
        assert Api(bearer("no-dot-at-all")).get("/runs")[0] == 401

    def test_a_revoked_client_is_401(self, agent, api):
        agent.revoke()
        assert api.get("/runs")[0] == 401

    def test_a_missing_scope_is_403(self, db):
        reader, credentials = ApiClient.issue("reader", [ApiScope.RUNS_READ])
        reader_api = Api(bearer(credentials.token))
        assert reader_api.get("/runs")[0] == 200
        status, data = reader_api.post("/runs", start_body())
        assert status == 403 and data["error"]["code"] == "missing_scope"
        assert Run.objects.count() == 0

    def test_the_secret_is_stored_hashed(self, agent):
        secret = agent.credentials.token.split(".", 1)[1]
        stored = ApiClient.objects.filter(pk=agent.pk).values()[0]
        assert secret not in json.dumps(stored, default=str)
        assert agent.credentials.signing_secret not in json.dumps(stored, default=str)


# --------------------------------------------------------------------------------------------
# Reading runs


class TestReadRuns:
    def test_it_returns_status_and_the_rehydration_document(self, api):
        run = waiting_run(api)
        status, data = api.get(f"/runs/{run.pk}")
        assert status == 200
        assert data["status"] == "waiting"
        assert data["rehydration"]["awaited_event_type"] == "order.paid"
        assert data["rehydration"]["awaited_correlation_key"] == "o-1"

    def test_a_missing_run_is_404_and_a_malformed_id_422(self, api):
        assert api.get("/runs/00000000-0000-0000-0000-000000000000")[0] == 404
        status, data = api.get("/runs/not-a-uuid")
        assert status == 422 and data["error"]["field"] == "run_id"

    def test_it_pages_newest_first_with_an_opaque_cursor(self, api):
        now = timezone.now()
        ids = []
        for i in range(5):
            _, data = api.post("/runs", start_body(key=f"k{i}", order=f"o{i}"))
            ids.append(data["id"])
        # Two runs share a timestamp: the id breaks the tie, nothing is skipped or repeated.
        Run.objects.filter(pk__in=ids[1:3]).update(created_at=now)
        seen = []
        cursor = None
        while True:
            query = "?limit=2" + (f"&cursor={cursor}" if cursor else "")
            status, page = api.get(f"/runs{query}")
            assert status == 200 and len(page["items"]) <= 2
            seen += [item["id"] for item in page["items"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert sorted(seen) == sorted(ids) and len(seen) == 5
        created = [Run.objects.get(pk=i).created_at for i in seen]
        assert created == sorted(created, reverse=True)

    def test_it_filters_by_workflow_status_key_and_time(self, api):
        api.post("/runs", start_body(key="a", order="a"))
        waiting_run(api, order="b")
        status, page = api.get("/runs?status=waiting")
        assert [i["business_key"] for i in page["items"]] == ["key-b"]
        status, page = api.get("/runs?business_key=a&workflow=test.api_order")
        assert [i["business_key"] for i in page["items"]] == ["a"]
        status, page = api.get("/runs?created_after=2999-01-01T00:00:00")
        assert page["items"] == []
        status, page = api.get("/runs?created_before=2999-01-01T00:00:00Z")
        assert len(page["items"]) == 2
        # An offset Python accepts and PostgreSQL does not (found by schemathesis): not a 500.
        status, page = api.get("/runs?created_before=0455-02-22T06%3A57%3A50%2B16%3A25")
        assert status == 200 and page["items"] == []

    @pytest.mark.parametrize(
        ("query", "field"),
        [("cursor=garbage", "cursor"), ("limit=0", "limit"), ("status=nope", "status"),
         ("workflow=a%00b", "workflow")],
    )  # fmt: skip
    def test_bad_query_parameters_name_the_field(self, api, query, field):
        status, data = api.get(f"/runs?{query}")
        assert status in (400, 422) and data["error"]["field"] == field

    @pytest.mark.parametrize(
        "value",
        ["0.5", "1714000000", "2026-05-01", "yesterday", "2026-05-01T12:99:00Z",
         "2026-13-01T00:00:00Z"],
    )  # fmt: skip
    def test_time_filters_take_only_iso_date_times(self, api, value):
        # Pydantic read 0.5 as half a second after 1970: a number is not a date.
        status, data = api.get(f"/runs?created_before={value}")
        assert status == 422, data
        assert data["error"]["field"] == "created_before"

    @pytest.mark.parametrize(
        "value",
        ["2026-05-01T12:00:00Z", "2026-05-01T12:00:00", "2026-05-01t12:00z",
         "2026-05-01 12:00:00.123456%2B02:00", "0001-01-01T00:00:00%2B23:59",
         "9999-12-31T23:59:59-23:59"],
    )  # fmt: skip
    def test_iso_date_times_are_accepted_to_the_edges_of_time(self, api, value):
        assert api.get(f"/runs?created_before={value}")[0] == 200
        assert api.get(f"/runs?created_after={value}")[0] == 200

    @pytest.mark.parametrize(
        "cursor", ["", "abc", "12.xyz", "1." + "0" * 31, "1" * 18 + "." + "0" * 32]
    )
    def test_a_cursor_not_of_the_documented_form_is_400(self, api, cursor):
        status, data = api.get(f"/runs?cursor={cursor}")
        assert (status, data["error"]["code"]) == (400, "invalid_cursor")

    def test_any_cursor_of_the_documented_form_is_a_position(self, api):
        api.post("/runs", start_body())
        assert api.get("/runs?cursor=99999999999999999.ffffffffffffffffffffffffffffffff")[1][
            "items"
        ]
        assert api.get("/runs?cursor=0.00000000000000000000000000000000")[1]["items"] == []

    def test_reading_needs_runs_read(self, db):
        _, credentials = ApiClient.issue("writer", [ApiScope.EVENTS_WRITE])
        assert Api(bearer(credentials.token)).get("/runs")[0] == 403


# --------------------------------------------------------------------------------------------
# Events and signed webhooks


class TestEvents:
    def test_a_signed_event_resumes_the_waiting_run(self, api, agent):
        run = waiting_run(api)
        body = {"event_id": "evt-1", "event_type": "order.paid", "correlation_key": "o-1",
                "payload": {"amount": 40}}  # fmt: skip
        status, data = post_signed(agent, body)
        assert status == 202
        assert data == {"status": "resumed", "event_id": "evt-1", "run_id": str(run.pk)}
        run = engine.run_until_quiet(run.pk)
        assert run.status == "succeeded" and run.result == {"shipped": 40}
        resumed = TimelineEvent.objects.get(run=run, verb="run.resumed")
        assert resumed.actor == "api:billing-agent"

    def test_the_same_event_id_again_is_acknowledged_and_ignored(self, api, agent):
        run = waiting_run(api)
        body = {"event_id": "evt-1", "event_type": "order.paid", "correlation_key": "o-1"}
        assert post_signed(agent, body)[1]["status"] == "resumed"
        events_before = TimelineEvent.objects.filter(run=run).count()
        status, data = post_signed(agent, {**body, "payload": {"amount": 999}})
        assert status == 202 and data["status"] == "duplicate"
        assert TimelineEvent.objects.filter(run=run).count() == events_before
        assert InboundEvent.objects.count() == 1

    def test_an_early_callback_is_kept_and_matched_when_the_wait_appears(self, api):
        # The payment system can answer before the run reaches its wait.
        body = {"event_id": "evt-early", "event_type": "order.paid", "correlation_key": "o-9",
                "payload": {"amount": 7}}  # fmt: skip
        status, data = api.post("/events", body)  # bearer is accepted for events too
        assert (status, data["status"], data["run_id"]) == (202, "stored", None)
        _, started = api.post("/runs", start_body(key="k9", order="o-9"))
        run = engine.run_until_quiet(started["id"])
        assert run.status == "succeeded" and run.result == {"shipped": 7}

    def test_strict_mode_refuses_an_event_nobody_waits_for(self, api, settings):
        settings.TASKPILOTS = {**settings.TASKPILOTS, "EVENTS_STRICT": True}
        body = {"event_id": "evt-x", "event_type": "order.paid", "correlation_key": "nobody"}
        status, data = api.post("/events", body)
        assert status == 404 and data["error"]["code"] == "no_matching_wait"
        assert InboundEvent.objects.count() == 0
        waiting_run(api, order="o-5")
        status, data = api.post("/events", {**body, "correlation_key": "o-5"})
        assert (status, data["status"]) == (202, "resumed")

    def test_refund_settlement_callback_from_the_payment_system(self, api, agent, sandbox):
        status, data = api.post("/runs", {"workflow": "test.refund", "business_key": "rf-1",
                                          "input": {"amount": 50, "payment": "pay_1"}})  # fmt: skip
        run = engine.run_until_quiet(data["id"])
        assert run.status == "waiting"
        refund_id = api.get(f"/runs/{run.pk}")[1]["rehydration"]["awaited_correlation_key"]
        body = {"event_id": "stl-1", "event_type": "payment.settled",
                "correlation_key": refund_id, "payload": {"settled": True}}  # fmt: skip
        assert post_signed(agent, body)[0] == 202
        assert engine.run_until_quiet(run.pk).status == "succeeded"


class TestWebhookSignatures:
    BODY = {"event_id": "evt-s", "event_type": "order.paid", "correlation_key": "o-1"}

    def test_a_stale_timestamp_is_401_and_logged(self, agent, caplog):
        status, data = post_signed(agent, self.BODY, timestamp=int(time.time()) - 301)
        assert status == 401 and data["error"]["code"] == "invalid_signature"
        assert "stale" in caplog.text and agent.client_id in caplog.text
        assert InboundEvent.objects.count() == 0

    def test_a_wrong_signature_is_401(self, agent):
        status, _ = post_signed(agent, self.BODY, secret="whsec_wrong")
        assert status == 401
        assert InboundEvent.objects.count() == 0

    def test_a_signature_over_another_body_is_401(self, agent):
        raw = json.dumps(self.BODY).encode()
        headers = signed_headers(agent, raw)
        tampered = json.dumps({**self.BODY, "correlation_key": "o-2"}).encode()
        assert Api().post("/events", raw=tampered, headers=headers)[0] == 401

    def test_unsigned_or_incomplete_headers_are_401(self, agent):
        assert Api().post("/events", self.BODY)[0] == 401
        raw = json.dumps(self.BODY).encode()
        headers = signed_headers(agent, raw)
        del headers["X-TaskPilots-Timestamp"]
        assert Api().post("/events", raw=raw, headers=headers)[0] == 401

    def test_a_signature_header_is_not_rescued_by_a_bearer_token(self, agent):
        # Any signature header makes it a signed request: a bad one is refused, even when a
        # valid bearer token rides along (schemathesis: "API accepts invalid authentication").
        raw = json.dumps(self.BODY).encode()
        for headers in ({"X-TaskPilots-Signature": ""}, {"X-TaskPilots-Client": "tpc_x"}):
            status, data = Api(bearer(agent)).post("/events", raw=raw, headers=headers)
            assert (status, data["error"]["code"]) == (401, "invalid_signature")
        assert InboundEvent.objects.count() == 0

    def test_a_revoked_client_cannot_sign(self, agent):
        agent.revoke()
        assert post_signed(agent, self.BODY)[0] == 401

    def test_signing_needs_the_events_scope(self, db):
        client, credentials = ApiClient.issue("reader", [ApiScope.RUNS_READ])
        client.credentials = credentials
        assert post_signed(client, self.BODY)[0] == 403

    def test_signatures_survive_a_secret_key_rotation_through_fallbacks(self, agent, settings):
        old_key = settings.SECRET_KEY
        settings.SECRET_KEY = "a-new-secret-key-" + "x" * 40
        assert post_signed(agent, self.BODY)[0] == 401
        settings.SECRET_KEY_FALLBACKS = [old_key]
        assert post_signed(agent, self.BODY)[0] == 202

    def test_an_oversized_signed_body_is_413(self, agent):
        body = {**self.BODY, "payload": {"blob": ["x" * 1000] * 300}}
        status, data = post_signed(agent, body)
        assert status == 413 and data["error"]["code"] == "body_too_large"

    def test_a_rotated_secret_stops_working(self, agent):
        old = agent.credentials
        agent.credentials = agent.rotate_credentials()
        assert post_signed(agent, self.BODY, secret=old.signing_secret)[0] == 401
        assert Api(bearer(old.token)).get("/runs")[0] == 401
        assert post_signed(agent, self.BODY)[0] == 202


# --------------------------------------------------------------------------------------------
# Human actions from other tools


class TestCancel:
    def test_it_cancels_and_attributes_the_call(self, api):
        run = waiting_run(api)
        status, data = api.post(f"/runs/{run.pk}/cancel", {"reason": "customer withdrew"})
        assert status == 200 and data["status"] == "cancelled"
        request = TimelineEvent.objects.get(run=run, verb="api.cancel_requested")
        assert request.actor == "api:billing-agent"

    def test_it_acts_as_the_person_who_authenticated(self, api, support_user):
        run = waiting_run(api)
        status, _ = personal(support_user).post(
            f"/runs/{run.pk}/cancel", {"reason": "dup", "user": support_user.username}
        )
        assert status == 200
        assert TimelineEvent.objects.get(run=run, verb="run.cancelled").actor == "user:sam-support"

    def test_a_client_cannot_act_as_a_person_by_naming_them(self, api, support_user):
        run = waiting_run(api)
        status, data = api.post(
            f"/runs/{run.pk}/cancel", {"reason": "dup", "user": support_user.username}
        )
        assert (status, data["error"]["code"]) == (403, "person_required")
        assert Run.objects.get(pk=run.pk).status == "waiting"

    def test_a_user_outside_support_and_admin_is_403(self, api, auditor_user):
        run = waiting_run(api)
        # An auditor's token cannot carry runs:write (their role does not allow it).
        status, data = personal(auditor_user).post(f"/runs/{run.pk}/cancel", {"reason": "x"})
        assert status == 403 and data["error"]["code"] == "missing_scope"
        assert Run.objects.get(pk=run.pk).status == "waiting"

    def test_cancelling_twice_is_409_and_a_missing_run_404(self, api):
        run = waiting_run(api)
        api.post(f"/runs/{run.pk}/cancel", {"reason": "x"})
        status, data = api.post(f"/runs/{run.pk}/cancel", {"reason": "x"})
        assert status == 409 and "already cancelled" in data["error"]["message"]
        missing = "/runs/00000000-0000-0000-0000-000000000000/cancel"
        assert api.post(missing, {"reason": "x"})[0] == 404

    def test_a_run_an_admin_took_over_is_not_cancelled_for_support(
        self, api, support_user, admin_user
    ):
        # The console refuses this (403); the API named the same user and cancelled the run.
        run = waiting_run(api)
        actions.take_over(run.pk, admin_user)
        status, data = personal(support_user).post(f"/runs/{run.pk}/cancel", {"reason": "x"})
        assert status == 403 and data["error"]["code"] == "taken_over"
        assert data["error"]["field"] == "user"
        assert Run.objects.get(pk=run.pk).status == "taken_over"
        assert not TimelineEvent.objects.filter(run=run, verb="api.cancel_requested").exists()

    def test_a_taken_over_run_is_not_cancelled_without_a_named_user(self, api, admin_user):
        # A takeover means a person handles the run: the client must say who cancels it.
        run = waiting_run(api)
        actions.take_over(run.pk, admin_user)
        status, data = api.post(f"/runs/{run.pk}/cancel", {"reason": "x"})
        assert status == 403 and data["error"]["code"] == "taken_over"
        assert "alex-admin" in data["error"]["message"]
        assert Run.objects.get(pk=run.pk).status == "taken_over"

    def test_the_owner_or_an_admin_cancels_a_taken_over_run(self, api, support_user, admin_user):
        run = waiting_run(api)
        actions.take_over(run.pk, support_user)
        status, _ = personal(support_user).post(f"/runs/{run.pk}/cancel", {"reason": "x"})
        assert status == 200
        other = waiting_run(api, order="o-2")
        actions.take_over(other.pk, support_user)
        status, _ = personal(admin_user).post(f"/runs/{other.pk}/cancel", {"reason": "x"})
        assert status == 200

    def test_a_cancel_without_a_user_is_recorded_as_the_client(self, api):
        run = waiting_run(api)
        assert api.post(f"/runs/{run.pk}/cancel", {"reason": "withdrawn"})[0] == 200
        cancelled = TimelineEvent.objects.get(run=run, verb="run.cancelled")
        assert cancelled.actor == "api:billing-agent"

    @pytest.mark.parametrize("persona", ["owner", "other-support", "admin", "auditor", "outsider"])
    def test_the_console_and_the_api_give_the_same_answer(self, api, client, persona):
        owner = UserFactory(username="owner", groups=["support"])
        users = {
            "owner": owner,
            "other-support": UserFactory(username="other-support", groups=["support"]),
            "admin": UserFactory(username="admin-2", groups=["admin"]),
            "auditor": UserFactory(username="auditor-2", groups=["auditor"]),
            "outsider": UserFactory(username="outsider-2"),
        }
        user = users[persona]
        by_api, by_console = waiting_run(api, order="o-a"), waiting_run(api, order="o-c")
        for run in (by_api, by_console):
            actions.take_over(run.pk, owner)
        api_status, _ = personal(user).post(f"/runs/{by_api.pk}/cancel", {"reason": "x"})
        client.force_login(user)
        version = Run.objects.get(pk=by_console.pk).lock_version
        console_status = client.post(
            f"/console/runs/{by_console.pk}/actions/cancel/",
            {"comment": "x", "expected_version": version},
        ).status_code
        allowed = persona in ("owner", "admin")
        assert (api_status == 200, console_status in (200, 302)) == (allowed, allowed)
        assert Run.objects.get(pk=by_api.pk).status == Run.objects.get(pk=by_console.pk).status

    def test_wrong_method_is_405(self, client):
        assert client.get("/api/v1/events").status_code == 405
        assert client.delete("/api/v1/runs").status_code == 405


class TestApprovalDecision:
    @pytest.fixture
    def approval(self, api):
        _, data = api.post("/runs", {"workflow": "test.refund", "business_key": "rf-2",
                                     "input": {"amount": 150, "payment": "pay_2"}})  # fmt: skip
        run = engine.run_until_quiet(data["id"])
        assert run.status == "needs_human"
        return ApprovalRequest.objects.get(run=run)

    def test_a_support_user_approves_from_another_tool(self, api, approval, support_user):
        body = {"decision": "approved", "comment": "ok"}
        status, data = personal(support_user).post(f"/approvals/{approval.pk}/decision", body)
        assert status == 200
        assert (data["decision"], data["decided_by"], data["run_status"]) == (
            "approved", "sam-support", "running")  # fmt: skip
        verbs = dict(TimelineEvent.objects.filter(run=approval.run_id).values_list("verb", "actor"))
        assert verbs["api.decision_requested"] == "user:sam-support"
        assert verbs["approval.approved"] == "user:sam-support"

    def test_a_client_on_its_own_account_is_nobody_to_approve(self, api, approval, support_user):
        # It once named the user in the body and the decision was recorded as theirs.
        for body in ({"user": "sam-support", "decision": "approved"}, {"decision": "approved"}):
            status, data = api.post(f"/approvals/{approval.pk}/decision", body)
            assert (status, data["error"]["code"]) == (403, "person_required")
        assert ApprovalRequest.objects.get(pk=approval.pk).status == "pending"
        status, data = personal(support_user).post(
            f"/approvals/{approval.pk}/decision", {"user": "alex-admin", "decision": "approved"}
        )
        assert (status, data["error"]["code"]) == (403, "not_this_person")

    def test_a_second_decision_is_409_naming_who_decided(self, api, approval, support_user):
        url = f"/approvals/{approval.pk}/decision"
        sam = personal(support_user)
        sam.post(url, {"decision": "approved"})
        status, data = sam.post(url, {"decision": "rejected"})
        assert status == 409 and "sam-support" in data["error"]["message"]

    def test_users_without_the_role_are_refused(self, api, approval, auditor_user, outsider):
        url = f"/approvals/{approval.pk}/decision"
        for user in (auditor_user, outsider):
            # Their role does not allow approvals:write: their tokens cannot decide.
            status, data = personal(user).post(url, {"decision": "approved"})
            assert (status, data["error"]["code"]) == (403, "missing_scope")
        assert ApprovalRequest.objects.get(pk=approval.pk).status == "pending"

    def test_only_the_owner_or_an_admin_decides_a_taken_over_run(
        self, api, approval, support_user, admin_user
    ):
        other = UserFactory(username="other-support", groups=["support"])
        actions.take_over(approval.run_id, other)
        url = f"/approvals/{approval.pk}/decision"
        status, data = personal(support_user).post(url, {"decision": "approved"})
        assert status == 403 and data["error"]["code"] == "taken_over"
        assert personal(admin_user).post(url, {"decision": "approved"})[0] == 200

    def test_edits_are_validated_and_missing_approvals_404(self, api, approval, support_user):
        url = f"/approvals/{approval.pk}/decision"
        sam = personal(support_user)
        status, data = sam.post(url, {"decision": "approved_with_edits"})
        assert status == 422 and data["error"]["field"] == "edited_params"
        assert sam.post("/approvals/999999/decision", {"decision": "approved"})[0] == 404
        assert sam.post("/approvals/0/decision", {"decision": "approved"})[0] == 422

    @pytest.mark.parametrize(
        ("edited", "field"),
        [({"payment_id": "pay_2", "amount": 150, "bogus": 1}, "edited_params.bogus"),
         ({"bogus": 1}, "edited_params.bogus"),
         ({"payment_id": "pay_2", "amount": "lots"}, "edited_params.amount"),
         ({"payment_id": 2, "amount": 150}, "edited_params.payment_id"),
         ({"payment_id": "pay_2"}, "edited_params.amount")],
    )  # fmt: skip
    def test_edits_the_tool_does_not_accept_are_422_naming_the_parameter(
        self, api, approval, support_user, edited, field
    ):
        # {"bogus": 1} used to be accepted and handed to the tool.
        status, data = personal(support_user).post(
            f"/approvals/{approval.pk}/decision",
            {"decision": "approved_with_edits", "edited_params": edited},
        )
        assert status == 422, data
        assert (data["error"]["code"], data["error"]["field"]) == ("invalid_params", field)
        assert ApprovalRequest.objects.get(pk=approval.pk).status == "pending"
        assert not TimelineEvent.objects.filter(run=approval.run_id,
                                                verb="api.decision_requested").exists()  # fmt: skip

    def test_it_needs_the_approvals_scope(self, approval, support_user):
        status, _ = personal(support_user, [ApiScope.RUNS_WRITE]).post(
            f"/approvals/{approval.pk}/decision", {"decision": "approved"}
        )
        assert status == 403


class TestSettleOutcome:
    """The console's "it happened / it did not" for an unknown outcome, from another tool."""

    @pytest.fixture
    def unknown(self, api, sandbox):
        # The CRM commits the contact, then answers 500: nobody knows whether it happened.
        sandbox.inject("crm", "commit_then_500", action="create")
        lead = {"email": "lee@example.com", "name": "Lee"}
        _, data = api.post("/runs", {"workflow": "test.lead", "business_key": "l", "input": lead})
        run = engine.run_until_quiet(data["id"])
        assert run.status == "needs_human"
        return run

    def url(self, run):
        return f"/runs/{run.pk}/outcome"

    def test_it_happened_with_proof_and_the_run_goes_on(self, api, unknown, support_user):
        effect = SideEffect.objects.get(run=unknown)
        body = {"happened": True, "proof": "crm_123",
                "idempotency_key": effect.idempotency_key, "comment": "found it"}  # fmt: skip
        status, data = personal(support_user).post(self.url(unknown), body)
        assert status == 200, data
        assert data == {
            "run_id": str(unknown.pk), "run_status": "running", "step": "create_contact",
            "idempotency_key": effect.idempotency_key, "happened": True,
            "side_effect_status": "committed",
            "result": {"id": "crm_123", "external_id": "crm_123",
                       "confirmed_by": "user:sam-support"},
        }  # fmt: skip
        effect.refresh_from_db()
        assert (effect.status, effect.external_id) == ("committed", "crm_123")
        decision = HumanDecision.objects.get(run=unknown)
        assert (decision.verb, decision.user, decision.proof) == (
            "confirm_happened", support_user, "crm_123")  # fmt: skip
        verbs = dict(TimelineEvent.objects.filter(run=unknown).values_list("verb", "actor"))
        assert verbs["api.outcome_requested"] == "user:sam-support"
        run = engine.run_until_quiet(unknown.pk)
        assert run.status == "succeeded" and run.result == {"contact": "crm_123"}

    def test_it_did_not_happen_and_the_step_is_tried_again_with_the_same_key(
        self, api, unknown, support_user
    ):
        effect = SideEffect.objects.get(run=unknown)
        status, data = personal(support_user).post(self.url(unknown), {"happened": False})
        assert status == 200, data
        assert (data["side_effect_status"], data["result"]) == ("not_committed", None)
        effect.refresh_from_db()
        assert effect.status == "not_committed"
        step = Step.objects.get(run=unknown, name="create_contact")
        assert step.status == "pending" and step.idempotency_key == effect.idempotency_key

    def test_it_happened_needs_the_proof(self, api, unknown, support_user):
        body = {"happened": True, "proof": "  "}
        status, data = personal(support_user).post(self.url(unknown), body)
        assert (status, data["error"]["field"]) == (422, "proof")
        assert SideEffect.objects.get(run=unknown).status == "unknown"

    def test_the_consoles_rules_apply(self, api, unknown, support_user, auditor_user, admin_user):
        body = {"happened": False}
        status, data = personal(auditor_user).post(self.url(unknown), body)
        assert (status, data["error"]["code"]) == (403, "missing_scope")
        status, data = api.post(self.url(unknown), {**body, "user": support_user.username})
        assert (status, data["error"]["code"]) == (403, "person_required")
        actions.take_over(unknown.pk, admin_user)
        status, data = personal(support_user).post(self.url(unknown), body)
        assert (status, data["error"]["code"]) == (403, "taken_over")
        assert SideEffect.objects.get(run=unknown).status == "unknown"
        assert personal(admin_user).post(self.url(unknown), body)[0] == 200

    def test_another_key_a_settled_outcome_or_none_at_all_is_409(self, api, unknown, support_user):
        body = {"happened": True, "proof": "crm_1"}
        sam = personal(support_user)
        status, data = sam.post(self.url(unknown), {**body, "idempotency_key": "tp-other"})
        assert (status, data["error"]["field"]) == (409, "idempotency_key")
        assert sam.post(self.url(unknown), body)[0] == 200
        status, data = sam.post(self.url(unknown), body)
        assert status == 409 and "no unknown outcome" in data["error"]["message"]
        waiting = waiting_run(api)
        assert sam.post(self.url(waiting), body)[0] == 409
        assert sam.post("/runs/00000000-0000-0000-0000-000000000000/outcome", body)[0] == 404

    def test_it_needs_the_approvals_scope(self, unknown, support_user):
        status, data = personal(support_user, [ApiScope.RUNS_WRITE, ApiScope.RUNS_READ]).post(
            self.url(unknown), {"happened": False}
        )
        assert (status, data["error"]["code"]) == (403, "missing_scope")


# --------------------------------------------------------------------------------------------
# Concurrency


@pytest.mark.django_db(transaction=True)
def test_concurrent_duplicate_starts_create_exactly_one_run(agent):
    # Agents retry on timeouts; parallel retries with one business key must not fork the run.
    barrier = threading.Barrier(8)
    statuses: list[int] = []

    def start():
        try:
            barrier.wait()
            statuses.append(Api(bearer(agent)).post("/runs", start_body(key="race"))[0])
        finally:
            connections.close_all()

    threads = [threading.Thread(target=start) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(statuses) == [200] * 7 + [201]
    assert Run.objects.filter(business_key="race").count() == 1


# --------------------------------------------------------------------------------------------
# Administration: commands, admin, docs


class TestClientAdministration:
    def test_the_command_prints_working_credentials_once(self, capsys):
        call_command("create_api_client", "crm-bridge", "--scopes", "runs:write,events:write")
        out = capsys.readouterr().out
        token = next(line.split()[-1] for line in out.splitlines() if line.startswith("token:"))
        client = ApiClient.objects.get(name="crm-bridge")
        assert client.scopes == ["events:write", "runs:write"]
        assert Api(bearer(token)).post("/runs", start_body())[0] == 201

    def test_bad_scopes_and_duplicate_names_are_refused(self):
        with pytest.raises(CommandError, match="unknown scope"):
            call_command("create_api_client", "x", "--scopes", "runs:everything")
        call_command("create_api_client", "x", "--scopes", "runs:read")
        with pytest.raises(CommandError, match="already exists"):
            call_command("create_api_client", "x", "--scopes", "runs:read")

    def test_revoking_by_command_stops_the_client(self, agent, api, capsys):
        call_command("revoke_api_client", agent.name)
        assert api.get("/runs")[0] == 401
        call_command("create_api_client", agent.name, "--revoke")
        assert "already revoked" in capsys.readouterr().out

    def test_admin_creates_a_client_and_shows_the_secret_once(self, client, admin_user):
        client.force_login(admin_user)
        response = client.post(
            "/admin/runs/apiclient/add/",
            {"name": "ticket-tool", "description": "", "scopes": ["runs:read"]},
        )
        assert response.status_code == 200
        assert "no-store" in response["Cache-Control"]
        api_client = ApiClient.objects.get(name="ticket-tool")
        token = response.context["credentials"].token
        assert token.encode() in response.content
        assert api_client.created_by == admin_user
        assert Api(bearer(token)).get("/runs")[0] == 200
        response = client.get(f"/admin/runs/apiclient/{api_client.pk}/change/")
        assert token.encode() not in response.content

    def test_admin_revoke_action(self, client, admin_user, agent, api):
        client.force_login(admin_user)
        client.post("/admin/runs/apiclient/", {"action": "revoke_clients",
                                               "_selected_action": [agent.pk]})  # fmt: skip
        assert api.get("/runs")[0] == 401


class TestDocs:
    def test_the_openapi_schema_is_served(self, client):
        response = client.get("/api/v1/openapi.json")
        assert response.status_code == 200
        paths = response.json()["paths"]
        assert {"/api/v1/runs", "/api/v1/events", "/api/v1/runs/{run_id}/cancel",
                "/api/v1/approvals/{approval_id}/decision"} <= set(paths)  # fmt: skip

    def test_the_schema_states_the_rules_the_server_enforces(self, client):
        schema = client.get("/api/v1/openapi.json").json()
        components = schema["components"]["schemas"]
        start = components["StartRunIn"]
        assert "test.api_order" in start["properties"]["workflow"]["enum"]
        branch = next(b for b in start["anyOf"]
                      if b["properties"]["workflow"]["const"] == "test.api_order")  # fmt: skip
        assert branch["properties"]["version"]["anyOf"][1] == {"enum": [1]}
        assert "\u202e" in start["properties"]["business_key"]["pattern"]
        assert start["properties"]["input"]["$ref"] == "#/components/schemas/JsonObject"
        assert components["JsonString"]["pattern"] == "^[^\x00]*$"
        version = components["CancelIn"]["properties"]["expected_version"]["anyOf"][0]
        assert (version["type"], version["minimum"]) == ("integer", 0)
        assert components["OutcomeIn"]["then"]["required"] == ["proof"]
        assert components["DecisionIn"]["then"]["required"] == ["edited_params"]
        listing = {
            p["name"]: p["schema"] for p in schema["paths"]["/api/v1/runs"]["get"]["parameters"]
        }
        assert listing["created_before"]["anyOf"][0] == {"type": "string", "format": "date-time"}
        assert listing["cursor"]["anyOf"][0]["pattern"] == "^[0-9]{1,17}\\.[0-9a-f]{32}$"
        for path, item in schema["paths"].items():
            for method, operation in item.items():
                codes = set(operation["responses"])
                assert {"400", "401", "403", "405", "422", "431"} <= codes, (method, path)
                if method == "post":
                    assert {"411", "413", "415"} <= codes, (method, path)

    def test_the_docs_page_is_self_contained_under_the_csp(self, client):
        response = client.get("/api/v1/docs")
        assert response.status_code == 200
        html = response.content.decode()
        assert "POST /api/v1/events" in html and "X-TaskPilots-Signature" in html
        assert "<script" not in html and "cdn" not in html.lower()
        assert "script-src 'self'" in response["Content-Security-Policy"]

"""The session reference a run is started with: accepted by the API and the in-process start,
kept on the run, written into every snapshot, and named missing when there is none."""

from __future__ import annotations

import pytest

from runs import engine
from runs.api.models import ApiClient, ApiScope
from runs.models import Run, Snapshot
from runs.rehydration import rehydration_document
from tests.runs.test_api import Api, bearer

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(db):
    client, credentials = ApiClient.issue("session-agent", ApiScope.values)
    return Api(bearer(credentials.token))


REPLY_INPUT = {"message": "Where is my refund?", "email": "ann@example.com", "ticket": "T-1"}


def start_reply(api, key="reply-1", **extra):
    body = {"workflow": "test.reply", "input": REPLY_INPUT, "business_key": key, **extra}
    return api.post("/runs", body)


def test_an_api_start_with_a_session_ref_puts_it_in_every_snapshot(api, sandbox):
    status, data = start_reply(api, session_context_ref="conv-7/turn-3")
    assert status == 201, data
    assert data["session_context_ref"] == "conv-7/turn-3"
    run = engine.run_until_quiet(data["id"])
    assert run.status == Run.Status.SUCCEEDED
    assert run.session_context_ref == "conv-7/turn-3"
    assert rehydration_document(run)["session_context_ref"] == "conv-7/turn-3"
    snapshots = Snapshot.objects.filter(run=run)
    assert {s.tool for s in snapshots} == {"mail.send", "tickets.update"}
    for snapshot in snapshots:
        assert snapshot.session_context_ref == "conv-7/turn-3"
        assert "session_context_ref" not in snapshot.missing_fields
        assert snapshot.checksum == snapshot.compute_checksum()
    assert api.get(f"/runs/{run.pk}")[1]["session_context_ref"] == "conv-7/turn-3"


def test_an_api_start_without_one_has_snapshots_that_name_it_missing(api, sandbox):
    status, data = start_reply(api)
    assert status == 201, data
    assert data["session_context_ref"] == ""
    run = engine.run_until_quiet(data["id"])
    snapshots = Snapshot.objects.filter(run=run)
    assert snapshots.count() == 2
    for snapshot in snapshots:
        assert snapshot.session_context_ref == ""
        assert "session_context_ref" in snapshot.missing_fields


@pytest.mark.parametrize(
    ("value", "code"),
    [
        ("x" * 201, "invalid_field"),
        ("conv\u202e-1", "invalid_characters"),
        (42, "invalid_field"),
        (None, "invalid_field"),
    ],
)
def test_a_bad_session_ref_is_422_and_starts_nothing(api, value, code):
    status, data = start_reply(api, session_context_ref=value)
    assert status == 422, data
    assert data["error"]["field"] == "session_context_ref"
    assert data["error"]["code"] == code
    assert Run.objects.count() == 0


def test_the_schema_states_the_session_ref():
    schema = Api().get("/openapi.json")[1]
    start = schema["components"]["schemas"]["StartRunIn"]["properties"]["session_context_ref"]
    assert start["maxLength"] == 200 and start["type"] == "string"
    assert "session_context_ref" in schema["components"]["schemas"]["RunOut"]["properties"]


class TestInProcess:
    def test_an_in_process_start_passes_it_to_the_snapshots(self, sandbox):
        run, _ = engine.start_run("test.reply", REPLY_INPUT, session_context_ref="sdk/abc")
        run = engine.run_until_quiet(run.pk)
        assert set(
            Snapshot.objects.filter(run=run).values_list("session_context_ref", flat=True)
        ) == {"sdk/abc"}

    @pytest.mark.parametrize("value", ["y" * 201, "a\u200bb", 7])
    def test_a_bad_one_is_refused_with_nothing_written(self, value):
        with pytest.raises(engine.StartError, match="session_context_ref"):
            engine.start_run("test.reply", REPLY_INPUT, session_context_ref=value)
        assert Run.objects.count() == 0

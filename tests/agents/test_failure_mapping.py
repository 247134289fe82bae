"""How adapter failures map to failure classes where the answer's shape is the problem: an MCP
answer that breaks the tool's own output schema, a server without the method, a model that is
gone. API drift pauses the tool (runs.engine.routing) instead of retrying or asking each run's
person; a write that was answered stays an unknown outcome, reconciled by key."""

from __future__ import annotations

import inspect

import httpx2 as httpx
import mcp.client.session
import openai
import pytest

from runs.agents.mcp_session import _SHAPE_BROKEN, broken_answer
from runs.agents.sdk.runner import _model_failure_class
from runs.models import FailureClass


def test_the_mcp_clients_wording_is_what_we_match():
    # If the client library rewords its errors, this fails before drift goes unnoticed.
    source = inspect.getsource(mcp.client.session)
    for part in _SHAPE_BROKEN:
        assert part in source


@pytest.mark.parametrize(
    ("message", "write", "expected"),
    [
        ("Invalid structured content returned by tool crm_lookup: 'id' is required", False,
         FailureClass.API_DRIFT),
        ("Tool crm_lookup has an output schema but did not return structured content", False,
         FailureClass.API_DRIFT),
        ("Invalid structured content returned by tool send_mail: 'id' is required", True,
         FailureClass.UNKNOWN_OUTCOME),
    ],
)  # fmt: skip
def test_an_answer_that_breaks_its_output_schema(message, write, expected):
    error = broken_answer(RuntimeError(message), "MCP s/t", write=write)
    assert error.failure_class == expected
    assert "output schema" in str(error)


@pytest.mark.parametrize(("write", "expected"), [(False, "transient"), (True, "unknown_outcome")])
def test_other_breaks_after_sending_are_as_before(write, expected):
    error = broken_answer(ConnectionResetError("peer reset"), "MCP s/t", write=write)
    assert error.failure_class == expected and "connection broke" in str(error)


def _status_error(cls, status):
    request = httpx.Request("POST", "https://api.example.com/v1/responses")
    response = httpx.Response(status, request=request)
    return cls("error", response=response, body=None)


@pytest.mark.parametrize(
    ("cls", "status", "expected"),
    [
        (openai.NotFoundError, 404, FailureClass.API_DRIFT),
        (openai.BadRequestError, 400, FailureClass.INVALID_INPUT),
        (openai.AuthenticationError, 401, FailureClass.PERMISSION),
        (openai.RateLimitError, 429, FailureClass.TRANSIENT),
        (openai.InternalServerError, 500, FailureClass.TRANSIENT),
    ],
)
def test_model_failures(cls, status, expected):
    assert _model_failure_class(_status_error(cls, status)) == expected

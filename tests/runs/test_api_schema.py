"""Property-based run of the API against its own OpenAPI schema (schemathesis): whatever an agent
sends — valid or not — the API answers without a 5xx, with a documented status code and content
type, and with a body that matches the documented schema."""

from __future__ import annotations

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from runs.api_models import ApiClient, ApiScope
from taskpilots.wsgi import application

pytestmark = pytest.mark.django_db

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@pytest.fixture
def same_connection():
    # Like Django's test client: keep the test's connection (and its transaction) across the
    # WSGI requests schemathesis makes, so nothing leaks between tests.
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


def test_the_api_conforms_to_its_schema(same_connection):
    _, credentials = ApiClient.issue("fuzzer", ApiScope.values)
    headers = {"Authorization": f"Bearer {credentials.token}"}
    schema = schemathesis.openapi.from_wsgi("/api/v1/openapi.json", application)
    cases = st.one_of(
        schema.as_strategy(GenerationMode.POSITIVE, headers=headers),
        schema.as_strategy(GenerationMode.NEGATIVE, headers=headers),
    )

    @given(case=cases)
    @settings(
        max_examples=300,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    def check(case):
        case.call_and_validate(checks=CHECKS)

    check()

"""Property-based run of the API against its own OpenAPI schema (schemathesis), with every check
schemathesis has (`checks=all`), with a token and without one: whatever an agent sends — valid
or not — the API answers without a 5xx, with a documented status code, content type and body;
refuses what the schema calls invalid; and accepts what the schema calls valid.

The one allowance (tests/runs/schemathesis_hooks.py): a request the schema calls valid may be
refused for what the server's data says about it, with exactly three 422 codes. The same run
against a live server, with the coverage and stateful phases too, is the command in that module
and in docs/api.md.
"""

from __future__ import annotations

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.config import SchemathesisConfig
from schemathesis.specs.openapi.checks import positive_data_acceptance

from runs.api.models import ApiScope, PersonalToken
from taskpilots.wsgi import application
from tests.factories import UserFactory
from tests.runs.schemathesis_hooks import positive_data_acceptance_but_data

pytestmark = pytest.mark.django_db


@pytest.fixture
def same_connection():
    # Like Django's test client: keep the test's connection (and its transaction) across the
    # WSGI requests schemathesis makes, so nothing leaks between tests.
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


def run_schemathesis(headers: dict, max_examples: int) -> None:
    # An explicit config: nothing in the working directory changes what is checked.
    config = SchemathesisConfig.from_dict({})
    schema = schemathesis.openapi.from_wsgi("/api/v1/openapi.json", application, config=config)
    cases = st.one_of(
        schema.as_strategy(GenerationMode.POSITIVE, headers=headers),
        schema.as_strategy(GenerationMode.NEGATIVE, headers=headers),
    )

    @given(case=cases)
    @settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    def check(case):
        # No `checks`: every check schemathesis has, as `--checks all` runs them.
        case.call_and_validate(
            excluded_checks=[positive_data_acceptance],
            additional_checks=[positive_data_acceptance_but_data],
        )

    check()


def test_the_api_conforms_to_its_schema_with_a_token(same_connection):
    # A person's token with every scope: every endpoint, those that act as a person included.
    person = UserFactory(username="fuzzer", groups=["admin"])
    _, issued = PersonalToken.issue(person, "fuzzer", ApiScope.values)
    run_schemathesis({"Authorization": f"Bearer {issued.token}"}, max_examples=300)


def test_the_api_conforms_to_its_schema_without_a_token(same_connection):
    run_schemathesis({}, max_examples=100)

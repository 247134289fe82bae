from __future__ import annotations

import pytest
from django.db import connection

from tests.factories import UserFactory


def pytest_sessionstart(session):
    # A configured service that does not answer is a failure, never a skip.
    import django

    django.setup()
    from taskpilots.views import _check_broker

    status = _check_broker()
    if status != "ok":
        pytest.exit(f"The configured Celery broker does not answer: {status}", returncode=3)


@pytest.fixture
def support_user(db):
    return UserFactory(username="sam-support", groups=["support"])


@pytest.fixture
def auditor_user(db):
    return UserFactory(username="ada-auditor", groups=["auditor"])


@pytest.fixture
def admin_user(db):
    return UserFactory(username="alex-admin", groups=["admin"], is_staff=True, is_superuser=True)


@pytest.fixture
def outsider(db):
    return UserFactory(username="olly-outsider")


@pytest.fixture
def query_count():
    """Count the queries a block runs: `with query_count() as ctx: ...; len(ctx)`."""
    from django.test.utils import CaptureQueriesContext

    return lambda: CaptureQueriesContext(connection)

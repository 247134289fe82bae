from __future__ import annotations

import pytest
from django.conf import settings
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
    # Tests drive the engine by hand unless they start a real worker (tests/worker.py).
    settings.TASKPILOTS["DISPATCH"] = "none"
    # The flush between transactional tests: a TRUNCATE the audit tables' triggers refuse.
    from tests import dbroles

    dbroles.install_flush()
    import tests.runs.flows  # noqa: F401  (registers the test workflows and tools)


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    """The test database as production has it: created and migrated by the owner (the
    configured DATABASE_URL's user), then `manage.py setup_app_role` grants its application
    role, and every connection — this process's, and the workers, gunicorn and commands the
    tests start — acts as that role (tests/dbroles.py). A missing grant fails the tests."""
    from tests import dbroles

    with django_db_blocker.unblock():
        dbroles.use_app_role()
    yield
    with django_db_blocker.unblock():
        dbroles.back_to_owner()  # pytest-django drops the test database as the owner


@pytest.fixture(scope="session")
def sandbox_process(tmp_path_factory):
    """The simulated external systems, as their own process, for the whole session."""
    from taskpilots.sandbox.client import start_sandbox

    process = start_sandbox(db_path=tmp_path_factory.mktemp("sandbox") / "ledger.sqlite3")
    previous = settings.TASKPILOTS["SANDBOX_URL"]
    settings.TASKPILOTS["SANDBOX_URL"] = process.url
    yield process
    settings.TASKPILOTS["SANDBOX_URL"] = previous
    process.close()


@pytest.fixture
def sandbox(sandbox_process):
    """A clean sandbox (empty ledger, default switches, no faults) and its client."""
    client = sandbox_process.client
    client.reset(config=True)
    return client


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


@pytest.fixture(autouse=True)
def _language_back_to_default():
    """A test that activates a language (a request through the locale middleware in the test's
    own thread, translation.activate) must not leave it active for the next: lazy labels and
    the messages built outside requests would come out in it."""
    yield
    from django.utils import translation

    translation.deactivate()

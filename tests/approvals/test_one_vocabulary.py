"""One name per failure class on every page a person reads (issue 33 §4): the inbox said
"System outage / Kept failing / Nothing found / API changed" while the bulk form and the rules
pages said "External outage / Transient (retryable) / Empty result / API version drift"."""

from __future__ import annotations

import pytest

from approvals.console import FAILURE_LABELS
from approvals.models import EscalationRule
from runs.models import FailureClass
from tests.approvals.console_helpers import fast_passwords, visible_text  # noqa: F401

pytestmark = pytest.mark.django_db

# The technical names the model choices keep for the Django admin; never on a console page.
OLD_LABELS = [
    "Transient (retryable)", "External outage", "Invalid input (data uncertainty)",
    "Unknown outcome (side-effect boundary)", "Empty result", "API version drift",
]  # fmt: skip
PAGES = [
    "/console/",
    "/console/runs/",
    "/console/bulk/new/",
    "/console/rules/",
    "/console/rules/new/",
    "/console/rules/?tool=payments.refund&failure_class=api_drift",
    "/console/metrics/",
    "/api/v1/docs",
]


@pytest.fixture
def one_rule_per_class(db):
    for position, cls in enumerate(FailureClass.values, start=1):
        EscalationRule.objects.create(
            name=f"Rule {position}", position=position, failure_class=cls, action="escalate",
            queue="ops",
        )  # fmt: skip


def test_every_page_names_failure_classes_the_same_way(client, admin_user, one_rule_per_class):
    client.force_login(admin_user)
    for url in PAGES:
        response = client.get(url)
        assert response.status_code == 200, url
        html = response.content.decode()
        # As a whole label (an option, a chip, a cell): the rules seeded by migration 0014
        # keep their names ("Empty result: a person checks the data"), which are data.
        for old in OLD_LABELS:
            assert f">{old}<" not in html and f'"{old}"' not in html, (url, old)
    rules = visible_text(client.get("/console/rules/"))
    inbox = client.get("/console/").content.decode()
    for label in FAILURE_LABELS.values():
        assert str(label) in rules, label
        assert f">{label}</option>" in inbox, label


def test_the_bulk_form_and_the_inbox_offer_the_same_reasons(client, admin_user):
    client.force_login(admin_user)
    inbox = client.get("/console/").content.decode()
    bulk = client.get("/console/bulk/new/").content.decode()
    for label in FAILURE_LABELS.values():
        assert f">{label}</option>" in bulk, label
        assert f">{label}</option>" in inbox, label

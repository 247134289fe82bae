"""Counts read as people write them: "1 takeover", "1 attempt", never "1 takeovers"."""

from __future__ import annotations

import pytest

from approvals import actions, rules
from approvals.models import EscalationRule
from tests.approvals.console_helpers import (  # noqa: F401  (fast_passwords is autouse)
    approval_run,
    fast_passwords,
    visible_text,
)

pytestmark = pytest.mark.django_db


def test_the_metrics_page_says_1_takeover(client, sandbox, support_user):
    run = approval_run()
    actions.take_over(run.pk, support_user)
    client.force_login(support_user)
    text = visible_text(client.get("/console/metrics/"))
    assert "1 takeover in 1 run" in text
    assert "1 takeovers" not in text and "in 1 runs" not in text
    approval_run(payment="pay_2")
    assert "1 takeover in 2 runs" in visible_text(client.get("/console/metrics/"))


def test_a_rule_with_one_attempt_says_1_attempt(client, admin_user):
    rule = EscalationRule.objects.create(
        name="Try once", position=1, action="retry", max_attempts=1, queue="ops"
    )
    client.force_login(admin_user)
    text = visible_text(client.get("/console/rules/"))
    assert "1 attempt, " in text and "1 attempts" not in text
    assert "retries up to 1 attempt with exponential backoff" in rules.explain(rule)

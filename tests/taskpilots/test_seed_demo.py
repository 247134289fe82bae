"""`seed_demo` with a real worker and the sandbox: the first call seeds the demo runs, a second
does nothing and says how to seed again, and `--again` adds a second set beside the first with
its own business keys and payment ids (issue 33 §6)."""

from __future__ import annotations

import pytest

import taskpilots.demo.workflows  # noqa: F401  (registers the demo workflows here too)
from approvals.models import EscalationRule
from runs.models import Run
from taskpilots.demo.seed import PREFIX, seed
from tests.factories import UserFactory
from tests.worker import private_workers

pytestmark = [
    pytest.mark.worker,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(400),
]

DEMO_MODULES = "taskpilots.demo.tools,taskpilots.demo.workflows"


def test_seed_then_nothing_then_another_set(sandbox):
    UserFactory(username="admin", groups=["admin"])
    EscalationRule.objects.create(
        position=20, name="Wait out an outage, then escalate", failure_class="outage",
        action="wait", wait_window_seconds=900, probe_interval_seconds=30, queue="ops",
    )  # fmt: skip
    said: list[str] = []
    with private_workers({"TASKPILOTS_WORKFLOW_MODULES": DEMO_MODULES}) as pool:
        pool.start(concurrency=4)
        first = seed(said.append)
        assert first > 20, said
        assert not [line for line in said if "still waiting" in line], said
        said.clear()
        assert seed(said.append) == 0
        assert "seed_demo --again adds another set" in said[0]
        assert seed(said.append, again=True) == 2 * first, said
    demo = Run.objects.filter(business_key__startswith=PREFIX)
    keys = list(demo.values_list("business_key", flat=True))
    assert len(keys) == len(set(keys)) == 2 * first
    assert sum(key.startswith(PREFIX + "2-") for key in keys) == first
    payments = {r.input.get("payment_id") for r in demo.filter(workflow="refund.approval")}
    assert "pay_demo_0" in payments and "pay_demo_2-0" in payments

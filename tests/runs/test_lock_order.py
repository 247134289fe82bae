"""Row locks are taken in one order everywhere (the Run row first, then its Step, then SideEffect,
Wait and ApprovalRequest rows; `Run.lock` in runs/models/run.py), so a person or an API client
acting on a run never deadlocks with a worker executing it.

An API cancel used to lock the run and then the current step while the worker, recording the
step's outcome, held the step and waited for the run (its timeline event locks the run row):
PostgreSQL aborted the worker's transaction and the sweeper recovered the run a minute later.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connections
from django.test import Client

from runs import engine, tools, workflows
from runs.api.models import ApiClient, ApiScope
from runs.models import Run, SideEffect
from runs.tools import LookupResult, python_tool
from runs.workflows import Workflow, compute, side_effect, wait_event

pytestmark = pytest.mark.django_db(transaction=True)

# The receiving side: every call that reached the "external system", by tool and key.
RECEIVED: Counter = Counter()
_received_lock = threading.Lock()


def _receive(tool_name):
    def call(params, ctx):
        with _received_lock:
            RECEIVED[(tool_name, ctx.idempotency_key)] += 1
        return {"id": f"{tool_name}-{ctx.idempotency_key}"}

    return call


def _lookup(tool_name):
    def lookup(key, ctx):
        found = RECEIVED[(tool_name, key)] > 0
        return LookupResult(found=found, external_id=f"{tool_name}-{key}" if found else "")

    return lookup


tools.register(
    python_tool("test.race_charge", _receive("charge"), side_effect=True,
                lookup_fn=_lookup("charge"), compensating_tool="test.race_refund",
                target=lambda p: f"account:{p['account']}", params_schema={"account": str}),
    replace=True,
)  # fmt: skip
tools.register(
    python_tool("test.race_refund", _receive("refund"), side_effect=True,
                lookup_fn=_lookup("refund"), target=lambda p: "account"),
    replace=True,
)  # fmt: skip

RACE = workflows.register(
    Workflow(
        "test.race",
        1,
        [
            compute("a", lambda ctx: 1),
            compute("b", lambda ctx: 2),
            side_effect("charge", "test.race_charge", params=lambda ctx: {"account": "acc-1"}),
            compute("c", lambda ctx: 3),
            side_effect(
                "charge_again", "test.race_charge", params=lambda ctx: {"account": "acc-2"}
            ),  # fmt: skip
            compute("d", lambda ctx: 4),
            compute("e", lambda ctx: 5),
        ],
    ),
    replace=True,
)


workflows.register(
    Workflow("test.race_wait", 1, [
        compute("a", lambda ctx: 1),
        wait_event("paid", "race.paid", correlation=lambda ctx: ctx.input["order"],
                   timeout=timedelta(hours=1)),
        compute("b", lambda ctx: 2),
    ]),
    replace=True,
)  # fmt: skip


def test_cancel_and_execution_on_the_same_run_never_deadlock(settings):
    RECEIVED.clear()
    _, credentials = ApiClient.issue("race-agent", [ApiScope.RUNS_WRITE, ApiScope.RUNS_READ])
    headers = {"Authorization": f"Bearer {credentials.token}"}
    problems: list[str] = []

    def execute(run_id, start):
        try:
            start.wait()
            while Run.objects.filter(pk=run_id, status__in=Run.RUNNABLE).exists():
                engine.advance(run_id, budget=0)
        except Exception as exc:  # a deadlock aborts the worker's transaction
            problems.append(f"worker: {type(exc).__name__}: {exc}")
        finally:
            connections.close_all()

    def cancel(run_id, start, delay):
        client = Client()
        try:
            start.wait()
            time.sleep(delay)
            for _ in range(500):
                response = client.post(
                    f"/api/v1/runs/{run_id}/cancel", {"reason": "race"},
                    content_type="application/json", headers=headers,
                )  # fmt: skip
                if response.status_code == 200:
                    return
                if response.status_code != 409:
                    problems.append(f"cancel: {response.status_code} {response.content[:300]}")
                    return
                if b"already" in response.content:
                    return  # it finished first
        except Exception as exc:
            problems.append(f"cancel: {type(exc).__name__}: {exc}")
        finally:
            connections.close_all()

    for attempt in range(25):
        run, _ = engine.start_run("test.race", {}, business_key=f"race-{attempt}")
        start = threading.Barrier(2)
        threads = [
            threading.Thread(target=execute, args=(run.pk, start)),
            threading.Thread(target=cancel, args=(run.pk, start, (attempt % 5) * 0.012)),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not problems, problems
        # Compensations (if the cancel came after a charge) are the worker's to run.
        run = engine.run_until_quiet(run.pk)
        assert run.is_terminal, (run.status, run.attention_reason)

    # Each side effect reached the receiving side at most once; the ledger agrees with it.
    assert max(RECEIVED.values(), default=0) == 1, RECEIVED
    for effect in SideEffect.objects.all():
        tool = "charge" if effect.tool == "test.race_charge" else "refund"
        sent = RECEIVED[(tool, effect.idempotency_key)]
        assert sent == (1 if effect.status in ("committed", "compensated") else 0), effect
    for run in Run.objects.filter(workflow="test.race"):
        assert run.status in ("succeeded", "cancelled", "compensated"), run.status
        if run.status != "succeeded":
            assert not SideEffect.objects.filter(
                run=run, status="committed", tool="test.race_charge"
            ).exists()


def test_an_event_and_a_cancel_for_the_same_waiting_run_never_deadlock():
    # deliver_event used to lock the wait and then the run; a cancel locks the run and then
    # its waits.
    _, credentials = ApiClient.issue("race-agent", [ApiScope.RUNS_WRITE, ApiScope.EVENTS_WRITE])
    headers = {"Authorization": f"Bearer {credentials.token}"}
    problems: list[str] = []

    def post(path, body, start, delay):
        try:
            start.wait()
            time.sleep(delay)
            response = Client().post(f"/api/v1{path}", body, content_type="application/json",
                                     headers=headers)  # fmt: skip
            if response.status_code >= 500:
                problems.append(f"{path}: {response.status_code} {response.content[:300]}")
        except Exception as exc:
            problems.append(f"{path}: {type(exc).__name__}: {exc}")
        finally:
            connections.close_all()

    for attempt in range(25):
        run, _ = engine.start_run("test.race_wait", {"order": f"o-{attempt}"})
        run = engine.run_until_quiet(run.pk)
        assert run.status == "waiting"
        start = threading.Barrier(2)
        event = {"event_id": f"e-{attempt}", "event_type": "race.paid",
                 "correlation_key": f"o-{attempt}"}  # fmt: skip
        threads = [
            threading.Thread(target=post, args=("/events", event, start, 0)),
            threading.Thread(target=post, args=(f"/runs/{run.pk}/cancel", {"reason": "race"},
                                                start, (attempt % 3) * 0.001)),
        ]  # fmt: skip
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not problems, problems
        run = engine.run_until_quiet(run.pk)
        assert run.status in ("cancelled", "succeeded"), run.status

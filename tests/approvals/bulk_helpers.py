"""Runs parked by a mail outage that outlasted its window, as the engine leaves them: what the
bulk action tests (unit, worker, browser) retry."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from runs import engine
from runs.models import Run, Wait

REPLY = {"message": "Where is my refund?", "ticket": "T-1"}


def outage_parked_runs(sandbox, n: int) -> list[Run]:
    """`n` test.reply runs whose send_reply waited out a mail outage and went to the inbox
    (engine in-process; the outage is cleared afterwards, as when the provider comes back)."""
    sandbox.inject("mail", "outage", seconds=600)
    runs = []
    for i in range(n):
        run, _ = engine.start_run("test.reply", {**REPLY, "email": f"c{i}@example.com"})
        runs.append(engine.run_until_quiet(run.pk))
    Wait.objects.filter(run__in=runs, status="pending").update(due_at=timezone.now())
    engine.sweep(now=timezone.now() + timedelta(seconds=61))
    parked = [engine.run_until_quiet(run.pk) for run in runs]
    sandbox.clear_faults()
    assert {r.status for r in parked} == {"needs_human"}, {r.status for r in parked}
    return parked

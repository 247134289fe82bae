"""Demo data for `make run`: a few dozen runs of the demo workflows with faults switched on, so
the console opens with real paused runs — approvals waiting, an unknown outcome to confirm, an
outage wait, invalid data, the demo agent's approval — next to completed and compensated runs.

The runs are real: started through the engine, executed by the running Celery worker against the
running sandbox. Re-running finds the demo runs already there and does nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from django.conf import settings
from django.contrib.auth import get_user_model

from approvals import actions
from runs import engine
from runs.models import Run, Wait
from taskpilots.sandbox.client import SandboxClient

PREFIX = "demo-"
CUSTOMERS = ["ann", "bo", "chen", "dara", "eli", "fay", "gus", "hana", "ivo", "jun"]
MESSAGES = [
    "I was charged twice for my order, please refund one of them.",
    "Where is my package? It has been a week.",
    "I cannot log in to my account since yesterday.",
    "Can you tell me how refunds work?",
    "The shipping is taking too long.",
    "我想申请退款，订单号 88231。",
]


class SeedError(RuntimeError):
    pass


def _start(workflow: str, key: str, input: dict) -> Run:
    run, _ = engine.start_run(
        workflow,
        input,
        business_key=PREFIX + key,
        principal="agent:demo",
        session_context_ref=f"demo/{key}",
    )
    return run


def _reply(n: int, **extra) -> dict:
    name = CUSTOMERS[n % len(CUSTOMERS)]
    message = MESSAGES[n % len(MESSAGES)]
    return {
        "message": message,
        "email": f"{name}@example.com",
        "ticket_id": f"T-{1000 + n}",
        "subject": message[:40],
        **extra,
    }


def _wait(runs: list[Run], done: Callable[[Run], bool], say, what: str, timeout=90) -> None:
    deadline = time.monotonic() + timeout
    ids = [r.pk for r in runs]
    while time.monotonic() < deadline:
        current = list(Run.objects.filter(pk__in=ids))
        pending = [r for r in current if not done(r)]
        if not pending:
            return
        time.sleep(0.5)
    say(f"  still waiting for {len(pending)} run(s) to reach {what}; moving on")


def _at_rest(run: Run) -> bool:
    return run.status not in (Run.Status.PENDING, Run.Status.RUNNING)


def seed(say: Callable[[str], None] = print) -> int:
    if Run.objects.filter(business_key__startswith=PREFIX).exists():
        say("demo runs already present: nothing to seed")
        return 0
    sandbox = SandboxClient(settings.TASKPILOTS["SANDBOX_URL"], timeout=5)
    try:
        sandbox.health()
    except Exception as exc:
        raise SeedError(
            f"the simulated external systems do not answer at {sandbox.base_url} ({exc}); start "
            "them with `python manage.py sandbox` (make run does)"
        ) from None
    admin = get_user_model().objects.filter(username="admin").first()
    started: list[Run] = []

    say("seeding completed runs (support replies, lead syncs, small refunds)")
    for n in range(8):
        started.append(_start("support.reply", f"reply-{n}", _reply(n)))
    for n in range(4):
        started.append(
            _start(
                "crm.lead_sync",
                f"lead-{n}",
                {
                    "email": f"lead{n}@corp{n}.example",
                    "name": f"Lead {n}",
                    "company": ["Acme", "Globex", "Initech", "Umbrella"][n],
                    "employees": [12, 900, 40, 5000][n],
                },
            )
        )
    settled = [
        _start(
            "refund.approval",
            f"refund-small-{n}",
            {"payment_id": f"pay_demo_{n}", "amount": [25.0, 60.0, 80.0][n]},
        )
        for n in range(3)
    ]
    started += settled
    _wait(started, _at_rest, say, "a resting state")

    say("seeding recoveries: a flaky tag tool, a failing knowledge base, a half success")
    sandbox.inject("crm", "429", action="tag", count=2)
    sandbox.inject("kb", "503", action="search", count=2)
    sandbox.inject("mail", "commit_then_500", action="send", count=1)
    recovered = [
        _start(
            "crm.lead_sync",
            "lead-flaky",
            {
                "email": "flaky@corp.example",
                "name": "Flaky Tag",
                "company": "Hooli",
                "employees": 700,
            },
        ),
        _start("support.reply", "reply-kb-down", _reply(20)),
        _start("support.reply", "reply-half-success", _reply(21)),
        _start(
            "support.reply",
            "reply-untrusted",
            _reply(
                22,
                message=(
                    'Refund please <script>alert("x")</script> <img src=x onerror=alert(1)> '
                    '<a href="javascript:alert(1)" hx-get="/console/">click</a>'
                ),
            ),
        ),
    ]
    _wait(recovered, _at_rest, say, "a resting state")
    sandbox.clear_faults()

    say("seeding paused runs: approvals, an unknown outcome, invalid data")
    paused = [
        _start(
            "refund.approval",
            "refund-approval-1",
            {"payment_id": "pay_demo_big1", "amount": 240.0, "reason": "damaged"},
        ),
        _start(
            "refund.approval",
            "refund-approval-2",
            {"payment_id": "pay_demo_big2", "amount": 480.0, "reason": "never delivered"},
        ),
    ]
    sandbox.inject("crm", "commit_then_500", action="create", count=1)
    paused.append(
        _start(
            "crm.lead_sync",
            "lead-unknown",
            {
                "email": "unknown@corp.example",
                "name": "Quinn Unknown",
                "company": "Stark",
                "employees": 300,
            },
        )
    )
    _wait(paused[-1:], _at_rest, say, "the unknown outcome")
    sandbox.clear_faults()
    paused.append(
        _start(
            "crm.lead_sync",
            "lead-invalid",
            {
                "email": "invalid@corp.example",
                "name": "N" * 250,
                "company": "Wayne",
                "employees": 80,
            },
        )
    )
    try:
        paused.append(
            _start(
                "demo.agent",
                "agent-refund",
                {
                    "message": "My order arrived broken, please refund it.",
                    "customer": "kim@example.com",
                    "payment": "pay_demo_agent",
                    "amount": 120.0,
                    "ticket": "T-2001",
                    "days_since_purchase": 10,
                },
            )
        )
    except engine.StartError as exc:
        say(f"  the demo agent is not available: {exc}")
    _wait(paused, _at_rest, say, "a person's queue")

    say("settling one refund, and cancelling another (its refund is voided)")
    first, second = settled[0], settled[1]
    for wait in Wait.objects.filter(run=first, kind="event", status="pending"):
        engine.deliver_event(
            f"demo-settle-{wait.pk}",
            wait.event_type,
            wait.correlation_key,
            {"settled": True, "bank": "demo"},
            source="demo",
        )
    if admin is not None:
        try:
            actions.cancel_run(second.pk, admin, reason="Customer withdrew the request")
        except (actions.ActionRefused, actions.DecisionConflict) as exc:
            say(f"  could not cancel {second.business_key}: {exc}")
    _wait([first, second], lambda r: r.is_terminal, say, "the end")

    say(
        "seeding an outage: the ticket system is down for 20 minutes (the run waits, probes, "
        "then escalates)"
    )
    sandbox.inject("tickets", "outage", seconds=20 * 60)
    outage = _start("support.reply", "reply-outage", _reply(30))
    _wait([outage], lambda r: r.status == Run.Status.WAITING, say, "the outage wait")

    total = Run.objects.filter(business_key__startswith=PREFIX).count()
    by_status: dict[str, int] = {}
    for status in Run.objects.filter(business_key__startswith=PREFIX).values_list(
        "status", flat=True
    ):
        by_status[status] = by_status.get(status, 0) + 1
    say(f"demo data: {total} runs — " + ", ".join(f"{n} {s}" for s, n in sorted(by_status.items())))
    return total

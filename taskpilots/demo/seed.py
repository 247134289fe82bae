"""Demo data for `make run`: a few dozen runs of the demo workflows with faults switched on, so
the console opens with real paused runs — approvals waiting, an unknown outcome to confirm, an
outage wait, invalid data, the demo agent's approval — next to completed and compensated runs.

The runs are real: started through the engine, executed by the running Celery worker against the
running sandbox. Re-running finds the demo runs already there and does nothing; `again` seeds
another set beside them (business keys and payment ids carry the set's number: demo-2-…), so a
demo that has been clicked through can start afresh without touching the audit trail.
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

Say = Callable[[str], None]
PREFIX = "demo-"
# The set being seeded: "" for the first, "2-", "3-"… for the ones `again` adds (seed sets it).
_set = ""
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
        business_key=PREFIX + _set + key,
        principal="agent:demo",
        session_context_ref=f"demo/{_set}{key}",
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


def _wait(runs: list[Run], done: Callable[[Run], bool], say: Say, what: str, timeout=90) -> None:
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


def _lead(email: str, name: str, company: str, employees: int) -> dict:
    return {"email": email, "name": name, "company": company, "employees": employees}


def seed(say: Say = print, *, again: bool = False) -> int:
    """Seed the demo runs; returns how many demo runs there are now (0: nothing seeded)."""
    global _set
    sets = _sets_seeded()
    if sets and not again:
        say("demo runs already present: nothing to seed (seed_demo --again adds another set)")
        return 0
    _set = f"{sets + 1}-" if sets else ""
    if _set:
        say(f"seeding demo set {sets + 1} beside the {sets} already present")
    sandbox = _sandbox()
    admin = get_user_model().objects.filter(username="admin").first()
    settled = _seed_completed(say)
    _seed_recoveries(sandbox, say)
    _seed_paused(sandbox, say)
    _settle_and_cancel(settled, admin, say)
    _seed_outage(sandbox, say)
    return _report(say)


def _sets_seeded() -> int:
    """How many demo sets are present: the first has keys demo-reply-0…, set n demo-n-reply-0."""
    keys = Run.objects.filter(business_key__startswith=PREFIX, business_key__endswith="reply-0")
    return keys.count()


def _pay(name: str) -> str:
    """A demo payment id of this set (each set refunds its own payments)."""
    return f"pay_demo_{_set}{name}"


def _sandbox() -> SandboxClient:
    """The simulated external systems, which the demo runs call: they must be up."""
    sandbox = SandboxClient(settings.TASKPILOTS["SANDBOX_URL"], timeout=5)
    try:
        sandbox.health()
    except Exception as exc:
        raise SeedError(
            f"the simulated external systems do not answer at {sandbox.base_url} ({exc}); start "
            "them with `python manage.py sandbox` (make run does)"
        ) from None
    return sandbox


def _seed_completed(say: Say) -> list[Run]:
    """Runs that finish on their own; returns the small refunds, left waiting for settlement."""
    say("seeding completed runs (support replies, lead syncs, small refunds)")
    started = [_start("support.reply", f"reply-{n}", _reply(n)) for n in range(8)]
    companies = [("Acme", 12), ("Globex", 900), ("Initech", 40), ("Umbrella", 5000)]
    for n, (company, employees) in enumerate(companies):
        lead = _lead(f"lead{n}@corp{n}.example", f"Lead {n}", company, employees)
        started.append(_start("crm.lead_sync", f"lead-{n}", lead))
    settled = [
        _start(
            "refund.approval",
            f"refund-small-{n}",
            {"payment_id": _pay(str(n)), "amount": amount},
        )
        for n, amount in enumerate([25.0, 60.0, 80.0])
    ]
    _wait(started + settled, _at_rest, say, "a resting state")
    return settled


UNTRUSTED_MESSAGE = (
    'Refund please <script>alert("x")</script> <img src=x onerror=alert(1)> '
    '<a href="javascript:alert(1)" hx-get="/console/">click</a>'
)


def _seed_recoveries(sandbox: SandboxClient, say: Say) -> None:
    """Faults the engine recovers from by itself, and a message full of markup."""
    say("seeding recoveries: a flaky tag tool, a failing knowledge base, a half success")
    sandbox.inject("crm", "429", action="tag", count=2)
    sandbox.inject("kb", "503", action="search", count=2)
    sandbox.inject("mail", "commit_then_500", action="send", count=1)
    flaky = _lead("flaky@corp.example", "Flaky Tag", "Hooli", 700)
    recovered = [
        _start("crm.lead_sync", "lead-flaky", flaky),
        _start("support.reply", "reply-kb-down", _reply(20)),
        _start("support.reply", "reply-half-success", _reply(21)),
        _start("support.reply", "reply-untrusted", _reply(22, message=UNTRUSTED_MESSAGE)),
    ]
    _wait(recovered, _at_rest, say, "a resting state")
    sandbox.clear_faults()


def _seed_paused(sandbox: SandboxClient, say: Say) -> None:
    """Runs that wait for a person: approvals, an unknown outcome, invalid data, the agent."""
    say("seeding paused runs: approvals, an unknown outcome, invalid data")
    paused = [
        _start(
            "refund.approval",
            "refund-approval-1",
            {"payment_id": _pay("big1"), "amount": 240.0, "reason": "damaged"},
        ),
        _start(
            "refund.approval",
            "refund-approval-2",
            {"payment_id": _pay("big2"), "amount": 480.0, "reason": "never delivered"},
        ),
    ]
    sandbox.inject("crm", "commit_then_500", action="create", count=1)
    unknown = _lead("unknown@corp.example", "Quinn Unknown", "Stark", 300)
    paused.append(_start("crm.lead_sync", "lead-unknown", unknown))
    _wait(paused[-1:], _at_rest, say, "the unknown outcome")
    sandbox.clear_faults()
    invalid = _lead("invalid@corp.example", "N" * 250, "Wayne", 80)
    paused.append(_start("crm.lead_sync", "lead-invalid", invalid))
    agent = _start_agent(say)
    if agent is not None:
        paused.append(agent)
    _wait(paused, _at_rest, say, "a person's queue")


def _start_agent(say: Say) -> Run | None:
    """The demo agent asks for a refund's approval (when its SDK is installed)."""
    try:
        return _start(
            "demo.agent",
            "agent-refund",
            {
                "message": "My order arrived broken, please refund it.",
                "customer": "kim@example.com",
                "payment": _pay("agent"),
                "amount": 120.0,
                "ticket": "T-2001",
                "days_since_purchase": 10,
            },
        )
    except engine.StartError as exc:
        say(f"  the demo agent is not available: {exc}")
        return None


def _settle_and_cancel(settled: list[Run], admin, say: Say) -> None:
    """The first small refund's settlement arrives; an admin cancels the second (its refund is
    voided)."""
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
    # Without an admin the second refund is not cancelled: it waits for its settlement.
    ending = [first, second] if admin is not None else [first]
    _wait(ending, lambda r: r.is_terminal, say, "the end")


def _seed_outage(sandbox: SandboxClient, say: Say) -> None:
    say(
        "seeding an outage: the ticket system is down for 20 minutes (the run waits, probes, "
        "then escalates)"
    )
    sandbox.inject("tickets", "outage", seconds=20 * 60)
    outage = _start("support.reply", "reply-outage", _reply(30))
    _wait([outage], lambda r: r.status == Run.Status.WAITING, say, "the outage wait")


def _report(say: Say) -> int:
    demo = Run.objects.filter(business_key__startswith=PREFIX)
    total = demo.count()
    by_status: dict[str, int] = {}
    for status in demo.values_list("status", flat=True):
        by_status[status] = by_status.get(status, 0) + 1
    say(f"demo data: {total} runs — " + ", ".join(f"{n} {s}" for s, n in sorted(by_status.items())))
    return total

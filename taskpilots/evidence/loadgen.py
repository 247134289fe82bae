"""Bulk-load realistic fake runs to measure the metrics dashboard (`manage.py load_fake_runs N`).

Each run gets steps, snapshots, side effects, waits, approvals, takeovers, human decisions and a
valid hash-chained timeline, shaped like what the engine writes: most runs succeed first time,
some retry a transient failure, wait out an outage, hit an unknown outcome a person settles, wait
for an approval, or are escalated and taken over; a few are still open. Rows go in with
bulk_create in large batches (Snapshot and TimelineEvent only block update and delete, so
inserting them this way is allowed; their checksums and hashes are computed as the models do).

Never point this at a database that matters: it writes thousands of fake runs.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.utils import timezone

from approvals.models import ApprovalRequest, HumanDecision, Takeover
from runs.models import Run as RunModel
from runs.models import SideEffect, Snapshot, Step, TimelineEvent, Wait, digest
from runs.verbs import Verb

WORKFLOWS = {
    "support.reply": [
        ("classify", "compute", ""),
        ("search_kb", "read", "kb.search"),
        ("send_reply", "side_effect", "mail.send"),
        ("update_ticket", "side_effect", "tickets.update"),
    ],
    "refund.approval": [
        ("check_policy", "compute", ""),
        ("approve_refund", "approval", ""),
        ("refund", "side_effect", "payments.refund"),
        ("await_settlement", "wait_event", ""),
        ("notify", "side_effect", "mail.send"),
    ],
    "crm.lead": [
        ("enrich", "read", "crm.search"),
        ("create_contact", "side_effect", "crm.create"),
        ("welcome", "side_effect", "mail.send"),
    ],
}
# (scenario, weight)
SCENARIOS = [
    ("clean", 70),
    ("transient", 10),
    ("outage", 4),
    ("unknown_confirmed", 3),
    ("escalated_taken_over", 3),
    ("needs_human", 2),
    ("failed", 1),
    ("resent", 1),
    ("in_flight", 1),
]


@dataclass
class Batch:
    runs: list = field(default_factory=list)
    steps: list = field(default_factory=list)  # (run index, Step)
    snapshots: list = field(default_factory=list)  # (step ref, Snapshot)
    effects: list = field(default_factory=list)  # (step ref, snapshot ref, SideEffect)
    waits: list = field(default_factory=list)  # (step ref, Wait)
    approvals: list = field(default_factory=list)  # (step ref, ApprovalRequest, decision)
    takeovers: list = field(default_factory=list)
    decisions: list = field(default_factory=list)  # (step ref or None, HumanDecision)
    events: list = field(default_factory=list)  # (run, [(at, actor, verb, data)])


class Timeline:
    def __init__(self, start: datetime, rng: random.Random):
        self.at, self.rng, self.items = start, rng, []

    def add(self, verb: str, data: dict, *, after: float = 0.05, actor: str = "system"):
        self.at += timedelta(seconds=after * self.rng.uniform(0.5, 1.5))
        self.items.append((self.at, actor, verb, data))
        return self.at


def _fail(tl, name, verb, cls, after=0.4, **extra):
    data = {"step": name, "iteration": 0, "from": "running", **extra}
    if verb == Verb.STEP_UNKNOWN_OUTCOME:
        data["to"] = "unknown_outcome"
    else:
        data["routing"] = {"rule": "default", "failure_class": cls}
    return tl.add(verb, data, after=after)


def _build_run(batch: Batch, rng: random.Random, created: datetime, users, now) -> None:
    """Add one run started at `created`. No event is ever in the future: a run whose story
    would go on past `now` (a long scenario started a few hours ago) is still in flight, and
    one that would not even have reached its in-flight step by now started earlier."""
    scenario = None
    overshoot = _end(rng, created, users, now, scenario) - (now - timedelta(minutes=5))
    if overshoot > timedelta(0):
        scenario = "in_flight"
        overshoot = _end(rng, created, users, now, scenario) - (now - timedelta(minutes=1))
        created -= max(overshoot, timedelta(0))
    _build_run_as(batch, rng, created, users, now, scenario)


def _end(rng: random.Random, created: datetime, users, now, scenario: str | None) -> datetime:
    """When the run _build_run_as would build (from rng's current state) has its last event."""
    probe = random.Random()
    probe.setstate(rng.getstate())
    draft = Batch()
    _build_run_as(draft, probe, created, users, now, scenario)
    return max(at for at, *_ in draft.events[0])


def _build_run_as(
    batch: Batch, rng: random.Random, created: datetime, users, now, scenario: str | None
) -> None:
    workflow = rng.choice(list(WORKFLOWS))
    scenario = scenario or rng.choices([s for s, _ in SCENARIOS], [w for _, w in SCENARIOS])[0]
    run = RunModel(
        id=uuid.uuid4(),
        workflow=workflow,
        workflow_version=1,
        input={"customer": f"c-{rng.randrange(10**6)}"},
        created_at=created,
        principal="agent:loadgen",
        scopes=["mail:send", "tickets:write", "crm:write", "payments:refund"],
    )
    run.input_digest = digest(run.input)
    tl = Timeline(created, rng)
    tl.add(Verb.RUN_STARTED, {"from": "pending", "to": "running"})
    steps = WORKFLOWS[workflow]
    # Which step the scenario's trouble lands on: the first side effect.
    trouble = next(i for i, (_, kind, _) in enumerate(steps) if kind == "side_effect")
    failures = 0
    escalated = 0
    status = "succeeded"
    stop_at = len(steps)
    user = rng.choice(users)
    actor = f"user:{user.get_username()}"
    run_ref = len(batch.runs)
    for position, (name, kind, tool) in enumerate(steps):
        if position >= stop_at:
            break
        step = Step(
            name=name,
            iteration=0,
            position=position,
            kind=kind,
            stage=name,
            tool=tool,
            status="succeeded",
            attempts=1 if kind in ("read", "side_effect", "compute") else 0,
            created_at=tl.at,
            started_at=tl.at,
        )
        step_ref = len(batch.steps)
        batch.steps.append((run_ref, step))
        tl.add(Verb.STEP_STARTED, {"step": name, "iteration": 0, "kind": kind, "attempt": 1})
        here = position == trouble
        if here and scenario == "in_flight":
            step.status = "running"
            step.lease_owner = "loadgen"
            step.lease_expires_at = now + timedelta(seconds=60)
            status, stop_at = "running", position + 1
            continue
        if here and scenario in ("transient", "failed", "escalated_taken_over", "needs_human"):
            tries = rng.randint(1, 3) if scenario == "transient" else 3
            for attempt in range(tries):
                _fail(tl, name, Verb.STEP_RETRY_SCHEDULED, "transient", attempt=attempt + 1)
                step.attempts += 1
                failures += 1
                tl.add(Verb.STEP_STARTED, {"step": name, "iteration": 0, "attempt": step.attempts},
                       after=2 ** attempt)  # fmt: skip
            if scenario != "transient":
                step.attempts -= 1  # the last start above is the failing final attempt
                _fail(tl, name, Verb.STEP_ESCALATED, "transient")
                failures += 1
                escalated = 1
                tl.add(Verb.RUN_NEEDS_HUMAN, {"from": "running", "to": "needs_human"})
                if scenario == "needs_human":
                    step.status, step.error_class = "needs_human", "transient"
                    status, stop_at = "needs_human", position + 1
                    run.queue, run.attention_reason = "ops", "Gave up after 3 attempts"
                    continue
                if scenario == "failed":
                    tl.add(Verb.RUN_FAILED, {"from": "needs_human", "to": "failed"}, after=600)
                    step.status, step.error_class = "failed", "transient"
                    step.finished_at = tl.at
                    status, stop_at = "failed", position + 1
                    cancel = HumanDecision(run=run, verb="cancel", user=user)
                    batch.decisions.append((step_ref, cancel))
                    continue
                # escalated, then taken over and retried by a person
                taken = tl.add(Verb.RUN_TAKEN_OVER, {"from": "needs_human", "to": "taken_over"},
                               after=rng.uniform(60, 3600), actor=actor)  # fmt: skip
                batch.takeovers.append((run_ref, Takeover(run=run, user=user, started_at=taken)))
                batch.decisions.append((None, HumanDecision(run=run, verb="take_over", user=user,
                                                            created_at=taken)))  # fmt: skip
                if rng.random() < 0.2:  # released, then someone had to come back
                    released = tl.add(Verb.RUN_RELEASED, {}, after=300, actor=actor)
                    batch.takeovers[-1][1].ended_at = released
                    batch.decisions.append((None, HumanDecision(run=run, verb="release", user=user,
                                                                created_at=released)))  # fmt: skip
                    again = tl.add(Verb.RUN_TAKEN_OVER, {}, after=900, actor=actor)
                    second = Takeover(run=run, user=user, started_at=again)
                    batch.takeovers.append((run_ref, second))
                retried = tl.add(Verb.STEP_RETRY_REQUESTED, {"step": name}, after=120, actor=actor)
                batch.decisions.append((step_ref, HumanDecision(run=run, verb="retry", user=user,
                                                                created_at=retried)))  # fmt: skip
                batch.takeovers[-1][1].ended_at = retried
                step.attempts += 1
        if here and scenario == "outage":
            tries = rng.randint(1, 4)
            wait = Wait(kind="tool_recovery", event_type=tool, status="resolved",
                        created_at=tl.at)  # fmt: skip
            for _ in range(tries):
                _fail(tl, name, Verb.STEP_WAITING_FOR_TOOL, "outage", after=0.5)
                step.attempts += 1
                failures += 1
                tl.add(Verb.STEP_STARTED, {"step": name, "iteration": 0}, after=30)
            wait.resolved_at, wait.due_at = tl.at, tl.at + timedelta(seconds=600)
            batch.waits.append((step_ref, wait))
        if kind == "approval":
            asked = tl.add(Verb.APPROVAL_REQUESTED, {"step": name})
            decided = tl.add(Verb.STEP_SUCCEEDED, {"step": name, "iteration": 0},
                             after=rng.uniform(120, 4 * 3600), actor=actor)  # fmt: skip
            batch.waits.append((step_ref, Wait(kind="approval", status="resolved",
                                               created_at=asked, resolved_at=decided)))  # fmt: skip
            approval = ApprovalRequest(
                reason="Refund above the approval threshold", queue="support",
                tool="payments.refund", proposed_params={"amount": 240}, status="decided",
                decision="approved", decided_by=user, decided_at=decided, created_at=asked,
            )  # fmt: skip
            batch.approvals.append((step_ref, approval, HumanDecision(
                run=run, verb="approve", user=user, created_at=decided)))  # fmt: skip
        if kind == "wait_event":
            created_wait = tl.at
            expired = rng.random() < 0.03
            wait = Wait(kind="event", event_type="payment.settled", correlation_key=f"c{step_ref}",
                        created_at=created_wait)  # fmt: skip
            if expired:
                wait.status, wait.resolved_at = "expired", tl.add(
                    Verb.STEP_FAILED, {"step": name, "routing": {"failure_class": "timeout"}},
                    after=3600)  # fmt: skip
                step.status, step.error_class = "failed", "timeout"
                status, stop_at = "failed", position + 1
            else:
                wait.status = "resolved"
                wait.resolved_at = tl.add(Verb.WAIT_RESOLVED, {"kind": "event"},
                                          after=rng.uniform(5, 900))  # fmt: skip
            batch.waits.append((step_ref, wait))
        if kind == "side_effect":
            key = f"tp-{run.id}-{name}"
            step.idempotency_key = key
            snap_at = tl.add(Verb.SNAPSHOT_WRITTEN, {"step": name, "key": key, "tool": tool})
            missing = ["session_context_ref"] if rng.random() < 0.08 else []
            snapshot = Snapshot(
                attempt=step.attempts, workflow_version=1, stage=name, tool=tool,
                params={"to": "customer@example.com", "ref": name}, target_resource=f"{tool}:x",
                permissions={"actor": "agent:loadgen", "scopes": run.scopes},
                idempotency_key=key, missing_fields=missing, created_at=snap_at,
            )  # fmt: skip
            snap_ref = len(batch.snapshots)
            batch.snapshots.append((step_ref, snapshot))
            effect = SideEffect(
                idempotency_key=key, tool=tool, target=f"{tool}:x",
                params_checksum=digest(snapshot.params), status="committed",
                confirmed_by="tool", created_at=snap_at, attempted_at=snap_at,
            )  # fmt: skip
            tl.add(Verb.SIDE_EFFECT_INTENDED, {"step": name, "key": key, "tool": tool})
            if here and scenario == "unknown_confirmed":
                tl.add(Verb.SIDE_EFFECT_UNKNOWN, {"key": key, "tool": tool}, after=10)
                _fail(tl, name, Verb.STEP_UNKNOWN_OUTCOME, "unknown_outcome")
                failures += 1
                tl.add(Verb.RUN_NEEDS_HUMAN, {"from": "running", "to": "needs_human"})
                confirmed = tl.add(Verb.SIDE_EFFECT_COMMITTED, {"key": key, "confirmed_by": actor},
                                   after=rng.uniform(120, 7200), actor=actor)  # fmt: skip
                effect.confirmed_by, effect.committed_at = actor, confirmed
                batch.decisions.append((step_ref, HumanDecision(
                    run=run, verb="confirm_happened", user=user, created_at=confirmed,
                    proof="msg-123")))  # fmt: skip
            elif here and scenario == "resent":
                tl.add(Verb.SIDE_EFFECT_UNKNOWN, {"key": key, "tool": tool}, after=10)
                tl.add(Verb.SIDE_EFFECT_NOT_COMMITTED, {"key": key, "confirmed_by": "reconcile"})
                tl.add(Verb.SIDE_EFFECT_INTENDED, {"key": key, "step": name})
                step.attempts += 1
                # The resend was right most of the time; sometimes the first attempt had landed
                # and a later lookup by key finds it (a wrong retry).
                confirmed_by = "reconcile" if rng.random() < 0.3 else "tool"
                effect.committed_at = tl.add(
                    Verb.SIDE_EFFECT_COMMITTED, {"key": key, "confirmed_by": confirmed_by}, after=20
                )
                effect.confirmed_by = confirmed_by
            else:
                effect.committed_at = tl.add(
                    Verb.SIDE_EFFECT_COMMITTED, {"key": key, "confirmed_by": "tool"},
                    after=rng.uniform(0.05, 0.8))  # fmt: skip
            effect.updated_at = effect.committed_at
            batch.effects.append((step_ref, snap_ref, effect))
        if step.status == "succeeded":
            step.finished_at = tl.add(Verb.STEP_SUCCEEDED, {"step": name, "iteration": 0})
    if status == "succeeded":
        tl.add(Verb.RUN_SUCCEEDED, {"from": "running", "to": "succeeded"})
        run.finished_at = tl.at
    elif status == "failed":
        run.finished_at = tl.at
    run.status = status
    run.stage = steps[min(stop_at, len(steps)) - 1][0]
    run.failure_count, run.escalation_level = failures, escalated
    run.updated_at = tl.at
    batch.runs.append(run)
    batch.events.append(tl.items)


def _insert(batch: Batch) -> None:
    events = []
    for run, items in zip(batch.runs, batch.events, strict=True):
        prev = ""
        for seq, (at, actor, verb, data) in enumerate(items, start=1):
            data_digest = digest(data)
            h = TimelineEvent.compute_hash(seq, at, actor, verb, data_digest, prev)
            events.append(TimelineEvent(run=run, seq=seq, at=at, actor=actor, verb=verb,
                                        data=data, data_digest=data_digest, prev_hash=prev,
                                        hash=h))  # fmt: skip
            prev = h
        run.event_seq, run.event_hash = len(items), prev
    RunModel.objects.bulk_create(batch.runs, batch_size=5000)
    for run_ref, step in batch.steps:
        step.run = batch.runs[run_ref]
    Step.objects.bulk_create([s for _, s in batch.steps], batch_size=5000)
    steps = [s for _, s in batch.steps]
    for step_ref, snapshot in batch.snapshots:
        snapshot.step = steps[step_ref]
        snapshot.run_id = snapshot.step.run_id
        snapshot.checksum = snapshot.compute_checksum()
    Snapshot.objects.bulk_create([s for _, s in batch.snapshots], batch_size=5000)
    for step_ref, snap_ref, effect in batch.effects:
        effect.step = steps[step_ref]
        effect.run_id = effect.step.run_id
        effect.snapshot = batch.snapshots[snap_ref][1]
    SideEffect.objects.bulk_create([e for _, _, e in batch.effects], batch_size=5000)
    for step_ref, wait in batch.waits:
        wait.step = steps[step_ref]
        wait.run_id = wait.step.run_id
    Wait.objects.bulk_create([w for _, w in batch.waits], batch_size=5000)
    for step_ref, approval, _decision in batch.approvals:
        approval.step = steps[step_ref]
        approval.run_id = approval.step.run_id
    ApprovalRequest.objects.bulk_create([a for _, a, _ in batch.approvals], batch_size=5000)
    decisions = []
    for step_ref, approval, decision in batch.approvals:
        decision.step, decision.approval = steps[step_ref], approval
        decisions.append(decision)
    Takeover.objects.bulk_create([t for _, t in batch.takeovers], batch_size=5000)
    for step_ref, decision in batch.decisions:
        if step_ref is not None:
            decision.step = steps[step_ref]
        decisions.append(decision)
    HumanDecision.objects.bulk_create(decisions, batch_size=5000)
    TimelineEvent._base_manager.bulk_create(events, batch_size=10000)


def load_fake_runs(
    count: int,
    *,
    days: float = 30,
    seed: int = 7,
    batch_size: int = 2000,
    now: datetime | None = None,
    progress: Callable[[str], Any] | None = None,
) -> int:
    """Insert `count` runs started over the last `days`; returns how many were inserted."""
    rng = random.Random(seed)
    now = now or timezone.now()
    User = get_user_model()
    users = [
        User.objects.get_or_create(username=name)[0]
        for name in ("mei.support", "jonas.ops", "ada.support")
    ]
    done = 0
    while done < count:
        batch = Batch()
        for _ in range(min(batch_size, count - done)):
            # More recent traffic than old: the load grows over the window.
            age = days * (1 - rng.random() ** 0.8)
            _build_run(batch, rng, now - timedelta(days=age), users, now)
        with transaction.atomic():
            _insert(batch)
        done += len(batch.runs)
        if progress:
            progress(f"{done}/{count} runs")
    # Fresh statistics, as after any bulk load: with the planner's old picture of these tables
    # (empty, or another data set's distributions), the metrics rollup chose plans that ran
    # for minutes instead of seconds. Autovacuum would catch up, but only later.
    with connection.cursor() as cursor:
        models = (RunModel, Step, Snapshot, SideEffect, Wait, ApprovalRequest, Takeover)
        for model in (*models, HumanDecision, TimelineEvent):
            cursor.execute(f'ANALYZE "{model._meta.db_table}"')
    return done

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
# The scenarios whose trouble starts with transient failures the engine retries.
RETRIED = ("transient", "failed", "escalated_taken_over", "needs_human")


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
    story = _RunStory(batch, rng, now, run, tl, user=rng.choice(users), stop_at=len(steps))
    # Which step the scenario's trouble lands on: the first side effect.
    trouble = next(i for i, (_, kind, _) in enumerate(steps) if kind == "side_effect")
    for position, (name, kind, tool) in enumerate(steps):
        if position >= story.stop_at:
            break
        story.write_step(position, name, kind, tool, scenario if position == trouble else None)
    story.finish([name for name, _, _ in steps])


class _RunStory:
    """One run as it is written: its steps one by one (with the scenario's trouble on the step
    it lands on), its timeline's clock, and how it stands when the story stops."""

    def __init__(self, batch: Batch, rng, now, run: RunModel, tl: Timeline, *, user, stop_at):
        self.batch, self.rng, self.now, self.run, self.tl = batch, rng, now, run, tl
        self.user, self.actor = user, f"user:{user.get_username()}"
        self.run_ref = len(batch.runs)
        self.failures = self.escalated = 0
        self.status, self.stop_at = "succeeded", stop_at

    def stop(self, status: str, step: Step) -> None:
        """The run stays `status` and its story ends with this step."""
        self.status, self.stop_at = status, step.position + 1

    def decide(self, step_ref: int | None, verb: str, **fields) -> None:
        decision = HumanDecision(run=self.run, verb=verb, user=self.user, **fields)
        self.batch.decisions.append((step_ref, decision))

    def write_step(
        self, position: int, name: str, kind: str, tool: str, trouble: str | None
    ) -> None:
        """Started; the trouble, if it lands here; what the step's kind writes; done."""
        tl = self.tl
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
        step_ref = len(self.batch.steps)
        self.batch.steps.append((self.run_ref, step))
        tl.add(Verb.STEP_STARTED, {"step": name, "iteration": 0, "kind": kind, "attempt": 1})
        if trouble == "in_flight":
            self.leave_in_flight(step)
            return
        if trouble in RETRIED and self.retry(step, step_ref, trouble):
            return
        if trouble == "outage":
            self.wait_out_outage(step, step_ref)
        if kind == "approval":
            self.ask_approval(step, step_ref)
        if kind == "wait_event":
            self.await_event(step, step_ref)
        if kind == "side_effect":
            self.side_effect(step, step_ref, trouble)
        if step.status == "succeeded":
            step.finished_at = tl.add(Verb.STEP_SUCCEEDED, {"step": name, "iteration": 0})

    def leave_in_flight(self, step: Step) -> None:
        """A worker holds the step right now."""
        step.status = "running"
        step.lease_owner = "loadgen"
        step.lease_expires_at = self.now + timedelta(seconds=60)
        self.stop("running", step)

    def retry(self, step: Step, step_ref: int, scenario: str) -> bool:
        """Transient failures retried with backoff; in all but the transient scenario the last
        attempt fails too and the step is escalated. True when the story stops here."""
        tl, name = self.tl, step.name
        tries = self.rng.randint(1, 3) if scenario == "transient" else 3
        for attempt in range(tries):
            _fail(tl, name, Verb.STEP_RETRY_SCHEDULED, "transient", attempt=attempt + 1)
            step.attempts += 1
            self.failures += 1
            started = {"step": name, "iteration": 0, "attempt": step.attempts}
            tl.add(Verb.STEP_STARTED, started, after=2**attempt)
        if scenario == "transient":
            return False
        step.attempts -= 1  # the last start above is the failing final attempt
        _fail(tl, name, Verb.STEP_ESCALATED, "transient")
        self.failures += 1
        self.escalated = 1
        tl.add(Verb.RUN_NEEDS_HUMAN, {"from": "running", "to": "needs_human"})
        if scenario == "needs_human":
            self.park_for_a_person(step)
            return True
        if scenario == "failed":
            self.fail_run(step, step_ref)
            return True
        self.take_over_and_retry(step, step_ref)
        return False

    def park_for_a_person(self, step: Step) -> None:
        step.status, step.error_class = "needs_human", "transient"
        self.stop("needs_human", step)
        self.run.queue, self.run.attention_reason = "ops", "Gave up after 3 attempts"

    def fail_run(self, step: Step, step_ref: int) -> None:
        """Nobody could save it: a person cancels, the run fails."""
        self.tl.add(Verb.RUN_FAILED, {"from": "needs_human", "to": "failed"}, after=600)
        step.status, step.error_class = "failed", "transient"
        step.finished_at = self.tl.at
        self.stop("failed", step)
        self.decide(step_ref, "cancel")

    def take_over_and_retry(self, step: Step, step_ref: int) -> None:
        """A person takes the run over (sometimes releases it and comes back), then retries."""
        tl, rng, actor = self.tl, self.rng, self.actor
        takeovers = self.batch.takeovers
        to_person = {"from": "needs_human", "to": "taken_over"}
        taken = tl.add(Verb.RUN_TAKEN_OVER, to_person, after=rng.uniform(60, 3600), actor=actor)
        takeovers.append((self.run_ref, Takeover(run=self.run, user=self.user, started_at=taken)))
        self.decide(None, "take_over", created_at=taken)
        if rng.random() < 0.2:  # released, then someone had to come back
            released = tl.add(Verb.RUN_RELEASED, {}, after=300, actor=actor)
            takeovers[-1][1].ended_at = released
            takeovers[-1][1].needed_engineer = len(takeovers) % 3 == 0  # no draw: same runs
            self.decide(None, "release", created_at=released)
            again = tl.add(Verb.RUN_TAKEN_OVER, {}, after=900, actor=actor)
            second = Takeover(run=self.run, user=self.user, started_at=again)
            takeovers.append((self.run_ref, second))
        retried = tl.add(Verb.STEP_RETRY_REQUESTED, {"step": step.name}, after=120, actor=actor)
        self.decide(step_ref, "retry", created_at=retried)
        takeovers[-1][1].ended_at = retried
        step.attempts += 1

    def wait_out_outage(self, step: Step, step_ref: int) -> None:
        """The tool is down: the step waits for it, probing, until it is back."""
        tl, name = self.tl, step.name
        tries = self.rng.randint(1, 4)
        wait = Wait(kind="tool_recovery", event_type=step.tool, status="resolved", created_at=tl.at)
        for _ in range(tries):
            _fail(tl, name, Verb.STEP_WAITING_FOR_TOOL, "outage", after=0.5)
            step.attempts += 1
            self.failures += 1
            tl.add(Verb.STEP_STARTED, {"step": name, "iteration": 0}, after=30)
        wait.resolved_at, wait.due_at = tl.at, tl.at + timedelta(seconds=600)
        self.batch.waits.append((step_ref, wait))

    def ask_approval(self, step: Step, step_ref: int) -> None:
        """A person approves the refund, minutes to hours later."""
        tl, name = self.tl, step.name
        asked = tl.add(Verb.APPROVAL_REQUESTED, {"step": name})
        pause = self.rng.uniform(120, 4 * 3600)
        decided = tl.add(
            Verb.STEP_SUCCEEDED, {"step": name, "iteration": 0}, after=pause, actor=self.actor
        )
        wait = Wait(kind="approval", status="resolved", created_at=asked, resolved_at=decided)
        self.batch.waits.append((step_ref, wait))
        approval = ApprovalRequest(
            reason="Refund above the approval threshold",
            queue="support",
            tool="payments.refund",
            proposed_params={"amount": 240},
            status="decided",
            decision="approved",
            decided_by=self.user,
            decided_at=decided,
            created_at=asked,
        )
        decision = HumanDecision(run=self.run, verb="approve", user=self.user, created_at=decided)
        self.batch.approvals.append((step_ref, approval, decision))

    def await_event(self, step: Step, step_ref: int) -> None:
        """The settlement event arrives; now and then it never does and the wait expires."""
        tl = self.tl
        expired = self.rng.random() < 0.03
        wait = Wait(
            kind="event",
            event_type="payment.settled",
            correlation_key=f"c{step_ref}",
            created_at=tl.at,
        )
        if expired:
            timed_out = {"step": step.name, "routing": {"failure_class": "timeout"}}
            wait.status = "expired"
            wait.resolved_at = tl.add(Verb.STEP_FAILED, timed_out, after=3600)
            step.status, step.error_class = "failed", "timeout"
            self.stop("failed", step)
        else:
            wait.status = "resolved"
            pause = self.rng.uniform(5, 900)
            wait.resolved_at = tl.add(Verb.WAIT_RESOLVED, {"kind": "event"}, after=pause)
        self.batch.waits.append((step_ref, wait))

    def side_effect(self, step: Step, step_ref: int, trouble: str | None) -> None:
        """Snapshot, intent and receipt; an unknown outcome a person confirms, or a resend."""
        tl, name, tool = self.tl, step.name, step.tool
        key = f"tp-{self.run.id}-{name}"
        step.idempotency_key = key
        snap_at = tl.add(Verb.SNAPSHOT_WRITTEN, {"step": name, "key": key, "tool": tool})
        missing = ["session_context_ref"] if self.rng.random() < 0.08 else []
        snapshot = Snapshot(
            attempt=step.attempts,
            workflow_version=1,
            stage=name,
            tool=tool,
            params={"to": "customer@example.com", "ref": name},
            target_resource=f"{tool}:x",
            permissions={"actor": "agent:loadgen", "scopes": self.run.scopes},
            idempotency_key=key,
            missing_fields=missing,
            created_at=snap_at,
        )
        snap_ref = len(self.batch.snapshots)
        self.batch.snapshots.append((step_ref, snapshot))
        effect = SideEffect(
            idempotency_key=key,
            tool=tool,
            target=f"{tool}:x",
            params_checksum=digest(snapshot.params),
            status="committed",
            confirmed_by="tool",
            created_at=snap_at,
            attempted_at=snap_at,
        )
        tl.add(Verb.SIDE_EFFECT_INTENDED, {"step": name, "key": key, "tool": tool})
        if trouble == "unknown_confirmed":
            self.confirm_by_hand(step, step_ref, effect)
        elif trouble == "resent":
            self.resend(step, effect)
        else:
            receipt = {"key": key, "confirmed_by": "tool"}
            pause = self.rng.uniform(0.05, 0.8)
            effect.committed_at = tl.add(Verb.SIDE_EFFECT_COMMITTED, receipt, after=pause)
        effect.updated_at = effect.committed_at
        self.batch.effects.append((step_ref, snap_ref, effect))

    def confirm_by_hand(self, step: Step, step_ref: int, effect: SideEffect) -> None:
        """The call's outcome is unknown; a person finds it in the other system."""
        tl, key, actor = self.tl, effect.idempotency_key, self.actor
        tl.add(Verb.SIDE_EFFECT_UNKNOWN, {"key": key, "tool": effect.tool}, after=10)
        _fail(tl, step.name, Verb.STEP_UNKNOWN_OUTCOME, "unknown_outcome")
        self.failures += 1
        tl.add(Verb.RUN_NEEDS_HUMAN, {"from": "running", "to": "needs_human"})
        receipt = {"key": key, "confirmed_by": actor}
        pause = self.rng.uniform(120, 7200)
        confirmed = tl.add(Verb.SIDE_EFFECT_COMMITTED, receipt, after=pause, actor=actor)
        effect.confirmed_by, effect.committed_at = actor, confirmed
        self.decide(step_ref, "confirm_happened", created_at=confirmed, proof="msg-123")

    def resend(self, step: Step, effect: SideEffect) -> None:
        """The call's outcome is unknown; reconciliation says it did not land and it is sent
        again with the same key."""
        tl, key = self.tl, effect.idempotency_key
        tl.add(Verb.SIDE_EFFECT_UNKNOWN, {"key": key, "tool": effect.tool}, after=10)
        tl.add(Verb.SIDE_EFFECT_NOT_COMMITTED, {"key": key, "confirmed_by": "reconcile"})
        tl.add(Verb.SIDE_EFFECT_INTENDED, {"key": key, "step": step.name})
        step.attempts += 1
        # The resend was right most of the time; sometimes the first attempt had landed and a
        # later lookup by key finds it (a wrong retry).
        confirmed_by = "reconcile" if self.rng.random() < 0.3 else "tool"
        effect.committed_at = tl.add(
            Verb.SIDE_EFFECT_COMMITTED, {"key": key, "confirmed_by": confirmed_by}, after=20
        )
        effect.confirmed_by = confirmed_by

    def finish(self, step_names: list[str]) -> None:
        """How the run stands where its story stopped; its rows go into the batch."""
        run, tl = self.run, self.tl
        if self.status == "succeeded":
            tl.add(Verb.RUN_SUCCEEDED, {"from": "running", "to": "succeeded"})
            run.finished_at = tl.at
        elif self.status == "failed":
            run.finished_at = tl.at
        run.status = self.status
        run.stage = step_names[min(self.stop_at, len(step_names)) - 1]
        run.failure_count, run.escalation_level = self.failures, self.escalated
        run.updated_at = tl.at
        self.batch.runs.append(run)
        self.batch.events.append(tl.items)


def _insert(batch: Batch) -> None:
    events = []
    for run, items in zip(batch.runs, batch.events, strict=True):
        prev = ""
        for seq, (at, actor, verb, data) in enumerate(items, start=1):
            data_digest = digest(data)
            h = TimelineEvent.compute_hash(seq, at, actor, verb, data_digest, prev)
            event = TimelineEvent(
                run=run,
                seq=seq,
                at=at,
                actor=actor,
                verb=verb,
                data=data,
                data_digest=data_digest,
                prev_hash=prev,
                hash=h,
            )
            events.append(event)
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

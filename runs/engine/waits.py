"""Waits and wake-ups: parking a step on an event, a timer or a paused tool, and the three
things that wake it: an event delivered by correlation key, a timer that fires, a deadline that
passes (routed like any failure)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from runs.engine.dispatch import enqueue
from runs.engine.outcomes import Park
from runs.engine.routing import Origin, route_failure
from runs.models import FailureClass, InboundEvent, Run, Step, Wait, to_json_value


def park(run: Run, step: Step, park: Park, *, held_by: str) -> bool:
    """Open the step's wait; an event that already arrived, or a timer already due, settles it
    at once (True: the run goes on inline)."""
    wait = Wait.open(
        step,
        park.kind,
        event_type=park.event_type,
        correlation_key=park.correlation_key,
        due_at=park.due_at,
    )
    if wait.kind == Wait.Kind.EVENT:
        early = (
            InboundEvent.objects.select_for_update(skip_locked=True)
            .filter(
                event_type=wait.event_type,
                correlation_key=wait.correlation_key,
                matched_wait__isnull=True,
            )
            .order_by("received_at")
            .first()
        )
        if early is not None:
            # The callback came before we waited for it: consume it now.
            wait.resolve(early.payload, by=f"event:{early.event_id}")
            early.match(wait)
            step.succeed(
                early.payload, held_by=held_by, data={"event_id": early.event_id, "early": True}
            )
            return True
    if wait.kind == Wait.Kind.TIMER and wait.due_at <= timezone.now():
        wait.resolve(None, by="timer")
        step.succeed({"timer": "elapsed"}, held_by=held_by)
        return True
    step.wait(wait, held_by=held_by)
    run.wait(f"waiting for {wait.event_type or wait.kind}")
    return False


def close_recovery_wait(step: Step) -> None:
    """The tool came back (a probe succeeded): close the outage wait the step probed under."""
    for wait in Wait.objects.filter(
        step=step, kind=Wait.Kind.TOOL_RECOVERY, status=Wait.Status.PENDING
    ):
        wait.resolve(None, by="probe")


def deliver_event(
    event_id: str, event_type: str, correlation_key: str, payload: Any, *, source: str = "system"
) -> str:
    """Resolve the wait for (event_type, correlation_key), or keep the event until one exists.

    Returns "resumed", "stored" (nobody waits yet; it is matched when a wait is created) or
    "duplicate" (this event_id was seen before: acknowledged, changes nothing).
    """
    payload = to_json_value(payload)
    with transaction.atomic():
        event, created = InboundEvent.objects.get_or_create(
            event_id=event_id,
            defaults={
                "event_type": event_type,
                "correlation_key": correlation_key,
                "payload": payload,
                "source": source,
            },
        )
        if not created:
            return "duplicate"
        found = _lock_waiting(event_type, correlation_key)
        if found is None:
            return "stored"
        run, wait = found
        wait.resolve(payload, by=f"event:{event_id}", actor=source)
        event.match(wait)
        wait.step.succeed(payload, actor=source, data={"event_id": event_id})
        if run.status == Run.Status.WAITING:
            run.resume(actor=source, reason=f"event {event_type}")
            enqueue(run.pk)
    return "resumed"


def _lock_waiting(event_type: str, correlation_key: str) -> tuple[Run, Wait] | None:
    """The oldest pending wait for the event, locked in the lock order: find it without a lock,
    lock its run, then the wait, and look again when it was settled meanwhile."""
    pending = Wait.objects.filter(
        kind=Wait.Kind.EVENT,
        status=Wait.Status.PENDING,
        event_type=event_type,
        correlation_key=correlation_key,
    ).order_by("created_at")
    while True:
        candidate = pending.values_list("pk", "run_id").first()
        if candidate is None:
            return None
        run = Run.objects.select_for_update().get(pk=candidate[1])
        wait = (
            pending.select_for_update(of=("self",))
            .select_related("step")
            .filter(pk=candidate[0])
            .first()
        )
        if wait is not None:
            return run, wait


def wake(wait: Wait, now: datetime) -> bool:
    """A due timer fires, or an event wait's deadline passes (routed with failure class
    `timeout`). Returns False when someone else got there first."""
    with transaction.atomic():
        # The lock order: the run, then the wait. A run someone is acting on is left for the
        # next pass rather than waited for.
        if not Run.lock(wait.run_id, skip_locked=True):
            return False
        locked = Wait.objects.select_for_update().filter(pk=wait.pk, status=Wait.Status.PENDING)
        if locked.first() is None:
            return False
        run = Run.objects.get(pk=wait.run_id)
        step = Step.objects.get(pk=wait.step_id)
        if wait.kind == Wait.Kind.TIMER:
            wait.resolve(None, by="timer")
            step.succeed({"timer": "elapsed"})
            if run.status == Run.Status.WAITING:
                run.resume(reason="timer elapsed")
            return True
        wait.expire()
        reason = (
            f"No {wait.event_type} event for {wait.correlation_key} arrived by "
            f"{wait.due_at:%Y-%m-%d %H:%M:%S} UTC."
        )
        route_failure(run, step, FailureClass.TIMEOUT, reason, origin=Origin.TIMEOUT)
        return True

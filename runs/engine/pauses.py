"""Steps held by a tool pause: an admin's pause, or one the engine opened when the tool's API
drifted (runs.engine.routing). A held step waits like an outage wait, but is not a failure
unless its own call opened the pause; a resume wakes it (approvals.rules.resume_tool)."""

from __future__ import annotations

from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from runs.engine.outcomes import HeldByPause
from runs.models import Run, Step, Wait

# A step held by a pause is looked at again this often even if nobody resumes the tool (a pause
# closed by other means than approvals.rules.resume_tool, which wakes the held steps at once).
PAUSE_RECHECK = timedelta(hours=1)


def hold_for_pause(
    run: Run, step: Step, held: HeldByPause, *, held_by: str, failure: dict | None = None
) -> bool:
    """Park the step like an outage wait, but not as a failure: the claim's attempt is given
    back and no failure is counted (`failure`: the step's own call opened the pause, see
    Step.hold_for_pause)."""
    correlation = f"pause:{held.pause}"
    wait = Wait.objects.filter(step=step, status=Wait.Status.PENDING).first()
    if wait is None:
        Wait.open(step, Wait.Kind.TOOL_RECOVERY, event_type=held.tool, correlation_key=correlation)
    elif wait.correlation_key != correlation:
        wait.rekey(correlation)
    pause = {"tool": held.tool, "pause": held.pause, "reason": held.reason}
    step.hold_for_pause(
        held_by=held_by, recheck_at=timezone.now() + PAUSE_RECHECK, pause=pause, failure=failure
    )
    by = "TaskPilots" if failure is not None else "an admin"
    run.wait(f"{held.tool} is paused by {by}: {held.reason}"[:2000])
    return False


def end_pause_hold(run: Run, step: Step) -> None:
    """The paused tool is back: close the step's pause wait before it is called."""
    with transaction.atomic():
        Run.lock(run.pk)
        for wait in Wait.objects.filter(
            step=step,
            kind=Wait.Kind.TOOL_RECOVERY,
            status=Wait.Status.PENDING,
            correlation_key__startswith="pause:",
        ):
            wait.resolve(None, by="tool resumed")
        step.end_pause_hold()

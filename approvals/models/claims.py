"""Soft claims (“I'll handle it”) and the queues people work from."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import models, transaction
from django.db.models import Q
from django.utils import timezone

from approvals.models.notifications import NotificationChannel
from approvals.models.rules import EscalationRule
from runs.models import (
    InvalidTransition,
    Run,
)


class ClaimHeld(Exception):
    """Someone else holds the run's soft claim (`claim` is theirs)."""

    def __init__(self, claim: SoftClaim):
        super().__init__(f"run {claim.run_id} is claimed by {claim.user}")
        self.claim = claim


class SoftClaim(models.Model):
    """“I'll handle it”: a person says, for a few minutes, that they are working a run, so that
    two people do not work the same one (approvals/live.py shows it on the run page and inbox).

    Advisory, not a lock: anyone who may act still can (after confirming a warning); the hard
    guards stay the takeover and the run's version check. So a claim is not a state change of
    the run: it never bumps Run.lock_version and writes no timeline event (who decided what is
    in HumanDecision). One row per run, kept after release or expiry (expires_at in the past),
    so `changed_at` only moves forward: the live pages' stamp is max(changed_at).
    """

    run = models.OneToOneField(Run, on_delete=models.CASCADE, related_name="soft_claim")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    claimed_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    changed_at = models.DateTimeField(db_index=True)

    def __str__(self) -> str:
        return f"{self.user} handles {self.run_id} until {self.expires_at:%H:%M:%S}"

    def is_active(self, now=None) -> bool:
        return self.expires_at > (now or timezone.now())

    def minutes_left(self, now=None) -> int:
        seconds = (self.expires_at - (now or timezone.now())).total_seconds()
        return max(1, int(-(-seconds // 60))) if seconds > 0 else 0

    @classmethod
    def claim(cls, run: Run, user, *, minutes: int) -> SoftClaim:
        """Claim `run` for `user` for `minutes` (or extend their own claim by as much from now).

        Serialised on the run's row lock (as every change to one run is, runs/models/run.py
        Run.lock), so two people pressing “I'll handle it” at once get one claim and one
        ClaimHeld. A finished run cannot be claimed (InvalidTransition)."""
        now = timezone.now()
        with transaction.atomic():
            Run.lock(run.pk)
            status = Run.objects.filter(pk=run.pk).values_list("status", flat=True).first()
            if status is None or status in Run.TERMINAL:
                raise InvalidTransition("run", run.pk, status, "claimed")
            claim = cls.objects.filter(run_id=run.pk).select_related("user").first()
            if claim and claim.is_active(now) and claim.user_id != user.pk:
                raise ClaimHeld(claim)
            if claim is None:
                claim = cls(run_id=run.pk)
            if not (claim.pk and claim.is_active(now)):
                claim.claimed_at = now
            claim.user = user
            claim.expires_at = now + timedelta(minutes=minutes)
            claim.changed_at = now
            claim.save()
            return claim

    @classmethod
    def release(cls, run: Run, user, *, admin: bool = False) -> bool:
        """End `user`'s claim on `run` now (an admin may end anyone's). False: nothing to end."""
        now = timezone.now()
        mine = Q() if admin else Q(user=user)
        ended = cls.objects.filter(mine, run_id=run.pk, expires_at__gt=now).update(
            expires_at=now, changed_at=now
        )
        return bool(ended)


def known_queues() -> list[str]:
    """The queues people work from: the escalation rules', the approval steps' of registered
    workflows and the notification channels' (no scan of the runs)."""
    from runs import workflows as workflow_registry

    channels = NotificationChannel.objects.order_by().values_list("queue", flat=True)
    rules = EscalationRule.objects.order_by().values_list("queue", flat=True)
    queues = set(rules.union(channels).order_by())  # one query
    for definition in workflow_registry.all_workflows():
        queues.update(s.queue for s in definition.steps if s.kind == "approval")
    return sorted(q for q in queues if q)


def routed_queues() -> set[str]:
    """The queues runs can be sent to: the rules' (and their SLA's next queue), the approval
    steps' of registered workflows, and the engine's own `ops` and `support`."""
    from runs import workflows as workflow_registry

    rules = EscalationRule.objects.order_by().values_list("queue", "escalate_to")
    queues = {"ops", "support", *(q for pair in rules for q in pair)}
    for definition in workflow_registry.all_workflows():
        queues.update(s.queue for s in definition.steps if s.kind == "approval")
    return {q for q in queues if q}

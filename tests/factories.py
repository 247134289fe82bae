from __future__ import annotations

from datetime import timedelta

import factory
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.utils import timezone

from approvals.models import ApprovalRequest, EscalationRule, HumanDecision, Takeover
from runs.models import (
    InboundEvent,
    Run,
    SideEffect,
    Snapshot,
    Step,
    StepKind,
    TimelineEvent,
    Wait,
    digest,
)


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda u: f"{u.username}@example.com")
    password = factory.PostGenerationMethodCall("set_password", "correct horse battery")

    @factory.post_generation
    def groups(self, create, extracted, **kwargs):
        for name in extracted or []:
            self.groups.add(Group.objects.get_or_create(name=name)[0])
        self.save()


class RunFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Run

    workflow = "test.flow"
    workflow_version = 1
    input = factory.LazyFunction(lambda: {"customer": "c-1"})
    input_digest = factory.LazyAttribute(lambda run: digest(run.input))
    stage = "start"


class StepFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Step

    run = factory.SubFactory(RunFactory)
    name = factory.Sequence(lambda n: f"step{n}")
    position = factory.Sequence(lambda n: n)
    kind = StepKind.COMPUTE


class SnapshotFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Snapshot

    step = factory.SubFactory(StepFactory, kind=StepKind.SIDE_EFFECT, tool="mail.send")
    run = factory.LazyAttribute(lambda s: s.step.run)
    attempt = 1
    workflow_version = 1
    stage = "reply"
    tool = "mail.send"
    params = factory.LazyFunction(lambda: {"to": "a@example.com", "subject": "Hi"})
    target_resource = "mailbox:a@example.com"
    permissions = factory.LazyFunction(lambda: {"actor": "system", "scopes": ["mail:send"]})
    idempotency_key = factory.Sequence(lambda n: f"tp-test-{n}")


class SideEffectFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = SideEffect

    snapshot = factory.SubFactory(SnapshotFactory)
    run = factory.LazyAttribute(lambda s: s.snapshot.run)
    step = factory.LazyAttribute(lambda s: s.snapshot.step)
    idempotency_key = factory.LazyAttribute(lambda s: s.snapshot.idempotency_key)
    tool = factory.LazyAttribute(lambda s: s.snapshot.tool)
    params_checksum = factory.LazyAttribute(lambda s: digest(s.snapshot.params))


class WaitFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Wait

    step = factory.SubFactory(StepFactory, kind=StepKind.WAIT_EVENT)
    run = factory.LazyAttribute(lambda w: w.step.run)
    kind = Wait.Kind.EVENT
    event_type = "payment.settled"
    correlation_key = factory.Sequence(lambda n: f"corr-{n}")


class InboundEventFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = InboundEvent

    event_id = factory.Sequence(lambda n: f"evt-{n}")
    event_type = "payment.settled"
    correlation_key = factory.Sequence(lambda n: f"corr-{n}")


class TimelineEventFactory(factory.django.DjangoModelFactory):
    """Timeline events are appended through the chain, never constructed by hand."""

    class Meta:
        model = TimelineEvent

    run = factory.SubFactory(RunFactory)
    verb = "test.event"
    data = factory.LazyFunction(dict)

    @classmethod
    def _create(cls, model_class, run, verb, data, **kwargs):
        return TimelineEvent.append(run.pk, verb, data, actor=kwargs.get("actor", "system"))


class ApprovalRequestFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = ApprovalRequest

    step = factory.SubFactory(StepFactory, kind=StepKind.APPROVAL)
    run = factory.LazyAttribute(lambda a: a.step.run)
    reason = "Refund above the approval threshold"
    tool = "payments.refund"
    proposed_params = factory.LazyFunction(lambda: {"amount": 250, "payment_id": "pay_1"})
    due_at = factory.LazyFunction(lambda: timezone.now() + timedelta(hours=4))


class TakeoverFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Takeover

    run = factory.SubFactory(RunFactory)
    user = factory.SubFactory(UserFactory)


class HumanDecisionFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = HumanDecision

    run = factory.SubFactory(RunFactory)
    user = factory.SubFactory(UserFactory)
    verb = HumanDecision.Verb.APPROVE


class EscalationRuleFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = EscalationRule

    position = factory.Sequence(lambda n: n)
    name = factory.Sequence(lambda n: f"rule {n}")
    action = EscalationRule.Action.ESCALATE

"""What the models share: transition errors, leases, status fields with their check constraints,
append-only models, the enumerations, unsaved rows for the hot path, receipts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _
from psycopg.types.json import Jsonb

from runs.models.values import canonical_json, digest, to_json_value


class TransitionError(Exception):
    """A state change that is not allowed from the row's current state."""


class InvalidTransition(TransitionError):
    def __init__(self, model: str, pk: Any, current: str, target: str):
        self.current, self.target = current, target
        super().__init__(f"{model} {pk}: cannot go from {current!r} to {target!r}")


class ConcurrentUpdate(TransitionError):
    """Someone else changed the row first (version or lease no longer matches)."""


class ImmutableRecord(Exception):
    """Snapshots and timeline events are written once and never changed."""


@dataclass(frozen=True)
class Lease:
    """A worker's claim on a running step: who holds it, and for which attempt.

    The attempt is the fencing value: every claim and every reclaim of a step raises it, so a
    worker that was only paused (SIGSTOP, a GC pause, a frozen VM) and whose step was taken back
    meanwhile no longer matches, even when the new owner is another thread of the same process.
    Recording an outcome, writing an intent and making the call are all conditional on it.
    """

    owner: str
    attempt: int


def _choices_check(field: str, choices: type[models.TextChoices], name: str):
    return models.CheckConstraint(condition=Q(**{f"{field}__in": choices.values}), name=name)


class ChoicesField(models.CharField):
    """A CharField whose allowed values PostgreSQL checks through a domain of that name.

    For the columns every statement of the engine's hot path writes (a run's, a step's and a
    ledger row's status, a step's kind): PostgreSQL compiles a domain's CHECK once per
    connection, where it reads a table's CHECK constraint again, from its text, in every
    statement that writes the table. A migration creates the domain before the column takes
    it (runs/migrations/0021_status_domains.py); a new choice needs a migration that changes
    the domain's CHECK (tests/runs/test_models.py compares each domain with its choices).
    """

    def __init__(self, *args, domain: str = "", **kwargs):
        self.domain = domain
        super().__init__(*args, **kwargs)

    def deconstruct(self):
        name, path, args, kwargs = super().deconstruct()
        kwargs["domain"] = self.domain
        return name, path, args, kwargs

    def db_type(self, connection) -> str:
        return self.domain


# (id of a transition table, target) → (the table, the states it may come from): tables are
# the models' constants, worked out once (the engine's hot path moves states per step).
_SOURCES: dict[tuple[int, str], tuple[dict, tuple[str, ...]]] = {}


def _sources(table: dict[str, set[str]], target: str) -> tuple[str, ...]:
    """The states `table` allows to move to `target`, in the table's order."""
    known = _SOURCES.get((id(table), target))
    if known is None or known[0] is not table:
        sources = tuple(source for source, targets in table.items() if target in targets)
        known = _SOURCES[(id(table), target)] = (table, sources)
    return known[1]


def _empty(value: Any, name: str) -> bool:
    if name == "permissions":
        value = value and value.get("actor")
    return value in (None, "", [], {})


class ImmutableQuerySet(models.QuerySet):
    def update(self, **kwargs):
        raise ImmutableRecord(f"{self.model.__name__} rows cannot be updated")

    def delete(self):
        raise ImmutableRecord(f"{self.model.__name__} rows cannot be deleted")


class ImmutableModel(models.Model):
    objects = ImmutableQuerySet.as_manager()

    class Meta:
        abstract = True

    def save(self, *args, **kwargs):
        if not self._state.adding:
            raise ImmutableRecord(f"{type(self).__name__} {self.pk} cannot be changed")
        kwargs["force_insert"] = True
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise ImmutableRecord(f"{type(self).__name__} {self.pk} cannot be deleted")


# --------------------------------------------------------------------------------------------
# Failure classes and step kinds (shared vocabulary of tools, the router and the console)


# The labels of these two are shown in the console (rule chips, the tester, risk badges), so
# they are translatable (locale/; makemessages reads runs/).
class FailureClass(models.TextChoices):
    TRANSIENT = "transient", _("Transient (retryable)")
    OUTAGE = "outage", _("External outage")
    INVALID_INPUT = "invalid_input", _("Invalid input (data uncertainty)")
    PERMISSION = "permission", _("Permission denied")
    UNKNOWN_OUTCOME = "unknown_outcome", _("Unknown outcome (side-effect boundary)")
    # A read that found nothing where something was expected (404/410, or an empty answer from
    # a tool that declares `expects_result`): the data is missing, not the system.
    EMPTY_RESULT = "empty_result", _("Empty result")
    # The system answers in a shape the adapter was not written for (406, an unknown field, a
    # response that fails the tool's response check): every call will fail the same way.
    API_DRIFT = "api_drift", _("API version drift")
    # Not a tool error: a wait or approval reached its deadline undecided.
    TIMEOUT = "timeout", _("Wait timed out")


class RecoveryCause(models.TextChoices):
    """Why the engine could not resume a run by itself although nothing failed: metadata the
    resume needs is gone. Written into `run.needs_human` (`data.cause`); the metrics count it."""

    WORKFLOW_NOT_REGISTERED = "workflow_not_registered", _("Workflow version not registered")
    STEP_NOT_IN_WORKFLOW = "step_not_in_workflow", _("Step no longer in the workflow")
    NOTHING_TO_WAIT_FOR = "nothing_to_wait_for", _("Waiting with nothing to wait for")


class Risk(models.TextChoices):
    LOW = "low", _("Low")
    MEDIUM = "medium", _("Medium")
    HIGH = "high", _("High")


class RouteAction(models.TextChoices):
    """What an escalation rule does with a failure (the router's vocabulary)."""

    RETRY = "retry", _("Retry with backoff")
    WAIT = "wait", _("Wait for the outage")
    DEGRADE = "degrade", _("Degrade to the fallback tool")
    COMPENSATE = "compensate", _("Compensate committed side effects")
    ESCALATE = "escalate", _("Escalate to a person")
    FAIL = "fail", _("Fail the run")
    # Not a route: a rule with this action puts matching calls behind a person's approval
    # (runs.engine.gate); the router never picks it for a failure.
    APPROVE = "approve", _("Ask a person to approve the call")


class StepKind(models.TextChoices):
    COMPUTE = "compute", _("Compute")
    READ = "read", _("Read")
    SIDE_EFFECT = "side_effect", _("Side effect")
    APPROVAL = "approval", _("Approval")
    WAIT_EVENT = "wait_event", _("Wait for event")
    WAIT_TIMER = "wait_timer", _("Wait for timer")


_ROW_DEFAULTS: dict[type, list[tuple[str, Any, bool]]] = {}


def new_row(model: type[models.Model], cache: dict | None = None, **values: Any):
    """An unsaved instance of `model` with `values` (attribute names: `run_id`, not `run`),
    every other field at its default — without Model.__init__'s per-field work: the engine's
    hot path builds a few per step. `cache` holds related objects already known (`run`)."""
    if model not in _ROW_DEFAULTS:
        _ROW_DEFAULTS[model] = [
            (f.attname, f.default, callable(f.default))
            if f.has_default()
            else (f.attname, None, False)
            for f in model._meta.concrete_fields
        ]
    instance = model.__new__(model)
    attributes = instance.__dict__
    for attname, default, call in _ROW_DEFAULTS[model]:
        if attname in values:
            attributes[attname] = values[attname]
        else:
            attributes[attname] = default() if call else default
    instance._state = models.base.ModelState()
    if cache:
        instance._state.fields_cache.update(cache)
    return instance


# A compare-and-set's guard on a lease's expiry (runs.batch.Batch.update): the lease is still
# unexpired when the statement runs, by the database's clock.
LEASE_UNEXPIRED = object()


class SqlValue(str):
    """A column's new value written as SQL, not as a parameter (e.g. `lock_version + 1`)."""


def db_json(value: Any):
    """A JSONField's value as the ORM stores it, for raw statements (None is SQL NULL)."""
    return None if value is None else Jsonb(value, dumps=canonical_json)


@dataclass(frozen=True)
class Receipt:
    """What proves a side effect happened: the other system's id for it and its answer."""

    external_id: str
    response: Any

    def as_json(self) -> dict:
        return to_json_value(
            {
                "external_id": self.external_id,
                "response": self.response,
                "response_digest": digest(self.response),
            }
        )

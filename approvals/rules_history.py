"""A rule change tested against history: what the proposed rules would have done to the last 7
or 30 days of failures, next to what the rules in force do to the same failures.

Nothing is saved. The proposed rule set is the rules in force with the edited (or new) rule put
in its place in memory; each failure of the window is routed through both sets by the engine's
own routing (runs.engine.routing.decide: the same first-match and the same narrowing), so the
preview cannot disagree with what the engine would do.

What counts as one failure: a routing decision the timeline recorded (a failed attempt retried,
waited on, escalated, failed, degraded, or an unknown outcome; a wait or SLA that timed out),
read newest first, at most SCAN_CAP of them, in one query (the step's tool and status come from
a subquery). A step's failures are replayed in order, and a route that ends them drops the
later ones (they would not have happened). Approximations (docs/rules.md, "Testing a change
against history"):

- a retry reaches a person on the failure whose attempt number reaches max_attempts;
- a step still retrying or waiting when its history ends counts as done when it succeeded, and
  as "cannot tell" when it did not (the rules in force ended it; more attempts might have
  worked); a wait window is not replayed (history does not say how long the tool was out);
- escalate reaches a person; degrade (assumed to work), compensate and fail do not;
- a wait whose window the timeline shows closing on a tool still failing (`step.escalated`
  with the routing action `wait`) reaches a person, as it did: the engine handed it on;
- an API drift that would be escalated pauses its tool instead, as the engine does
  (runs.engine.routing): the step waits for an admin to resume the tool and reaches no person
  of its own;
- a tool's risk is the one registered now.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta

from django.db.models import IntegerField, OuterRef, Q, Subquery
from django.db.models.fields.json import KT
from django.db.models.functions import Cast
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from approvals.models import EscalationRule
from runs.engine import Origin, decide, tool_risk
from runs.models import FailureClass, RouteAction, Step, TimelineEvent
from runs.verbs import Verb

A = RouteAction
WINDOWS = (7, 30)
# How many failures one preview reads at most (newest first); the page says when it stopped.
SCAN_CAP = 20_000
# Example runs shown per changed route.
EXAMPLES = 5


# The timeline events of a routing decision on a failed attempt or a timed-out wait (a person's
# own escalate or fail carries no routing and is left out; so does a pause an admin opened).
# Indexed (runs_timeline_failure_idx).
FAILURE_VERBS = (
    Verb.STEP_RETRY_SCHEDULED,
    Verb.STEP_WAITING_FOR_TOOL,
    Verb.STEP_ESCALATED,
    Verb.STEP_FAILED,
    Verb.STEP_UNKNOWN_OUTCOME,
    Verb.STEP_DEGRADED,
    Verb.STEP_TOOL_PAUSED,
)
# Where a step's failing ends when it is not a route: its drifted tool paused.
PAUSE_TOOL = "pause_tool"
END_LABELS = {**dict(A.choices), PAUSE_TOOL: _("Pause the tool (API drift)")}
UNROUTED = (Verb.STEP_UNKNOWN_OUTCOME, Verb.STEP_DEGRADED)  # no routing in their data


@dataclass(frozen=True)
class Failure:
    """One failed attempt (or timed-out wait) as the timeline recorded it."""

    run_id: object
    workflow: str
    step: str
    tool: str
    failure_class: str
    attempt: int
    # The engine recorded this failure as the end of a wait window: the tool was still failing
    # when the window closed and the step went to a person (`step.escalated` whose routing's
    # action is `wait`, as runs.engine.routing writes it).
    window_closed: bool = False


@dataclass
class Episode:
    """A step's failures in order, and whether the step got done in the end."""

    failures: list[Failure]
    recovered: bool


@dataclass(frozen=True)
class Outcome:
    actions: tuple[str, ...]  # the route of each failure that would have happened
    person: bool | None  # None: history cannot tell
    end: str  # where the step's failing ended: the last route, escalate for a spent retry


def route(rules: list, failure: Failure):
    """One failure through the engine's routing with `rules` (in order, enabled only)."""
    timeout = failure.failure_class == FailureClass.TIMEOUT
    return decide(
        rules,
        workflow=failure.workflow,
        step=failure.step,
        tool=failure.tool,
        failure_class=failure.failure_class,
        risk=tool_risk(failure.tool),
        origin=Origin.TIMEOUT if timeout else Origin.ATTEMPT,
    )


def outcome(rules: list, episode: Episode) -> Outcome:
    """Replay a step's failures through `rules`: each is routed as the engine would; a route
    that ends the step's failing (a person, a fallback, compensation, failing the run, a retry
    whose attempts are spent) ends the replay: the later failures would not have happened."""
    actions: list[str] = []
    for failure in episode.failures:
        rule, action = route(rules, failure)
        actions.append(action)
        if action == A.RETRY and failure.attempt < rule.max_attempts:
            continue  # tried again: history says how that went
        if action == A.WAIT and not failure.window_closed:
            continue  # probed again (the wait window is not replayed)
        if action == A.WAIT:  # the window closed on a tool still failing: a person
            return Outcome(tuple(actions), True, A.ESCALATE)
        if action in (A.ESCALATE, A.RETRY):
            if failure.failure_class == FailureClass.API_DRIFT and failure.tool:
                return Outcome(tuple(actions), False, PAUSE_TOOL)
            return Outcome(tuple(actions), True, A.ESCALATE)
        return Outcome(tuple(actions), False, action)
    # Still retrying or waiting after the last failure history has: done if the step got done,
    # otherwise history stops (the rules in force ended it) and cannot tell.
    return Outcome(tuple(actions), False if episode.recovered else None, actions[-1])


@dataclass
class Side:
    """What one rule set does to the window: failures counted by route (`actions`), failing
    steps by where they ended (`person`, `no_person`, `cannot_tell`); the two never mix."""

    actions: Counter = field(default_factory=Counter)
    person: int = 0
    no_person: int = 0
    cannot_tell: int = 0

    def add(self, result: Outcome) -> None:
        self.actions.update(result.actions)
        if result.person:
            self.person += 1
        elif result.person is None:
            self.cannot_tell += 1
        else:
            self.no_person += 1


@dataclass
class Comparison:
    days: int
    scanned: int  # failures read
    steps: int  # the steps they belong to
    capped: bool
    current: Side
    proposed: Side
    changed: int  # steps whose failures take another route (or end elsewhere)
    # (where it ended now, where it ends proposed) → how many steps, up to EXAMPLES run ids
    changes: dict[tuple[str, str], dict] = field(default_factory=dict)

    def rows(self) -> list[dict]:
        """Per action: how many failures it takes now and with the change."""
        return [
            {
                "action": action,
                "label": A(action).label,
                "current": self.current.actions.get(action, 0),
                "proposed": self.proposed.actions.get(action, 0),
            }
            for action in A.values
            if self.current.actions.get(action) or self.proposed.actions.get(action)
        ]

    def change_rows(self) -> list[dict]:
        return [
            {"before": END_LABELS[before], "after": END_LABELS[after], **found}
            for (before, after), found in sorted(
                self.changes.items(), key=lambda item: -item[1]["count"]
            )
        ]


def failures(days: int, cap: int) -> tuple[list[Episode], int, bool]:
    """The window's failures, newest first, at most `cap`, grouped by step (one query).
    Returns (episodes, failures read, capped)."""
    since = timezone.now() - timedelta(days=days)
    step = Step.objects.filter(
        run_id=OuterRef("run_id"),
        name=OuterRef("step_name"),
        iteration=OuterRef("step_iteration"),
    )
    rows = list(
        TimelineEvent.objects.filter(verb__in=FAILURE_VERBS, at__gte=since)
        .filter(Q(data__has_key="routing") | Q(verb__in=UNROUTED))
        .annotate(
            step_name=KT("data__step"),
            step_iteration=Cast(KT("data__iteration"), IntegerField()),
            failure_class=KT("data__routing__failure_class"),
            routed=KT("data__routing__action"),
            attempt=Cast(KT("data__attempt"), IntegerField()),
            tool=Subquery(step.values("tool")[:1]),
            step_status=Subquery(step.values("status")[:1]),
            step_error=Subquery(step.values("error_class")[:1]),
        )
        .order_by("-at", "-seq")
        .values_list(
            "run_id",
            "run__workflow",
            "step_name",
            "step_iteration",
            "verb",
            "failure_class",
            "attempt",
            "tool",
            "step_status",
            "step_error",
            "routed",
            "seq",
        )[: cap + 1]
    )
    capped = len(rows) > cap
    grouped: dict[tuple, list] = {}
    for row in rows[:cap]:
        grouped.setdefault((row[0], row[2], row[3]), []).append(row)
    episodes = []
    for events in grouped.values():
        events.sort(key=lambda row: row[-1])  # by seq: oldest first
        found, attempt = [], 0
        for run_id, workflow, name, _i, verb, cls, number, tool, _s, error, routed, _seq in events:
            if verb == Verb.STEP_UNKNOWN_OUTCOME:
                cls = FailureClass.UNKNOWN_OUTCOME
            attempt = number if number is not None else attempt + 1
            closed = verb == Verb.STEP_ESCALATED and routed == A.WAIT
            found.append(
                Failure(run_id, workflow, name, tool or "", cls or error or "", attempt, closed)
            )
        status = events[0][8]
        recovered = status in (Step.Status.SUCCEEDED, Step.Status.DEGRADED)
        episodes.append(Episode(found, recovered))
    return episodes, min(len(rows), cap), capped


def rules_in_force() -> list[EscalationRule]:
    return list(EscalationRule.objects.filter(enabled=True).order_by("position", "id"))


def with_change(current: list[EscalationRule], edited: EscalationRule) -> list[EscalationRule]:
    """The rules in force with `edited` (unsaved) in its place: replacing the saved rule of the
    same id, or added (a new rule); in routing order, enabled only."""
    others = [rule for rule in current if rule.pk is None or rule.pk != edited.pk]
    ordered = [*others, edited] if edited.enabled else others

    def order(rule):
        return (rule.position, rule.pk is None, rule.pk or 0)

    return sorted(ordered, key=order)


def compare(
    current: list, proposed: list, days: int, *, cap: int | None = None, examples: int = EXAMPLES
) -> Comparison:
    """Replay the window's failures through both rule sets (no query but the scan)."""
    episodes, scanned, capped = failures(days, SCAN_CAP if cap is None else cap)
    result = Comparison(days, scanned, len(episodes), capped, Side(), Side(), 0)
    for episode in episodes:
        before, after = outcome(current, episode), outcome(proposed, episode)
        result.current.add(before)
        result.proposed.add(after)
        if before != after:
            result.changed += 1
            change = result.changes.setdefault((before.end, after.end), {"count": 0, "runs": []})
            change["count"] += 1
            run_id = episode.failures[0].run_id
            if len(change["runs"]) < examples and run_id not in change["runs"]:
                change["runs"].append(run_id)
    return result


def preview(edited: EscalationRule, days: int) -> Comparison:
    """What saving `edited` would have done to the last `days` days of failures."""
    current = rules_in_force()
    return compare(current, with_change(current, edited), days)

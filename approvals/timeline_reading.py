"""The run timeline made for reading (approvals/audit_views.py `run_timeline`): one line per
event, repeated identical attempts collapsed into one line, filters and a text search over the
run's events, and the summary an auditor reads first (failures grouped by step and error, the
people's decisions). Pure functions over the events already loaded for the lane chart: no query
of their own, except `decision_lines` (one)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from django.urls import reverse
from django.utils.translation import gettext_lazy

from approvals import console
from approvals.models import HumanDecision
from runs.engine import params_change
from runs.models import TimelineEvent, shown
from runs.verbs import Verb

LINES_PER_PAGE = 80
# Verbs that mean something went wrong (the lane chart marks the same ones).
FAILURE_VERBS = frozenset(
    {
        "step.failed",
        Verb.STEP_RETRY_SCHEDULED,
        Verb.STEP_UNKNOWN_OUTCOME,
        Verb.SIDE_EFFECT_UNKNOWN,
        Verb.STEP_ESCALATED,
        Verb.SIDE_EFFECT_RECHECK_SCHEDULED,
        Verb.RUN_FAILED,
        Verb.STEP_WAITING_FOR_TOOL,
    }
)
STATUS_IN_ERROR = re.compile(r"\b(?:answered|status|HTTP) ?(\d{3})\b")
ERROR_CHARS = 90
BRIEF_CHARS = 120


def data_of(event: TimelineEvent) -> dict:
    return event.data if isinstance(event.data, dict) else {}


def _cut(value: Any, limit: int = BRIEF_CHARS) -> str:
    text = value if isinstance(value, str) else shown(value, limit)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def is_failure(event: TimelineEvent) -> bool:
    to = data_of(event).get("to")
    return event.verb in FAILURE_VERBS or to in ("failed", "unknown_outcome")


def step_of(event: TimelineEvent) -> str:
    step = data_of(event).get("step")
    return step if isinstance(step, str) else ""


def error_of(event: TimelineEvent) -> str:
    """The event's error in a few words: "503" when a tool answered with a status, else the
    start of its message."""
    data = data_of(event)
    text = data.get("error") or data.get("reason") or ""
    if not isinstance(text, str):
        text = shown(text, ERROR_CHARS)
    match = STATUS_IN_ERROR.search(text)
    if match:
        return match.group(1)
    return text[:ERROR_CHARS] or event.verb


@dataclass
class Line:
    """One line of the reading timeline: an event, or repeated identical attempts of a step
    (`events` holds them all, `event` the first)."""

    event: TimelineEvent
    events: list[TimelineEvent] = field(default_factory=list)
    failure: bool = False
    first_attempt: int = 0
    last_attempt: int = 0
    tool: str = ""
    error: str = ""
    previous_failure: str = ""  # hrefs of the failure lines around this one
    next_failure: str = ""

    @property
    def is_group(self) -> bool:
        return len(self.events) > 1

    @property
    def is_human(self) -> bool:
        return self.event.actor.startswith("user:")

    @property
    def anchor(self) -> str:
        return f"attempts-{self.event.seq}" if self.is_group else f"event-{self.event.seq}"

    @property
    def brief(self) -> str:
        """A few words after the verb: the error of a failure, else the tool and the move."""
        data = data_of(self.event)
        if self.failure:
            return _cut(data.get("error") or data.get("reason") or "")
        parts = [data.get("tool"), data.get("target")]
        if isinstance(data.get("to"), str):
            moved_from = data.get("from")
            parts.append(f"{moved_from} → {data['to']}" if moved_from else f"→ {data['to']}")
        return _cut(" · ".join(str(p) for p in parts if p))

    @property
    def last_seq(self) -> int:
        return self.events[-1].seq if self.events else self.event.seq


# --------------------------------------------------------------------------------------------
# Collapsing repeated attempts


def _attempts(events: list[TimelineEvent]) -> list[list[TimelineEvent]]:
    """The events cut into segments: each step.started begins one (an attempt) that runs until
    the step's next move (retry scheduled, succeeded...), or an event about another step, the
    run or by a person; other events are segments of their own."""
    segments: list[list[TimelineEvent]] = []
    current: list[TimelineEvent] | None = None
    for event in events:
        if event.verb == Verb.STEP_STARTED:
            current = [event]
            segments.append(current)
        elif current is not None and step_of(event) in ("", step_of(current[0])):
            if event.verb.startswith("run.") or event.actor != "system":
                current = None
                segments.append([event])
            else:
                current.append(event)
                if event.verb.startswith("step."):  # the step moved on: the attempt ended
                    current = None
        else:
            current = None
            segments.append([event])
    return segments


def _signature(segment: list[TimelineEvent]) -> tuple | None:
    """What makes two attempts the same: the verbs, actors and errors in order. None for a
    segment that is neither a failed attempt nor a failure on its own (the filtered list of
    failures): it is never collapsed."""
    if not any(is_failure(e) for e in segment):
        return None
    if segment[0].verb != Verb.STEP_STARTED and len(segment) > 1:
        return None
    return (step_of(segment[0]),) + tuple(
        (e.verb, e.actor, error_of(e) if is_failure(e) else "") for e in segment
    )


def collapse(events: list[TimelineEvent]) -> list[Line]:
    """One line per event, but a failed attempt repeated identically (same step, same verbs,
    same error) is shown once and its repeats become one line: "attempts 2–110: 503 from
    mail.send"."""
    lines: list[Line] = []
    previous: tuple | None = None
    group: Line | None = None
    for segment in _attempts(events):
        signature = _signature(segment)
        same = signature is not None and signature == previous
        if same and group is not None:
            group.events.extend(segment)
            group.last_attempt = _attempt(segment[0])
        elif same:
            group = _group(segment)
            lines.append(group)
        else:
            group = None
            lines.extend(Line(e, failure=is_failure(e)) for e in segment)
        previous = signature
    return lines


def _attempt(event: TimelineEvent) -> int:
    attempt = data_of(event).get("attempt")
    return attempt if isinstance(attempt, int) else 0


def _group(segment: list[TimelineEvent]) -> Line:
    failure = next(e for e in segment if is_failure(e))
    tool = next((data_of(e).get("tool") for e in segment if data_of(e).get("tool")), "")
    return Line(
        segment[0],
        events=list(segment),
        failure=True,
        first_attempt=_attempt(segment[0]),
        last_attempt=_attempt(segment[0]),
        tool=str(tool),
        error=error_of(failure),
    )


def part_urls(run) -> dict[str, str]:
    """Where a line's payload and a collapsed line's events are fetched from: reversed once per
    page, not once per line ("…/events/" + seq + "/")."""
    event = reverse("console:run-timeline-event", args=[run.pk, 0])
    return {
        "event": event.removesuffix("0/"),
        "range": reverse("console:run-timeline-range", args=[run.pk]),
    }


def page_hrefs(lines: list[Line], per_page: int = LINES_PER_PAGE) -> dict[int, str]:
    """Every event's seq → "?page=N#anchor" of the line that holds it (a collapsed line for the
    events inside one)."""
    hrefs: dict[int, str] = {}
    for index, line in enumerate(lines):
        href = f"?page={index // per_page + 1}#{line.anchor}"
        for event in line.events or [line.event]:
            hrefs[event.seq] = href
    return hrefs


def link_failures(lines: list[Line], hrefs: dict[int, str]) -> list[str]:
    """Each failure line learns the previous and next one; the hrefs of all of them, in order."""
    failures = [line for line in lines if line.failure]
    for before, after in zip(failures, failures[1:], strict=False):
        before.next_failure = hrefs[after.event.seq]
        after.previous_failure = hrefs[before.event.seq]
    return [hrefs[line.event.seq] for line in failures]


# --------------------------------------------------------------------------------------------
# Filters and search


@dataclass
class Filters:
    kind: str = ""
    verb: str = ""
    actor: str = ""
    step: str = ""
    failures: bool = False
    q: str = ""

    @classmethod
    def from_query(cls, params) -> Filters:
        return cls(
            kind=params.get("kind", "").strip()[:40],
            verb=params.get("verb", "").strip()[:80],
            actor=params.get("actor", "").strip()[:200],
            step=params.get("step", "").strip()[:100],
            failures=params.get("failures") in ("1", "on", "true"),
            q=params.get("q", "").strip()[:200],
        )

    @property
    def active(self) -> bool:
        return any((self.kind, self.verb, self.actor, self.step, self.failures, self.q))

    def keep(self, event: TimelineEvent) -> bool:
        if self.kind and event.verb.split(".", 1)[0] != self.kind:
            return False
        if self.verb and event.verb != self.verb:
            return False
        if self.actor and event.actor != self.actor:
            return False
        if self.step and step_of(event) != self.step:
            return False
        if self.failures and not is_failure(event):
            return False
        return not self.q or self.q.casefold() in _searchable(event)


def _searchable(event: TimelineEvent) -> str:
    return f"{event.verb} {event.actor} {shown(event.data, 100_000)}".casefold()


def choices(events: list[TimelineEvent]) -> dict[str, list[str]]:
    """The verbs, actors and steps of this run, for the filter's lists."""
    return {
        "verbs": sorted({e.verb for e in events}),
        "actors": sorted({e.actor for e in events}),
        "steps": sorted({step_of(e) for e in events} - {""}),
    }


# --------------------------------------------------------------------------------------------
# The summary: what went wrong, who decided what


@dataclass
class FailureGroup:
    step: str
    error: str
    tool: str
    count: int
    first: TimelineEvent
    last: TimelineEvent
    href: str = ""


def failure_groups(events: list[TimelineEvent], hrefs: dict[int, str]) -> list[FailureGroup]:
    """Failures grouped by step and error, in the order they first happened."""
    groups: dict[tuple, FailureGroup] = {}
    tools: dict[str, str] = {}
    for event in events:
        data = data_of(event)
        if isinstance(data.get("tool"), str) and step_of(event):
            tools[step_of(event)] = data["tool"]
        if not is_failure(event):
            continue
        key = (step_of(event), error_of(event))
        if key in groups:
            groups[key].count += 1
            groups[key].last = event
        else:
            tool = tools.get(key[0], "")
            groups[key] = FailureGroup(key[0], key[1], tool, 1, event, event)
            groups[key].href = hrefs.get(event.seq, "")
    return list(groups.values())


@dataclass
class DecisionLine:
    decision: HumanDecision
    sentence: str
    change: str
    href: str = ""


def decision_lines(run, events: list[TimelineEvent], hrefs: dict[int, str]) -> list:
    """The people's decisions on the run, oldest first, each with what it changed and a link
    to the event that records it (the decision's seal, or the person's event just before)."""
    decisions = HumanDecision.objects.filter(run=run).select_related("user", "step", "approval")
    sealed: dict[Any, int] = {}
    for event in events:
        data = data_of(event)
        if event.verb == Verb.RECORD_SEALED and data.get("model") == "approvals.humandecision":
            sealed[data.get("id")] = event.seq
    lines = []
    for decision in decisions.order_by("created_at", "id"):
        seq = sealed.get(decision.pk)
        lines.append(
            DecisionLine(
                decision,
                decision_sentence(decision),
                decision_change(decision),
                hrefs.get(seq, "") if seq else "",
            )
        )
    return lines


def decision_change(decision: HumanDecision) -> str:
    """What an edit changed ("amount 240 → 200"); empty when nothing did."""
    before, after = decision.before, decision.after
    if decision.verb == HumanDecision.Verb.REASSIGN:
        return ""
    if isinstance(after, dict) and isinstance(after.get("params"), dict) and "diff" in after:
        after = after["params"]
    if not isinstance(before, dict) or not isinstance(after, dict) or before == after:
        return ""
    if decision.verb not in (
        HumanDecision.Verb.APPROVE,
        HumanDecision.Verb.APPROVE_WITH_EDITS,
        HumanDecision.Verb.RETRY,
    ):
        return ""
    return params_change(before, after)


FIRST_OF_TWO = gettext_lazy("gave the first of two approvals")


def decision_sentence(decision: HumanDecision) -> str:
    """The rest of the sentence that starts with the person's name ("reassigned the run to
    queue ops"): the console's label, with where a reassignment went (isolated and escaped:
    queue and user names are data)."""
    after = decision.after if isinstance(decision.after, dict) else {}
    if decision.verb == HumanDecision.Verb.REASSIGN and isinstance(after.get("queue"), str):
        return console.sentence("timeline_reading.html#reassigned-to-queue", queue=after["queue"])
    if decision.verb == HumanDecision.Verb.REASSIGN and isinstance(after.get("owner"), str):
        return console.sentence("timeline_reading.html#reassigned-to-person", person=after["owner"])
    approval = decision.approval if decision.approval_id else None
    if approval is not None and approval.first_approved_by_id == decision.user_id:
        return str(FIRST_OF_TWO)
    return console.label(console.VERB_LABELS, decision.verb)

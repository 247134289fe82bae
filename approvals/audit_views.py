"""Audit pages for auditors and admins: a run's full timeline (with a lane chart of its steps
and the chain's verification), search across runs, and streaming exports.

Read-only: nothing here writes to the database. Support staff get a 403 (they have the run
detail page); users without a console role too.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django import forms
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404, render
from django.utils import formats, timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from approvals import console, viewer_time
from approvals import timeline_reading as reading
from approvals.audit_search import AuditQuery
from approvals.forms import DayField
from approvals.htmx import htmx_partial
from approvals.models import ApprovalRequest, HumanDecision
from approvals.permissions import AUDIT, require_role
from approvals.views import _querystring, keyset_page
from runs import audit
from runs import tools as tool_registry
from runs import workflows as workflow_registry
from runs.invisible import neutralise
from runs.models import Run, SideEffect, Snapshot, Step, TimelineEvent
from runs.verbs import Verb

logger = logging.getLogger("taskpilots.console")

EVENTS_PER_PAGE = 200
# Event kinds for the filter: the verb's prefix (before the first dot).
KIND_LABELS = {
    "run": gettext_lazy("Run"),
    "step": gettext_lazy("Step"),
    "side_effect": gettext_lazy("Side effect"),
    "snapshot": gettext_lazy("Snapshot"),
    "approval": gettext_lazy("Approval"),
    "wait": gettext_lazy("Wait"),
    "compensation": gettext_lazy("Compensation"),
}
# The outcomes the search filters on (runs/audit/); run states and decisions are labelled as
# everywhere else on the console.
OUTCOME_LABELS = {
    **{s: label for s, label in console.RUN_STATUS_LABELS.items() if s in Run.TERMINAL},
    "open": gettext_lazy("Not finished"),
    Run.Status.NEEDS_HUMAN: console.RUN_STATUS_LABELS[Run.Status.NEEDS_HUMAN],
    "unknown_outcome": gettext_lazy("Unknown outcome (side effect)"),
    **console.DECISION_LABELS,
    "human_decision": gettext_lazy("Any human decision"),
}


# Login required, then the auditor or admin role (support staff act; auditors audit).
audit_view = require_role(AUDIT)


def _kind_of(verb: str) -> str:
    return verb.split(".", 1)[0]


# --------------------------------------------------------------------------------------------
# The lane chart: one lane per step (and one for the run), bars for what it was doing.

CHART_WIDTH, LABEL_WIDTH, LANE_HEIGHT, AXIS_HEIGHT = 1000, 200, 24, 22
PLOT_LEFT, PLOT_RIGHT = LABEL_WIDTH + 8, 1000 - 12
# Markers of one kind closer than this (SVG units) would be drawn over each other: one is kept.
MARKER_GAP = 3

# A step's "to" status → the bar drawn until its next change (None: no bar).
STEP_STATE = {
    "running": "running",
    "waiting": "waiting",
    "retry_scheduled": "retry",
    "needs_human": "human",
    "unknown_outcome": "human",
    "pending": "queued",
}
RUN_STATE = {
    "running": "running",
    "pending": "queued",
    "waiting": "waiting",
    "needs_human": "human",
    "taken_over": "human",
    "compensating": "compensating",
}
FAILURE_VERBS = {
    "step.failed",
    Verb.STEP_RETRY_SCHEDULED,
    Verb.STEP_UNKNOWN_OUTCOME,
    Verb.SIDE_EFFECT_UNKNOWN,
    Verb.STEP_ESCALATED,
    Verb.SIDE_EFFECT_RECHECK_SCHEDULED,
    Verb.RUN_FAILED,
    Verb.STEP_WAITING_FOR_TOOL,
}
# A bar's state as its tooltip names it; the legend says a little more where a word is too few.
STATE_LABELS = {
    "running": gettext_lazy("running"),
    "queued": gettext_lazy("queued"),
    "waiting": gettext_lazy("waiting"),
    "retry": gettext_lazy("retry backoff"),
    "human": gettext_lazy("waiting for a person"),
    "compensating": gettext_lazy("undoing side effects"),
}
MARKER_LABELS = {
    "failure": gettext_lazy("failure"),
    "decision": gettext_lazy("human decision"),
    "commit": gettext_lazy("side effect committed"),
}


def marker_path(kind: str, x: float, y: float) -> str:
    """A marker's SVG path around (x, y): a diamond for a person's decision, a triangle for a
    failure, a small square for a commit."""
    if kind == "decision":
        return f"M{x},{y - 7} L{x + 6},{y} L{x},{y + 7} L{x - 6},{y} Z"
    if kind == "failure":
        return f"M{x},{y - 6} L{x + 6},{y + 5} L{x - 6},{y + 5} Z"
    return f"M{x - 3.5},{y - 3.5} h7 v7 h-7 Z"


LEGEND = {
    "states": [
        (state, gettext_lazy("waiting (event, timer, outage)") if state == "waiting" else text)
        for state, text in STATE_LABELS.items()
    ],
    "markers": [(kind, text, marker_path(kind, 0, 0)) for kind, text in MARKER_LABELS.items()],
}


@dataclass
class Bar:
    state: str
    start: datetime
    end: datetime
    x: float = 0
    width: float = 0
    label: str = ""


@dataclass
class Marker:
    kind: str  # "failure", "decision", "commit"
    at: datetime
    seq: int
    verb: str
    actor: str
    x: float = 0
    label: str = ""
    path: str = ""
    href: str = ""  # the page and anchor of its event's line
    hidden: int = 0  # markers of the same kind drawn at the same spot, left out


@dataclass
class Lane:
    key: tuple
    label: str
    is_run: bool = False
    bars: list[Bar] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)
    y: int = 0
    state: str | None = None
    since: datetime | None = None
    text_y: int = 0
    bar_y: int = 0
    mid_y: int = 0

    def change(self, state: str | None, at: datetime) -> None:
        if self.state is not None and self.since is not None:
            self.bars.append(Bar(self.state, self.since, at))
        self.state, self.since = state, at


def _duration(seconds: float) -> str:
    seconds = max(int(seconds), 0)
    if seconds < 60:
        return _("%(n)s s") % {"n": seconds}
    if seconds < 3600:
        return _("%(m)s min %(s)s s") % {"m": seconds // 60, "s": seconds % 60}
    if seconds < 86400:
        return _("%(h)s h %(m)s min") % {"h": seconds // 3600, "m": seconds % 3600 // 60}
    return _("%(d)s d %(h)s h") % {"d": seconds // 86400, "h": seconds % 86400 // 3600}


def build_lanes(run: Run, events: list[TimelineEvent], now: datetime) -> dict[str, Any]:
    """Lanes, bars, markers and axis ticks, already in SVG coordinates."""
    lanes = _Lanes()
    for event in events:
        lanes.follow(event)
    axis = _Axis.spanning(run, events, now)
    ordered = [lanes.run, *lanes.steps.values()]
    for index, lane in enumerate(ordered):
        lane.change(None, axis.end)
        _place(lane, index, axis)
    return {
        "lanes": ordered,
        "ticks": axis.ticks(),
        "width": CHART_WIDTH,
        "height": AXIS_HEIGHT + len(ordered) * LANE_HEIGHT + 6,
        "label_width": LABEL_WIDTH,
        "plot_left": PLOT_LEFT,
        "plot_right": PLOT_RIGHT,
        "lane_height": LANE_HEIGHT,
        "span": _duration(axis.span),
        "zone": viewer_time.zone_label(timezone.localtime(axis.start)),
        "start": axis.start,
        "end": axis.end,
        "legend": LEGEND,
    }


class _Lanes:
    """The run's lane and one lane per step iteration, moved along by the timeline's events."""

    def __init__(self) -> None:
        self.run = Lane(("run",), _("Run"), is_run=True)
        self.steps: dict[tuple, Lane] = {}
        self.latest_by_name: dict[str, Lane] = {}

    def follow(self, event: TimelineEvent) -> None:
        """The state the event moves a lane to, and the marker it leaves there."""
        data = event.data if isinstance(event.data, dict) else {}
        to = data.get("to")
        about_run = event.verb.startswith("run.")
        if about_run and isinstance(to, str):
            self.run.change(RUN_STATE.get(to), event.at)
        elif event.verb == Verb.RUN_CREATED:
            self.run.change("queued", event.at)
        lane = None if about_run else self.step_lane(data)
        if lane is not None:
            if event.verb in (Verb.STEP_STARTED, Verb.STEP_LEASE_RECLAIMED):
                lane.change("running", event.at)
            elif isinstance(to, str) and "from" in data and "key" not in data:
                lane.change(STEP_STATE.get(to), event.at)
        kind = _marker_kind(event, to)
        if kind:
            marker = Marker(kind, event.at, event.seq, event.verb, event.actor)
            (lane or self.run).markers.append(marker)

    def step_lane(self, data: dict) -> Lane | None:
        """The lane of the step the event names; without an iteration, its latest one."""
        name = data.get("step")
        if not isinstance(name, str):
            return None
        iteration = data.get("iteration")
        if not isinstance(iteration, int):
            return self.latest_by_name.get(name)
        key = (name, iteration)
        if key not in self.steps:
            self.steps[key] = Lane(key, name if iteration == 0 else f"{name} #{iteration}")
        self.latest_by_name[name] = self.steps[key]
        return self.steps[key]


def _marker_kind(event: TimelineEvent, to: Any) -> str:
    if event.actor.startswith("user:"):
        return "decision"
    if event.verb in FAILURE_VERBS or to in ("failed", "unknown_outcome"):
        return "failure"
    if event.verb == Verb.SIDE_EFFECT_COMMITTED:
        return "commit"
    return ""


@dataclass
class _Axis:
    """Time along the plot: from the run's start to its end (or now, while it is open)."""

    start: datetime
    end: datetime
    span: float

    @classmethod
    def spanning(cls, run: Run, events: list[TimelineEvent], now: datetime) -> _Axis:
        start = run.created_at
        end = run.finished_at or (events[-1].at if run.is_terminal and events else now)
        if events:
            start = min(start, events[0].at)
            end = max(end, events[-1].at)
        return cls(start, end, max((end - start).total_seconds(), 1.0))

    def x(self, at: datetime) -> float:
        offset = (at - self.start).total_seconds() / self.span
        return round(PLOT_LEFT + offset * (PLOT_RIGHT - PLOT_LEFT), 1)

    def ticks(self) -> list[dict]:
        """Five times along the axis, the first at the start and the last at the end."""
        fmt = "H:i:s" if self.span < 86400 else "M j H:i"
        moments = [self.start + timedelta(seconds=self.span * i / 4) for i in range(5)]
        return [
            {"x": self.x(at), "label": formats.date_format(timezone.localtime(at), fmt)}
            for at in moments
        ]


def _place(lane: Lane, index: int, axis: _Axis) -> None:
    """The lane's row, its bars and markers in SVG coordinates, with their tooltips."""
    lane.y = AXIS_HEIGHT + index * LANE_HEIGHT
    lane.text_y, lane.bar_y, lane.mid_y = lane.y + 16, lane.y + 6, lane.y + 12
    for bar in lane.bars:
        bar.x = axis.x(bar.start)
        bar.width = max(round(axis.x(bar.end) - bar.x, 1), 2.0)
        state = STATE_LABELS.get(bar.state, bar.state)
        bar.label = f"{lane.label}: {state} · " + _duration((bar.end - bar.start).total_seconds())
    kept: list[Marker] = []
    for marker in lane.markers:
        marker.x = axis.x(marker.at)
        marker.label = f"#{marker.seq} {marker.verb} · {marker.actor}"
        marker.path = marker_path(marker.kind, marker.x, lane.mid_y)
        same_spot = [m for m in kept[-3:] if m.kind == marker.kind and marker.x - m.x < MARKER_GAP]
        if same_spot:  # drawn over it: one marker (linking to the first) says how many
            same_spot[0].hidden += 1
        else:
            kept.append(marker)
    for marker in kept:
        if marker.hidden:
            marker.label += " " + ngettext(
                "(and %(n)s more here)", "(and %(n)s more here)", marker.hidden
            ) % {"n": marker.hidden}
    lane.markers = kept


# --------------------------------------------------------------------------------------------
# Evidence: a snapshot beside its receipt and the decision that followed.


@dataclass
class Evidence:
    snapshot: Snapshot | None = None
    effect: SideEffect | None = None
    approval: ApprovalRequest | None = None
    decisions: list[HumanDecision] = field(default_factory=list)


def _evidence(run: Run, events: list[TimelineEvent]) -> dict[int, Evidence]:
    """Per event seq (snapshot.written, approval.requested): what was about to happen, what
    happened, and who decided what about it. A fixed number of queries for the whole page."""
    snapshots = {s.pk: s for s in Snapshot.objects.filter(run=run)}
    effects = {e.idempotency_key: e for e in SideEffect.objects.filter(run=run)}
    decisions = list(HumanDecision.objects.filter(run=run).select_related("user", "step"))
    steps = {(s.name, s.iteration): s for s in Step.objects.filter(run=run)}
    approvals: dict[int, list[ApprovalRequest]] = {}
    for approval in ApprovalRequest.objects.filter(run=run).select_related(
        "decided_by", "first_approved_by"
    ):
        approvals.setdefault(approval.step_id, []).append(approval)
    found: dict[int, Evidence] = {}
    for event in events:
        data = event.data if isinstance(event.data, dict) else {}
        if event.verb == Verb.SNAPSHOT_WRITTEN and isinstance(data.get("snapshot"), int):
            snapshot = snapshots.get(data["snapshot"])
            effect = effects.get(str(data.get("key", "")))
            followed = [d for d in decisions if snapshot and d.snapshot_id == snapshot.pk]
            found[event.seq] = Evidence(snapshot, effect, None, followed)
        elif event.verb == Verb.APPROVAL_REQUESTED:
            step = steps.get((data.get("step"), data.get("iteration")))
            requests = approvals.get(step.pk, []) if step else []
            approval = requests[0] if requests else None
            if len(requests) > 1:  # the step asked again: the request made nearest this event
                approval = min(requests, key=lambda a: abs((a.created_at - event.at).timestamp()))
            followed = [d for d in decisions if approval and d.approval_id == approval.pk]
            found[event.seq] = Evidence(None, None, approval, followed)
    return found


# --------------------------------------------------------------------------------------------
# Timeline page


def _get_run(run_id) -> Run:
    return get_object_or_404(Run.objects.select_related("owner"), pk=run_id)


def _kind_chips(counts: dict[str, int]) -> list[dict]:
    """The filter's chips: the known kinds in KIND_LABELS order, then any other."""
    order = {kind: index for index, kind in enumerate(KIND_LABELS)}
    ordered = sorted(counts.items(), key=lambda item: order.get(item[0], 99))
    return [{"kind": k, "label": str(KIND_LABELS.get(k, k)), "count": n} for k, n in ordered]


@require_GET
@never_cache
@audit_view
def run_timeline(request: HttpRequest, run_id) -> HttpResponse:
    """The run's story for reading: the summary (failures by step and error, the people's
    decisions), the lane chart whose markers link to their events, and one line per event with
    repeated attempts collapsed, filtered and searched on the server. A fixed number of
    queries whatever the run's length."""
    run = _get_run(run_id)
    all_events = list(TimelineEvent.objects.filter(run=run).order_by("seq"))
    filters = reading.Filters.from_query(request.GET)
    all_lines = reading.collapse(all_events)
    everywhere = reading.page_hrefs(all_lines)
    shown_events = [e for e in all_events if filters.keep(e)] if filters.active else all_events
    lines = reading.collapse(shown_events) if filters.active else all_lines
    query = _querystring(request)
    page = Paginator(lines, reading.LINES_PER_PAGE).get_page(request.GET.get("page"))
    here = _with_query({0: f"?page={page.number}#"}, query)[0]
    hrefs = _on_this_page(_with_query(reading.page_hrefs(lines), query), here)
    if not filters.active:
        everywhere = _on_this_page(everywhere, here)
    hrefs = {**everywhere, **hrefs}
    failure_hrefs = reading.link_failures(lines, hrefs)
    chart = build_lanes(run, all_events, timezone.now())
    for lane in chart["lanes"]:
        for marker in lane.markers:
            marker.href = hrefs.get(marker.seq, "")
    report = audit.verify_run(run)
    context = {
        "run": run,
        "lines": page.object_list,
        "page": page,
        "kinds": _kind_chips(_count_kinds(all_events)),
        "kind": filters.kind,
        "filters": filters,
        "choices": reading.choices(all_events),
        "total": len(all_events),
        "shown": len(shown_events),
        "report": report,
        "problem": report.problems[0] if report.problems else None,
        "chart": chart,
        "urls": reading.part_urls(run),
        "failures": reading.failure_groups(all_events, everywhere),
        "failure_count": sum(1 for e in all_events if reading.is_failure(e)),
        "first_failure": failure_hrefs[0] if failure_hrefs else "",
        "decisions": reading.decision_lines(run, all_events, everywhere),
        "query": query,
    }
    template = htmx_partial(request, "console/timeline.html", "timeline-events")
    return render(request, template, context)


def _count_kinds(events: list[TimelineEvent]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for event in events:
        kind = _kind_of(event.verb)
        counts[kind] = counts.get(kind, 0) + 1
    return counts


def _on_this_page(hrefs: dict[int, str], here: str) -> dict[int, str]:
    """Links to lines of the page being shown are anchors alone: a jump, not a reload."""
    return {seq: href.removeprefix(here[:-1]) for seq, href in hrefs.items()}


def _with_query(hrefs: dict[int, str], query: str) -> dict[int, str]:
    """ "?page=N#anchor" with the page's filters kept."""
    if not query:
        return hrefs
    return {seq: href.replace("?", f"?{query}&", 1) for seq, href in hrefs.items()}


@require_GET
@never_cache
@audit_view
def run_timeline_event(request: HttpRequest, run_id, seq: int) -> HttpResponse:
    """One event's payload and its evidence (the snapshot, the receipt, the decision that
    followed), fetched when its line is opened; without JavaScript, a page of its own."""
    run = _get_run(run_id)
    event = get_object_or_404(TimelineEvent, run=run, seq=seq)
    context = {"run": run, "event": event, "ev": _evidence(run, [event]).get(event.seq)}
    template = htmx_partial(request, "console/timeline_event.html", always="event-payload")
    return render(request, template, context)


@require_GET
@never_cache
@audit_view
def run_timeline_range(request: HttpRequest, run_id) -> HttpResponse:
    """The events of a collapsed line (?from=&to=), one line each."""
    run = _get_run(run_id)
    try:
        first, last = int(request.GET.get("from", "")), int(request.GET.get("to", ""))
    except ValueError:
        raise Http404("no such events") from None
    events = TimelineEvent.objects.filter(run=run, seq__gte=first, seq__lte=min(last, first + 2000))
    lines = [reading.Line(e, failure=reading.is_failure(e)) for e in events.order_by("seq")]
    context = {"run": run, "lines": lines, "nested": True, "urls": reading.part_urls(run)}
    template = htmx_partial(request, "console/timeline_event.html", always="event-lines")
    return render(request, template, context)


# --------------------------------------------------------------------------------------------
# Search across runs


class AuditSearchForm(forms.Form):
    date_from = DayField(
        label=gettext_lazy("Started from"),
        required=False,
        widget=forms.DateInput(attrs={"type": "date"}),
    )
    date_to = DayField(
        label=gettext_lazy("Started until"),
        required=False,
        widget=forms.DateInput(attrs={"type": "date"}),
    )
    business_key = forms.CharField(
        label=gettext_lazy("Business key"), required=False, max_length=200, strip=True
    )
    workflow = forms.ChoiceField(label=gettext_lazy("Workflow"), required=False)
    tool = forms.ChoiceField(label=gettext_lazy("Tool"), required=False)
    target = forms.CharField(
        label=gettext_lazy("Target resource"), required=False, max_length=500, strip=True
    )
    actor = forms.CharField(
        label=gettext_lazy("Actor (user name or api:client)"),
        required=False,
        max_length=200,
        strip=True,
    )
    outcome = forms.ChoiceField(
        label=gettext_lazy("Outcome"),
        required=False,
        choices=[("", gettext_lazy("Any outcome")), *OUTCOME_LABELS.items()],
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        workflows = sorted({w.name for w in workflow_registry.all_workflows()})
        tools = sorted(tool_registry.all_tools())
        # Names from agents' workflows and tools are shown with their invisible characters.
        self.fields["workflow"].choices = [("", _("All workflows"))] + [
            (w, neutralise(w)) for w in workflows
        ]
        self.fields["tool"].choices = [("", _("All tools"))] + [(t, neutralise(t)) for t in tools]

    def clean(self):
        data = super().clean()
        if data.get("date_from") and data.get("date_to") and data["date_from"] > data["date_to"]:
            raise forms.ValidationError(_("The start date is after the end date."))
        return data

    def query(self) -> audit.AuditQuery | None:
        if not self.is_valid():
            return None
        return AuditQuery(**{k: v or "" for k, v in self.cleaned_data.items()})


@require_GET
@never_cache
@audit_view
def audit_search(request: HttpRequest) -> HttpResponse:
    form = AuditSearchForm(request.GET or None)
    query = form.query() if request.GET else AuditQuery()
    runs = query.runs() if query is not None else Run.objects.none()
    page, status = keyset_page(request, runs)
    context = {
        "form": form,
        "page": page,
        "query": _querystring(request),
        "searched": bool(request.GET),
    }
    template = htmx_partial(request, "console/audit.html", "audit-results")
    return render(request, template, context, status=status)


# --------------------------------------------------------------------------------------------
# Exports (streamed)

CONTENT_TYPES = {"jsonl": "application/x-ndjson; charset=utf-8", "csv": "text/csv; charset=utf-8"}


def _stream(runs, fmt: str, filename: str, exported_by: str, query: dict) -> HttpResponse:
    if fmt == "jsonl":
        lines = audit.export_jsonl(runs, exported_by=exported_by, query=query)
    else:
        lines = audit.export_csv(runs)
    response = StreamingHttpResponse(lines, content_type=CONTENT_TYPES[fmt])
    response["Content-Disposition"] = f'attachment; filename="{filename}.{fmt}"'
    response["X-Content-Type-Options"] = "nosniff"
    return response


@require_GET
@audit_view
def run_export(request: HttpRequest, run_id, fmt: str) -> HttpResponse:
    if fmt not in CONTENT_TYPES:
        raise Http404("unknown format")
    run = _get_run(run_id)
    user = request.user.get_username()
    logger.info("audit export of run %s as %s by %s", run.pk, fmt, user)
    runs = Run.objects.filter(pk=run.pk)
    return _stream(runs, fmt, f"taskpilots-run-{run.pk}", f"user:{user}", {"run": str(run.pk)})


@require_GET
@audit_view
def search_export(request: HttpRequest, fmt: str) -> HttpResponse:
    if fmt not in CONTENT_TYPES:
        raise Http404("unknown format")
    form = AuditSearchForm(request.GET or None)
    query = form.query() if request.GET else AuditQuery()
    if query is None:
        return render(request, "console/audit.html", {"form": form, "searched": True}, status=422)
    user = request.user.get_username()
    logger.info("audit export %s as %s by %s", query.as_dict(), fmt, user)
    stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
    return _stream(query.runs(), fmt, f"taskpilots-audit-{stamp}", f"user:{user}", query.as_dict())

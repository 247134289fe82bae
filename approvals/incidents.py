"""The inbox's sense of an incident: runs waiting for a person grouped by what stopped them
(failure class + tool), with what the system knows of that tool's health now.

Nothing here changes state. `incident_groups` is one grouped query over the parked steps
(served by approvals/migrations/0023's partial index) and `tool_health` a fixed number of
queries over the tools' recovery waits and pauses, whatever the number of runs or groups.
`check_tool` asks the tool itself (a lookup by a key nobody used), for the bulk preview.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from urllib.parse import urlencode

from django.db.models import Count, Max, Min, Q
from django.utils.translation import gettext as _

from approvals import console
from approvals.models import ToolPause
from runs import tools as tool_registry
from runs.models import Run, Step, Wait
from runs.tools import CallContext, ToolError

# A cause shared by fewer runs than this is not an incident: the rows speak for themselves.
MIN_RUNS = 2
MAX_GROUPS = 5
# Causes a tool's health explains (and a retry may cure once it answers again).
HEALTH_REASONS = ("outage", "transient")
# The key a health check looks up: no call is ever made with it, so the answer is "not found".
PROBE_KEY = "taskpilots-health-check"


class Health:
    DOWN = "down"  # runs are still probing it and their probes fail
    PAUSED = "paused"  # an admin (or the engine, for a drifted API) paused it
    UP = "up"  # it answered after the runs' failures
    UNKNOWN = "unknown"  # nothing has called it since


@dataclass
class ToolHealth:
    tool: str
    state: str
    since: datetime | None = None  # down since (its oldest open recovery wait) or paused since
    answered_at: datetime | None = None  # last probe that found it answering
    detail: str = ""  # what a live check said

    @property
    def down(self) -> bool:
        return self.state in (Health.DOWN, Health.PAUSED)


@dataclass
class IncidentGroup:
    reason: str
    tool: str
    runs: int
    since: datetime | None
    last_failure: datetime | None
    health: ToolHealth | None

    @property
    def label(self) -> str:
        return console.label(console.REASON_LABELS, self.reason)

    @property
    def recovered(self) -> bool:
        h = self.health
        return bool(
            h
            and h.state == Health.UP
            and (not self.last_failure or h.answered_at > self.last_failure)
        )

    def bulk_query(self) -> str:
        """The bulk form's filters for exactly this group's runs (and the action it suggests)."""
        query = {"status": "inbox", "reason": self.reason}
        if self.tool:
            query["tool"] = self.tool
        if self.reason in HEALTH_REASONS:
            query["action"] = "retry"
        return urlencode(query)

    def inbox_query(self) -> str:
        return urlencode({"reason": self.reason})


def incident_groups() -> list[IncidentGroup]:
    """The biggest causes among runs waiting for a person (approvals excepted): one grouped
    query for the groups, then the health of their tools."""
    rows = list(
        Step.objects.filter(status__in=console.PARKED_STATUSES, run__status__in=Run.HUMAN)
        .exclude(error_class="")
        .exclude(console.awaits_approval())
        .values("error_class", "tool")
        .annotate(
            runs=Count("run_id", distinct=True),
            since=Min("started_at"),
            last_failure=Max("started_at"),
        )
        .filter(runs__gte=MIN_RUNS)
        .order_by("-runs", "error_class", "tool")[:MAX_GROUPS]
    )
    health = tool_health([r["tool"] for r in rows if r["tool"]])
    return [
        IncidentGroup(
            reason=r["error_class"],
            tool=r["tool"],
            runs=r["runs"],
            since=r["since"],
            last_failure=r["last_failure"],
            health=health.get(r["tool"]),
        )
        for r in rows
    ]


def tool_health(tools: list[str]) -> dict[str, ToolHealth]:
    """What the system has recorded of each tool now (two queries for any number of tools):
    paused; down while runs still probe it under an open recovery wait; up when a probe found
    it answering; otherwise unknown."""
    tools = sorted(set(tools))
    if not tools:
        return {}
    waits = {
        row["event_type"]: row
        for row in Wait.objects.filter(kind=Wait.Kind.TOOL_RECOVERY, event_type__in=tools)
        .values("event_type")
        .annotate(
            open=Count("id", filter=Q(status=Wait.Status.PENDING)),
            since=Min("created_at", filter=Q(status=Wait.Status.PENDING)),
            answered=Max("resolved_at", filter=Q(resolved_by="probe")),
        )
    }
    paused = {p.tool: p for p in ToolPause.objects.filter(tool__in=tools, resumed_at__isnull=True)}
    found = {}
    for tool in tools:
        row = waits.get(tool, {})
        answered = row.get("answered")
        if tool in paused:
            found[tool] = ToolHealth(tool, Health.PAUSED, paused[tool].paused_at, answered)
        elif row.get("open"):
            found[tool] = ToolHealth(tool, Health.DOWN, row["since"], answered)
        elif answered:
            found[tool] = ToolHealth(tool, Health.UP, None, answered)
        else:
            found[tool] = ToolHealth(tool, Health.UNKNOWN)
    return found


def check_tool(tool_name: str, recorded: ToolHealth | None = None) -> ToolHealth:
    """Ask the tool now, where it can be asked (a lookup by a key no call used): an answer
    means it is up, an outage or a refused connection that it is down. A tool that cannot be
    asked keeps what the system recorded."""
    recorded = recorded or tool_health([tool_name]).get(tool_name) or ToolHealth(tool_name, "")
    if recorded.state == Health.PAUSED:
        return recorded
    try:
        tool = tool_registry.get(tool_name)
    except tool_registry.UnknownTool:
        return recorded
    if tool.lookup is None:
        return recorded
    try:
        tool.lookup(PROBE_KEY, CallContext(PROBE_KEY, "", "health-check", 0, 5.0))
    except ToolError as exc:
        return ToolHealth(
            tool_name, Health.DOWN, recorded.since, recorded.answered_at, exc.message[:300]
        )
    except Exception as exc:  # an adapter's own bug is not the tool being up
        return ToolHealth(tool_name, Health.UNKNOWN, detail=f"{type(exc).__name__}: {exc}"[:300])
    return ToolHealth(tool_name, Health.UP, None, recorded.answered_at, _("It answered just now."))

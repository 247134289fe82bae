"""SQL plumbing shared by the metrics queries: table names, day edges, and the settings the
big aggregate queries run with."""

from __future__ import annotations

from contextlib import contextmanager

from django.db import connection, transaction

from approvals.models import (
    VALUE_FIELDS,
    ApprovalRequest,
    HumanDecision,
    MetricsCounter,
    MetricsCounterMark,
    MetricsDay,
    MetricsHour,
    RunMetrics,
    Takeover,
)
from runs.models import Run, SideEffect, Snapshot, Step, TimelineEvent, Wait

T = {
    "run": Run._meta.db_table,
    "step": Step._meta.db_table,
    "event": TimelineEvent._meta.db_table,
    "effect": SideEffect._meta.db_table,
    "snapshot": Snapshot._meta.db_table,
    "wait": Wait._meta.db_table,
    "approval": ApprovalRequest._meta.db_table,
    "takeover": Takeover._meta.db_table,
    "decision": HumanDecision._meta.db_table,
    "metrics": RunMetrics._meta.db_table,
    "day": MetricsDay._meta.db_table,
    "hour": MetricsHour._meta.db_table,
    "counter": MetricsCounter._meta.db_table,
    "mark": MetricsCounterMark._meta.db_table,
}
# The start and end of the day `u.day` (a date in %(tz)s).
DAY_START = "(u.day::timestamp AT TIME ZONE %(tz)s)"
DAY_END = "((u.day + 1)::timestamp AT TIME ZONE %(tz)s)"


def durations_of(row: str) -> str:
    """A LATERAL subquery of (kind, x): every duration of the run row `row`, with its kind (the
    index of its column in VALUE_FIELDS)."""
    parts = " UNION ALL ".join(
        f"SELECT {kind} AS kind, x FROM unnest({row}.{column}) AS x"
        for kind, column in enumerate(VALUE_FIELDS)
    )
    return f"LATERAL ({parts})"


@contextmanager
def no_jit():
    """Settings for these aggregate queries only, in one transaction (so SET LOCAL ends with it):
    PostgreSQL JIT-compiles plans this size (cost > jit_above_cost) and spends ~1 s per query
    doing it, to save milliseconds; and the medians sort a month's durations (~200k values),
    which spills to disk at the default 4 MB of work_mem."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL jit = off; SET LOCAL work_mem = '64MB'")
        yield

"""Keyset pagination for the console's lists of runs (all runs, audit search): newest first by
(created_at, id), as the API pages its runs, with the API's cursors.

A page is found from a neighbour's edge (`after`: older than the last run shown, `before`: newer
than the first), never by OFFSET, so the last page costs what the first does: "Last" reads the
oldest runs in reverse order. Nothing counts the matches exactly either (a COUNT reads every
match): a page says how many there are when they all fit on it, and PostgreSQL's estimate
otherwise (`estimate_count`, planning only).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from django.db import connection
from django.db.models import QuerySet

from runs.api.schema import decode_cursor, encode_cursor, newer_than, older_than

PAGE_SIZE = 25
# The query parameters a page link sets; every other parameter (the filters) is kept.
PAGE_PARAMS = ("after", "before", "last", "page")


class BadCursor(ValueError):
    """A page link that is not one the console gave out (edited or cut short)."""


@dataclass(frozen=True)
class Position:
    created_at: datetime
    id: UUID

    @classmethod
    def of(cls, run) -> Position:
        return cls(run.created_at, run.pk)

    @classmethod
    def parse(cls, cursor: str) -> Position:
        decoded = decode_cursor(cursor)
        if decoded is None:
            raise BadCursor(cursor)
        return cls(*decoded)

    def __str__(self) -> str:
        return encode_cursor(self.created_at, self.id)


@dataclass
class KeysetPage:
    """The runs of one page, newest first, and where its neighbours start."""

    object_list: list
    is_first: bool
    is_last: bool
    # How many runs match: exact when they all fit on this page, else PostgreSQL's estimate.
    count: int = 0
    exact: bool = True

    @property
    def newer(self) -> str:
        """The `before` cursor of the previous page."""
        return str(Position.of(self.object_list[0])) if self.object_list else ""

    @property
    def older(self) -> str:
        """The `after` cursor of the next page."""
        return str(Position.of(self.object_list[-1])) if self.object_list else ""

    @property
    def has_other_pages(self) -> bool:
        return not (self.is_first and self.is_last)


def _older_than(runs: QuerySet, at: Position) -> QuerySet:
    return older_than(runs, at.created_at, at.id)


def _newer_than(runs: QuerySet, at: Position) -> QuerySet:
    return newer_than(runs, at.created_at, at.id)


NEWEST, OLDEST = ("-created_at", "-id"), ("created_at", "id")


def _rows(runs: QuerySet, order: tuple[str, str], size: int) -> list:
    """One more than a page, to know whether there is another."""
    return list(runs.order_by(*order)[: size + 1])


def newest_first(runs: QuerySet, params, size: int = PAGE_SIZE) -> KeysetPage:
    """The page of `runs` that `params` (the request's GET) asks for: the first (newest) page,
    `after=<cursor>`, `before=<cursor>` or `last=1`. One query, plus one EXPLAIN when the runs
    do not all fit on the page. Raises BadCursor for a cursor the console did not give out."""
    if params.get("after") is not None:
        rows = _rows(_older_than(runs, Position.parse(params["after"])), NEWEST, size)
        page = KeysetPage(rows[:size], is_first=False, is_last=len(rows) <= size)
    elif params.get("before") is not None:
        rows = _rows(_newer_than(runs, Position.parse(params["before"])), OLDEST, size)
        page = KeysetPage(rows[:size][::-1], is_first=len(rows) <= size, is_last=False)
    elif params.get("last"):
        rows = _rows(runs, OLDEST, size)
        page = KeysetPage(rows[:size][::-1], is_first=len(rows) <= size, is_last=True)
    else:
        rows = _rows(runs, NEWEST, size)
        page = KeysetPage(rows[:size], is_first=True, is_last=len(rows) <= size)
    if page.has_other_pages:
        page.count, page.exact = max(estimate_count(runs), len(rows)), False
    else:
        page.count = len(page.object_list)
    return page


def estimate_count(queryset: QuerySet) -> int:
    """PostgreSQL's estimate of how many rows `queryset` returns: the planner's, from the
    table statistics (EXPLAIN, nothing is read)."""
    sql, params = queryset.order_by().values("pk").query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        (plan,) = cursor.fetchone()
    plan = json.loads(plan) if isinstance(plan, str) else plan
    return int(plan[0]["Plan"]["Plan Rows"])


def about(count: int) -> int:
    """An estimate rounded to two significant digits (12,345 → 12,000): no more precise than
    it is."""
    if count < 100:
        return count
    scale = 10 ** (len(str(count)) - 2)
    return round(count / scale) * scale

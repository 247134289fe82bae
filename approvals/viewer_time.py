"""Times as the person reading them expects: one format, in their time zone, with the zone.

The zone is the browser's. The login form sends it (static/js/console.js fills a hidden field);
a session without it (or whose browser moved to another zone) gets it posted once from the next
page. It is kept in the session, validated against the IANA names Python knows; without it the
console shows UTC (settings.TIME_ZONE). `ViewerTimezoneMiddleware` activates it for each request,
so Django's `localtime()`, the `|when` filter and `__date` lookups all use the same zone.

Every timestamp on the console and audit pages goes through `|when` (approvals/templatetags/
console.py), which calls `timestamp_html()`; Python-built sentences call `format_timestamp()`.
"""

from __future__ import annotations

import zoneinfo
from datetime import UTC, date, datetime, time, timedelta
from functools import cache

from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

SESSION_ZONE = "viewer_time_zone"
# What the browser last said, valid or not, so the page does not post it again.
SESSION_REPORTED = "viewer_time_zone_reported"
MAX_ZONE_NAME = 64


@cache
def _known_zones() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones())


def zone_named(name: str) -> zoneinfo.ZoneInfo | None:
    if not name or name not in _known_zones():
        return None
    return zoneinfo.ZoneInfo(name)


def remember(request: HttpRequest, name: str) -> bool:
    """Keep the browser's zone in the session; False (and UTC kept) when Python does not know it."""
    name = (name or "").strip()[:MAX_ZONE_NAME]
    request.session[SESSION_REPORTED] = name
    if zone_named(name) is None:
        request.session.pop(SESSION_ZONE, None)
        return False
    request.session[SESSION_ZONE] = name
    return True


class ViewerTimezoneMiddleware:
    """Activate the viewer's zone (after SessionMiddleware; reading the session costs no query
    beyond the one authentication makes anyway)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest):
        zone = zone_named(request.session.get(SESSION_ZONE, ""))
        if zone is not None:
            timezone.activate(zone)
        else:
            timezone.deactivate()
        try:
            return self.get_response(request)
        finally:
            timezone.deactivate()


def zone_label(local: datetime) -> str:
    """`UTC`, `UTC+8`, `UTC+5:30`, `UTC-3`: an offset says exactly which time it is, where
    abbreviations are ambiguous (CST is China, Cuba and the US Central zone)."""
    offset = local.utcoffset()
    if not offset:
        return "UTC"
    minutes = int(offset.total_seconds()) // 60
    sign = "+" if minutes > 0 else "-"
    hours, rest = divmod(abs(minutes), 60)
    return f"UTC{sign}{hours}" + (f":{rest:02d}" if rest else "")


def viewer_zone() -> str:
    """The active zone's name and current offset, for the top bar: `Asia/Shanghai (UTC+8)`."""
    name = timezone.get_current_timezone_name()
    label = zone_label(timezone.localtime())
    return name if name == label else f"{name} ({label})"


def start_of_day(day: date) -> datetime:
    """Midnight of `day` in the viewer's zone: where date filters (all runs, audit) start."""
    return datetime.combine(day, time.min, tzinfo=timezone.get_current_timezone())


def format_timestamp(value: datetime) -> str:
    """`2026-10-14 17:11:05 UTC+2`: the same in every language and on every page."""
    local = timezone.localtime(value)
    return f"{local:%Y-%m-%d %H:%M:%S} {zone_label(local)}"


def timestamp_html(value: datetime) -> SafeString:
    """`format_timestamp()` in a <time> element carrying the exact UTC instant."""
    instant = value.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    return format_html(
        '<time datetime="{}" title="{}">{}</time>',
        instant,
        timezone.get_current_timezone_name(),
        format_timestamp(value),
    )


# --------------------------------------------------------------------------------------------
# Day filters: "started from" / "started until" (the all-runs list, audit search and exports,
# bulk actions in the console and the API), one helper for all of them.


class DayOutOfRange(ValueError):
    """A day whose start or end is not an instant Python can hold: the first or last days of the
    calendar (9999-12-31 ends in the year 10000; 0001-01-01 starts before year 1 in UTC when
    the viewer's zone is ahead of it)."""

    def __init__(self, day: date):
        super().__init__(f"{day.isoformat()} is outside the dates runs can be searched by")
        self.day = day


def day_bounds(day: date) -> tuple[datetime, datetime]:
    """The instants [start, end) of `day` in the viewer's zone, in UTC, or DayOutOfRange."""
    try:
        start = start_of_day(day).astimezone(UTC)
        end = start_of_day(day + timedelta(days=1)).astimezone(UTC)
    except OverflowError:  # date + 1 day past 9999-12-31, or an instant before year 1 in UTC
        raise DayOutOfRange(day) from None
    return start, end


def check_day(day: date) -> date:
    """`day` if a filter can use it as either end of a range; DayOutOfRange otherwise."""
    day_bounds(day)
    return day


def parse_day(text: str) -> date:
    """`YYYY-MM-DD` (ValueError otherwise), usable as either end of a day filter."""
    return check_day(date.fromisoformat(text))


def day_range(date_from: date | None, date_to: date | None) -> tuple:
    """(from the start of `date_from`, to the end of `date_to`): days in the viewer's zone, both
    inclusive, as an inclusive start and an exclusive end (None: open)."""
    return (
        day_bounds(date_from)[0] if date_from else None,
        day_bounds(date_to)[1] if date_to else None,
    )


def filter_days(queryset, date_from: date | None, date_to: date | None, field: str = "created_at"):
    """`queryset` with `field` on or after the start of `date_from` and before the end of
    `date_to` (both inclusive, days in the viewer's zone; None: open). As ranges of the column,
    so an index on it serves them, not a cast to a date. DayOutOfRange for a day at the edge of
    the calendar: the form fields refuse those first (approvals/forms.py DayField)."""
    if date_from:
        queryset = queryset.filter(**{f"{field}__gte": day_bounds(date_from)[0]})
    if date_to:
        queryset = queryset.filter(**{f"{field}__lt": day_bounds(date_to)[1]})
    return queryset


# A day as the API states it (JSON schema pattern): a valid calendar date, YYYY-MM-DD, from
# 0001-01-01 to 9999-12-30 (the API's days are UTC days, so each of these has an end; 9999-12-31
# has none). An empty string means no filter. No lookarounds: schema tools generate from it.
_MONTH_DAY = (
    "(0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])"
    "|(0[469]|11)-(0[1-9]|[12][0-9]|30)"
    "|02-(0[1-9]|1[0-9]|2[0-8])"
)
_MONTH_DAY_9999 = (  # not a leap year, and without its last day
    "(0[13578]|10)-(0[1-9]|[12][0-9]|3[01])"
    "|(0[469]|1[12])-(0[1-9]|[12][0-9]|30)"
    "|02-(0[1-9]|1[0-9]|2[0-8])"
)
_YEAR_BEFORE_9999 = (
    "000[1-9]|00[1-9][0-9]|0[1-9][0-9]{2}|[1-8][0-9]{3}|9[0-8][0-9]{2}|99[0-8][0-9]|999[0-8]"
)
_LEAP_YEAR = "[0-9]{2}(0[48]|[2468][048]|[13579][26])|(0[48]|[2468][048]|[13579][26])00"
DAY_PATTERN = (
    f"^(({_YEAR_BEFORE_9999})-({_MONTH_DAY})|9999-({_MONTH_DAY_9999})|({_LEAP_YEAR})-02-29)?$"
)

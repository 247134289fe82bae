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
from datetime import UTC, date, datetime, time
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

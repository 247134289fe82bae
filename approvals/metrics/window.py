"""The window a dashboard describes: the cohort of runs started in [start, end)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from approvals import viewer_time

WINDOWS = {"24h": timedelta(hours=24), "7d": timedelta(days=7), "30d": timedelta(days=30)}
DEFAULT_WINDOW = "7d"
MAX_CUSTOM_DAYS = 366


class BadWindow(ValueError):
    pass


@dataclass(frozen=True)
class Window:
    key: str
    start: datetime
    end: datetime

    @property
    def bucket(self) -> str:
        return "hour" if self.end - self.start <= timedelta(hours=48) else "day"

    def buckets(self) -> list[datetime]:
        """Every bucket's start (naive, in the current time zone), oldest first."""
        tz = timezone.get_current_timezone()
        step = timedelta(hours=1) if self.bucket == "hour" else timedelta(days=1)
        first = timezone.localtime(self.start, tz).replace(minute=0, second=0, microsecond=0)
        if self.bucket == "day":
            first = first.replace(hour=0)
        last = timezone.localtime(self.end - timedelta(microseconds=1), tz)
        out, at = [], first.replace(tzinfo=None)
        while at <= last.replace(tzinfo=None):
            out.append(at)
            at += step
        return out


def parse_window(params, *, now: datetime | None = None) -> Window:
    """`window=24h|7d|30d`, or `window=custom&start=YYYY-MM-DD&end=YYYY-MM-DD` (end inclusive)."""
    now = now or timezone.now()
    key = params.get("window") or DEFAULT_WINDOW
    if key in WINDOWS:
        return Window(key, now - WINDOWS[key], now)
    if key != "custom":
        raise BadWindow(_("Choose a window of 24h, 7d, 30d or custom."))
    try:
        start_day = datetime.strptime(params.get("start", ""), "%Y-%m-%d")
        end_day = datetime.strptime(params.get("end", ""), "%Y-%m-%d")
    except ValueError:
        raise BadWindow(_("A custom window needs a start and an end date (YYYY-MM-DD).")) from None
    if end_day < start_day:
        raise BadWindow(_("The end date is before the start date."))
    if (end_day - start_day).days > MAX_CUSTOM_DAYS:
        raise BadWindow(_("A custom window can span at most a year."))
    try:  # the first and last days of the calendar have no start or end (9999-12-31)
        start = viewer_time.day_bounds(start_day.date())[0]
        end = viewer_time.day_bounds(end_day.date())[1]
    except viewer_time.DayOutOfRange as exc:
        raise BadWindow(
            _("%(day)s is outside the dates the metrics cover.") % {"day": exc.day.isoformat()}
        ) from None
    return Window("custom", start, end)

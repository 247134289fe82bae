"""The recovery metrics dashboard, its JSON twin, and the Prometheus endpoint."""

from __future__ import annotations

import hmac
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.utils import formats, numberformat, timezone
from django.utils.translation import get_language, gettext_lazy, ngettext
from django.utils.translation import gettext as _
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from approvals import console
from approvals.metrics.dashboard import Dashboard, compute
from approvals.metrics.figures import INCONSISTENCIES, INCONSISTENCY_LABELS, Figure
from approvals.metrics.prometheus import PROMETHEUS_CONTENT_TYPE, prometheus_text
from approvals.metrics.queries import STALE_MINUTES
from approvals.metrics.window import BadWindow, Window, parse_window
from approvals.views import console_view
from runs.models import RecoveryCause
from taskpilots.env import env_secret

logger = logging.getLogger("taskpilots.console")

# The page's sections: a question, and the figures that answer it.
GROUPS = [
    (
        gettext_lazy("Does recovery work?"),
        [
            "execution_success_rate",
            "auto_recovery_rate",
            "local_recovery_rate",
            "tool_failure_rate",
        ],
    ),
    (
        gettext_lazy("How long does it take?"),
        [
            "time_to_recover_median",
            "time_to_close_median",
            "pause_to_resume_median",
            "approval_handling_median",
        ],
    ),
    (
        gettext_lazy("How much do people have to do?"),
        [
            "human_takeover_rate",
            "takeovers_per_100_runs",
            "second_intervention_rate",
            "waits_timed_out",
        ],
    ),
    (
        gettext_lazy("Are side effects safe?"),
        [
            "duplicate_side_effect_rate",
            "wrong_retry_rate",
            "snapshot_coverage",
            "missing_field_rate",
            "snapshot_latency_p50",
        ],
    ),
]
# Issue 18: what recovery and takeovers cost (appended, a group of its own).
GROUPS.append(
    (
        gettext_lazy("What do stopped recoveries and takeovers cost?"),
        [
            "recovery_failed_missing_metadata",
            "takeover_handling_time",
            "takeovers_needing_engineer",
            "duplicates_after_resume",
        ],
    )
)
WINDOW_CHOICES = [
    ("24h", gettext_lazy("24 hours")),
    ("7d", gettext_lazy("7 days")),
    ("30d", gettext_lazy("30 days")),
]
SPARK_W, SPARK_H, SPARK_PAD = 220, 36, 3


# --------------------------------------------------------------------------------------------
# Formatting


class Formats:
    """The page's numbers as Django's number_format writes them, with the locale's separators
    and the unit words looked up once per page rather than once per number (a 30-day page
    formats about 900: one per trend value in the tooltips)."""

    def __init__(self) -> None:
        lang = get_language()
        self.decimal = formats.get_format("DECIMAL_SEPARATOR", lang)
        self.grouping = formats.get_format("NUMBER_GROUPING", lang)
        self.thousand = formats.get_format("THOUSAND_SEPARATOR", lang)
        self.units = {
            "ms": _("%(n)s ms"),
            "s": _("%(n)s s"),
            "min": _("%(n)s min"),
            "h": _("%(n)s h"),
            "d": _("%(n)s d"),
        }

    def number(self, value: float, decimal_pos: int | None = None, grouping: bool = False) -> str:
        return numberformat.format(
            value,
            self.decimal,
            decimal_pos,
            self.grouping,
            self.thousand,
            force_grouping=grouping,
            use_l10n=True,
        )

    def value(self, value: float | None, unit: str) -> str:
        if value is None:
            return "—"
        if unit == "ratio":
            digits = 1 if value >= 0.1 or value == 0 else 2
            return f"{self.number(value * 100, digits)} %"
        if unit == "per100":
            return self.number(value, 1)
        if unit == "count":
            return self.number(value, 0, grouping=True)
        if unit == "ms":
            if value < 1000:
                return self.units["ms"] % {"n": self.number(value, 0)}
            value = value / 1000
        return self.duration(value)

    def duration(self, seconds: float) -> str:
        if seconds < 60:
            return self.units["s"] % {"n": self.number(seconds, 1 if seconds < 10 else 0)}
        if seconds < 3600:
            return self.units["min"] % {"n": self.number(seconds / 60, 1)}
        if seconds < 86400:
            return self.units["h"] % {"n": self.number(seconds / 3600, 1)}
        return self.units["d"] % {"n": self.number(seconds / 86400, 1)}


@dataclass
class Spark:
    segments: list[str]  # polyline point lists; a gap where a bucket had no data
    dots: list[tuple[float, float]]  # isolated points
    last: tuple[float, float] | None
    width: int = SPARK_W
    height: int = SPARK_H


def sparkline(series: list[float | None]) -> Spark:
    """Points of an SVG polyline, scaled to the series' own range (0 at the bottom for rates)."""
    values = [v for v in series if v is not None]
    if not values:
        return Spark([], [], None)
    low, high = min(0.0, min(values)), max(values)
    span = (high - low) or 1.0
    n = len(series)
    step = (SPARK_W - 2 * SPARK_PAD) / max(n - 1, 1)

    def point(i: int, v: float) -> tuple[float, float]:
        x = SPARK_PAD + i * step if n > 1 else SPARK_W / 2
        y = SPARK_H - SPARK_PAD - (v - low) / span * (SPARK_H - 2 * SPARK_PAD)
        return round(x, 1), round(y, 1)

    segments, dots, current = [], [], []
    for i, v in enumerate(series + [None]):
        if v is not None:
            current.append(point(i, v))
            continue
        if len(current) > 1:
            segments.append(" ".join(f"{x},{y}" for x, y in current))
        elif current:
            dots.append(current[0])
        current = []
    last_index = max(i for i, v in enumerate(series) if v is not None)
    return Spark(segments, dots, point(last_index, series[last_index]))


def bucket_labels(buckets: list[datetime], bucket: str, viewer) -> list[str]:
    """Each trend bucket's name in the tooltips: hours in the viewer's zone (like every time on
    the page); days are the server zone's days, which the stored day sums are for."""
    labels = []
    for at in buckets:
        if bucket == "hour":
            server_time = timezone.make_aware(at, timezone.get_default_timezone())
            labels.append(formats.date_format(timezone.localtime(server_time, viewer), "H:i"))
        else:
            labels.append(formats.date_format(at, "M j"))
    return labels


def _trend_title(fig: Figure, labels: list[str], fmt: Formats) -> str:
    parts = [
        f"{label}: {fmt.value(value, fig.unit)}"
        for label, value in zip(labels, fig.series, strict=True)
        if value is not None
    ]
    return "\n".join(parts[-48:])


def _card(fig: Figure, labels: list[str], fmt: Formats) -> dict[str, Any]:
    detail = ""
    if fig.unit == "ratio" and fig.counts:
        detail = _("%(n)s of %(d)s") % {
            "n": fmt.number(fig.counts[0], grouping=True),
            "d": fmt.number(fig.counts[1], grouping=True),
        }
    elif fig.unit == "per100" and fig.counts:
        takeovers, runs = (int(count) for count in fig.counts)
        detail = _("%(takeovers)s in %(runs)s") % {
            "takeovers": ngettext("%(n)s takeover", "%(n)s takeovers", takeovers)
            % {"n": fmt.number(takeovers, grouping=True)},
            "runs": ngettext("%(d)s run", "%(d)s runs", runs)
            % {"d": fmt.number(runs, grouping=True)},
        }
    if "mean" in fig.extra:
        detail = _("mean %(v)s") % {"v": fmt.value(fig.extra["mean"], fig.unit)}
    if "p95" in fig.extra:
        detail = _("p95 %(v)s") % {"v": fmt.value(fig.extra["p95"], fig.unit)}
    detail = _cost_detail(fig, fmt) or detail
    return {
        "fig": fig,
        "display": fmt.value(fig.value, fig.unit),
        "detail": detail,
        "spark": sparkline(fig.series),
        "trend_title": _trend_title(fig, labels, fmt),
        "tone": "good" if fig.higher_is_better else "bad" if fig.higher_is_better is False else "",
    }


def _cost_detail(fig: Figure, fmt: Formats) -> str:
    """The line under the issue-18 figures: causes, p90 and actions, resumes."""
    extra = fig.extra
    if "by_cause" in extra:
        return " · ".join(
            f"{RecoveryCause(cause).label}: {n}" for cause, n in extra["by_cause"].items()
        )
    if "p90" in extra:
        return _("p90 %(v)s · %(takeovers)s, %(actions)s") % {
            "v": fmt.value(extra["p90"], fig.unit),
            "takeovers": ngettext("%(n)s takeover", "%(n)s takeovers", extra["count"])
            % {"n": extra["count"]},
            "actions": ngettext("%(n)s action", "%(n)s actions", extra["actions"])
            % {"n": extra["actions"]},
        }
    if "resumes" in extra:
        return ngettext(
            "%(n)s of %(d)s resume had a duplicate",
            "%(n)s of %(d)s resumes had a duplicate",
            extra["resumes"],
        ) % {"n": extra["resumes_with_duplicate"], "d": extra["resumes"]}
    return ""


def _tool_rows(fig: Figure, fmt: Formats) -> list[dict[str, Any]]:
    return [
        {
            **row,
            "display": fmt.value(row["rate"], "ratio") if row["calls"] else "—",
            "classes": [_class_row(cls, share, fmt) for cls, share in row["by_class"].items()],
        }
        for row in fig.extra.get("by_tool", [])
    ]


def _class_row(failure_class: str, share: dict[str, Any], fmt: Formats) -> dict[str, Any]:
    return {
        "name": failure_class,
        "label": console.REASON_LABELS.get(failure_class, failure_class),
        "failures": share["failures"],
        "display": fmt.value(share["rate"], "ratio"),
    }


def _inconsistency_rows(dashboard: Dashboard) -> list[dict[str, Any]]:
    return [
        {
            "kind": kind,
            "label": INCONSISTENCY_LABELS[kind],
            "definition": INCONSISTENCIES[kind] % {"minutes": STALE_MINUTES},
            "count": dashboard.inconsistencies[kind],
        }
        for kind in INCONSISTENCIES
    ]


# --------------------------------------------------------------------------------------------
# Views


def _window_or_error(request: HttpRequest) -> tuple[Window, str]:
    try:
        return parse_window(request.GET), ""
    except BadWindow as exc:
        return parse_window({}), str(exc)


@require_GET
@never_cache
@console_view()
def metrics_page(request: HttpRequest) -> HttpResponse:
    viewer = timezone.get_current_timezone()
    # Windows and day buckets in the server's zone: the rollup stores day sums for it (a
    # viewer's zone would make every day fall back to per-run rows). The page then shows the
    # window's edges in the viewer's zone, with the zone, like every other time.
    with timezone.override(timezone.get_default_timezone()):
        window, error = _window_or_error(request)
        dashboard = compute(window)
        local_start, local_end = timezone.localtime(window.start), timezone.localtime(window.end)
    figures = {f.key: f for f in dashboard.figures}
    labels = bucket_labels(dashboard.buckets, window.bucket, viewer)
    fmt = Formats()
    groups = [(title, [_card(figures[key], labels, fmt) for key in keys]) for title, keys in GROUPS]
    context = {
        "dashboard": dashboard,
        "groups": groups,
        "window": window,
        "window_choices": WINDOW_CHOICES,
        "window_error": error,
        "tool_failures": figures["tool_failure_rate"],
        "tool_rows": _tool_rows(figures["tool_failure_rate"], fmt),
        "inconsistencies": _inconsistency_rows(dashboard),
        "custom_start": request.GET.get("start") or local_start.date(),
        "custom_end": request.GET.get("end") or local_end.date(),
    }
    return render(request, "console/metrics.html", context, status=400 if error else 200)


@require_GET
@never_cache
@console_view()
def metrics_json(request: HttpRequest) -> JsonResponse:
    with timezone.override(timezone.get_default_timezone()):  # as the page (see above)
        try:
            window = parse_window(request.GET)
        except BadWindow as exc:
            return JsonResponse(
                {"error": {"code": "bad_window", "message": str(exc), "field": "window"}},
                status=400,
            )
        document = compute(window).as_json()
    return JsonResponse(document, json_dumps_params={"ensure_ascii": False})


def _bearer_ok(request: HttpRequest) -> bool:
    token = env_secret("TASKPILOTS_METRICS_TOKEN") or ""
    header = request.headers.get("Authorization", "")
    scheme, _sep, given = header.partition(" ")
    if not token or scheme.lower() != "bearer" or not given.strip():
        return False
    return hmac.compare_digest(given.strip().encode(), token.encode())


@require_GET
@never_cache
def prometheus(request: HttpRequest) -> HttpResponse:
    """Prometheus scrape target. A bearer token (env TASKPILOTS_METRICS_TOKEN) or an admin's
    session; without a configured token only logged-in admins get in."""
    if not (_bearer_ok(request) or console.is_admin(request.user)):
        logger.warning("metrics scrape refused: path=%s", request.path)
        response = HttpResponse(
            "authentication required\n", status=401, content_type="text/plain; charset=utf-8"
        )
        response["WWW-Authenticate"] = 'Bearer realm="taskpilots-metrics"'
        return response
    return HttpResponse(prometheus_text(), content_type=PROMETHEUS_CONTENT_TYPE)

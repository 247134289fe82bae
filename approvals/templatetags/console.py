"""Template helpers for the console: translated labels, bounded JSON, SLA wording, untrusted
text (`|untrusted`, `|untrusted_plain`), timestamps (`|when`) and the roles that decide which
entries the navigation shows (`|can_audit`, `|is_console_admin`)."""

from __future__ import annotations

from typing import Any

from django import template
from django.utils import formats, timezone

from approvals import console, paging, permissions, viewer_time
from approvals import timeline_reading as reading
from approvals import untrusted as untrusted_module

register = template.Library()

_LABELS = {
    "run": console.RUN_STATUS_LABELS,
    "step": console.STEP_STATUS_LABELS,
    "effect": console.EFFECT_STATUS_LABELS,
    "reason": console.REASON_LABELS,
    "kind": console.STEP_KIND_LABELS,
    "verb": console.VERB_LABELS,
    "decision": console.DECISION_LABELS,
    "risk": console.RISK_LABELS,
    "failure_class": console.FAILURE_CLASS_LABELS,
}


@register.filter
def label(value: str, kind: str) -> str:
    return console.label(_LABELS[kind], value or "")


@register.filter
def decision_sentence(decision) -> str:
    """What a person did, as the rest of a sentence after their name, with where a
    reassignment went ("reassigned the run to queue ops")."""
    return reading.decision_sentence(decision)


@register.filter
def decision_change(decision) -> str:
    """What an edit changed ("amount 240 → 200"), or nothing."""
    return reading.decision_change(decision)


@register.filter
def about(count: int) -> int:
    """An estimated count, rounded to what it is worth (approvals/paging.py)."""
    return paging.about(int(count or 0))


class GroupedCount(int):
    """A count that still chooses plural forms ({% blocktranslate count %} needs a number) but
    is shown with the language's thousands separators: "About 20,000 runs match"."""

    def __str__(self) -> str:
        return formats.number_format(int(self), force_grouping=True)


@register.filter
def grouped(count: Any) -> Any:
    """A count with thousands separators; anything that is not a whole number as it is."""
    if isinstance(count, bool) or not isinstance(count, int):
        return count
    return GroupedCount(count)


@register.filter
def duration(seconds: Any) -> str:
    """Seconds as a person reads them: 14400 → "4 h" (approvals/console/run_page.py)."""
    return console.human_duration(seconds)


@register.filter
def can_audit(user) -> bool:
    return permissions.can_audit(user)


@register.filter
def can_act(user) -> bool:
    return permissions.can_act(user)


@register.filter
def is_console_admin(user) -> bool:
    return permissions.is_admin(user)


@register.filter
def untrusted(value: Any) -> str:
    """Anything an agent, a tool or a person produced: escaped, bidi-isolated (`<bdi>`), with
    invisible characters shown as markers. For element content."""
    return untrusted_module.isolate(value)


@register.filter
def engine_text(value: Any) -> Any:
    """A sentence the engine stored in English, in the reader's language
    (approvals/console/labels.py); still to be shown through |untrusted."""
    return console.engine_text(value)


@register.filter
def untrusted_plain(value: Any) -> str:
    """The same for places that take no markup: attributes, `<title>`, SVG text."""
    return untrusted_module.reveal_plain(value)


@register.filter
def when(value: Any, form: str = "") -> str:
    """Every timestamp on the console and audit pages: one format, in the viewer's zone, with
    the zone (`2026-10-14 17:11:05 UTC+2`). `|when` gives a <time> element; `|when:"plain"` the
    text alone, for attributes. No query: the zone comes from the session."""
    if not value:
        return ""
    if form == "plain":
        return viewer_time.format_timestamp(value)
    return viewer_time.timestamp_html(value)


@register.simple_tag
def viewer_zone() -> str:
    return viewer_time.viewer_zone()


@register.filter
def has_invisible(value: Any) -> bool:
    return untrusted_module.has_invisible(value if isinstance(value, str) else "")


@register.filter
def short_id(value: Any) -> str:
    return str(value)[:8]


@register.filter
def is_overdue(due, now=None) -> bool:
    return bool(due) and due < (now or timezone.now())


@register.inclusion_tag("console/_json.html")
def json_block(value: Any, raw_url: str = "", css: str = "") -> dict:
    """Pretty JSON inside <pre>, auto-escaped; big or deep values are clipped with a link to
    the raw document (served as application/json)."""
    preview = console.preview_json(value)
    html = untrusted_module.json_html(preview.text)
    return {"preview": preview, "html": html, "raw_url": raw_url, "css": css}

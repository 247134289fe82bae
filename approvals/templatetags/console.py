"""Template helpers for the console: translated labels, bounded JSON, SLA wording."""

from __future__ import annotations

from typing import Any

from django import template
from django.utils import timezone

from approvals import console

register = template.Library()

_LABELS = {
    "run": console.RUN_STATUS_LABELS,
    "step": console.STEP_STATUS_LABELS,
    "effect": console.EFFECT_STATUS_LABELS,
    "reason": console.REASON_LABELS,
    "kind": console.STEP_KIND_LABELS,
    "verb": console.VERB_LABELS,
}


@register.filter
def label(value: str, kind: str) -> str:
    return console.label(_LABELS[kind], value or "")


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
    return {"preview": preview, "raw_url": raw_url, "css": css}

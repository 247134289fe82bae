"""Untrusted text as people see it: bidi-isolated, with invisible characters made visible.

Anything an agent, a tool or a person produced (business keys, names, parameters, comments,
reasons, error messages) may carry right-to-left text or invisible format characters. A
business key `bk-<U+202E>1-gpj.exe` reads `bk-exe.jpg-1` when rendered naively. The stored value
is never changed; only its display is (the character table is in runs/invisible.py, shared
with the audit exports):

- `reveal()` escapes the text and shows every invisible or bidi format character as a visible
  marker (`[U+202E]`, with the character's name on hover) instead of letting it act.
- `isolate()` also wraps it in `<bdi>`, so right-to-left text inside cannot reorder the page
  around it, nor the page reorder it.
- `reveal_plain()` is for places that take no markup (attributes, `<title>`, `<option>`, SVG
  text): markers as text, between FSI and PDI (the isolate characters).
- `json_html()` renders pretty-printed JSON with every string isolated.

Everything here escapes its input; the SafeStrings it returns contain only our own markup.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

from django.utils.html import escape
from django.utils.safestring import SafeData, SafeString, mark_safe

from runs.invisible import (  # noqa: F401  (the console uses them from here)
    INVISIBLE,
    INVISIBLE_RANGES,
    as_text,
    escape_json,
    has_invisible,
    is_invisible,
    marker,
)

FSI, PDI = "\u2068", "\u2069"


def _name(char: str) -> str:
    return unicodedata.name(char, "CONTROL CHARACTER")


def reveal(value: Any) -> SafeString:
    """Escaped text; each invisible character becomes a visible, named marker."""
    if isinstance(value, SafeData):  # markup this module (or a template) already made
        return value
    text = as_text(value)
    if not has_invisible(text):
        return escape(text)
    out, last = [], 0
    for match in INVISIBLE.finditer(text):
        char = match.group()
        out.append(escape(text[last : match.start()]))
        out.append(
            f'<span class="invisible-char" title="{escape(_name(char))}">{marker(char)}</span>'
        )
        last = match.end()
    out.append(escape(text[last:]))
    return mark_safe("".join(out))


def isolate(value: Any) -> SafeString:
    """`reveal()` inside `<bdi>`: isolated from the text around it in both directions."""
    return mark_safe(f"<bdi>{reveal(value)}</bdi>")


def reveal_plain(value: Any) -> str:
    """For text-only places: markers as text, isolated with FSI…PDI. Not escaped (the
    template's auto-escaping does that)."""
    text = INVISIBLE.sub(lambda m: marker(m.group()), as_text(value))
    return f"{FSI}{text}{PDI}" if text else ""


_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


def json_html(text: str) -> SafeString:
    """Pretty-printed JSON (possibly cut short) as HTML: every complete string isolated, every
    invisible character shown as a marker, everything escaped."""
    out, last = [], 0
    for match in _JSON_STRING.finditer(text):
        out.append(reveal(text[last : match.start()]))
        out.append(f'"{isolate(match.group()[1:-1])}"')
        last = match.end()
    out.append(reveal(text[last:]))
    return mark_safe("".join(out))

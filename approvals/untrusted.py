"""Untrusted text as people see it: bidi-isolated, with invisible characters made visible.

Anything an agent, a tool or a person produced (business keys, names, parameters, comments,
reasons, error messages) may carry right-to-left text or invisible format characters. A
business key `bk-<U+202E>1-gpj.exe` reads `bk-exe.jpg-1` when rendered naively. The stored value
is never changed; only its display is:

- `reveal()` escapes the text and shows every invisible or bidi format character as a visible
  marker (`[U+202E]`, with the character's name on hover) instead of letting it act.
- `isolate()` also wraps it in `<bdi>`, so right-to-left text inside cannot reorder the page
  around it, nor the page reorder it.
- `reveal_plain()` is for places that take no markup (attributes, `<title>`, `<option>`, SVG
  text): markers as text, between FSI and PDI (the isolate characters).
- `escape_json()` writes those characters as `\\uXXXX` inside a JSON document: the same JSON value
  (hashes over the parsed data do not change), but a text editor shows them.
- `json_html()` renders pretty-printed JSON with every string isolated.

Everything here escapes its input; the SafeStrings it returns contain only our own markup.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

from django.utils.html import escape
from django.utils.safestring import SafeData, SafeString, mark_safe

FSI, PDI = "\u2068", "\u2069"

# Invisible letters and marks that are not in a "format" category but draw nothing.
_INVISIBLE_EXTRA = {0x034F, 0x115F, 0x1160, 0x17B4, 0x17B5, 0x3164, 0xFFA0}

# Every code point `is_invisible()` accepts, as ranges (Unicode 15.1, Python 3.13). Scanning
# all of Unicode at start-up costs most of a second, so the table is written out;
# tests/approvals/test_untrusted.py recomputes it and fails when Python's Unicode data moves on.
INVISIBLE_RANGES = (
    (0x0000, 0x0008), (0x000B, 0x000C), (0x000E, 0x001F), (0x007F, 0x009F), (0x00AD, 0x00AD),
    (0x034F, 0x034F), (0x0600, 0x0605), (0x061C, 0x061C), (0x06DD, 0x06DD), (0x070F, 0x070F),
    (0x0890, 0x0891), (0x08E2, 0x08E2), (0x115F, 0x1160), (0x17B4, 0x17B5), (0x180E, 0x180E),
    (0x200B, 0x200F), (0x2028, 0x202E), (0x2060, 0x2064), (0x2066, 0x206F), (0x3164, 0x3164),
    (0xFEFF, 0xFEFF), (0xFFA0, 0xFFA0), (0xFFF9, 0xFFFB), (0x110BD, 0x110BD),
    (0x110CD, 0x110CD), (0x13430, 0x1343F), (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A),
    (0xE0001, 0xE0001), (0xE0020, 0xE007F),
)  # fmt: skip


def is_invisible(char: str) -> bool:
    """Format characters (bidi controls, zero-width ones, tags, BOM), line/paragraph
    separators, control characters other than tab and newlines, and invisible fillers."""
    if ord(char) in _INVISIBLE_EXTRA:
        return True
    category = unicodedata.category(char)
    if category == "Cc":
        return char not in "\t\n\r"
    return category in ("Cf", "Zl", "Zp")


def _class(ranges) -> str:
    return "".join(f"\\U{a:08x}" if a == b else f"\\U{a:08x}-\\U{b:08x}" for a, b in ranges)


_INVISIBLE = re.compile(f"[{_class(INVISIBLE_RANGES)}]")


def marker(char: str) -> str:
    return f"[U+{ord(char):04X}]"


def _name(char: str) -> str:
    return unicodedata.name(char, "CONTROL CHARACTER")


def has_invisible(value: str) -> bool:
    return bool(_INVISIBLE.search(value))


def _as_text(value: Any) -> str:
    return "" if value is None else str(value)


def reveal(value: Any) -> SafeString:
    """Escaped text; each invisible character becomes a visible, named marker."""
    if isinstance(value, SafeData):  # markup this module (or a template) already made
        return value
    text = _as_text(value)
    if not has_invisible(text):
        return escape(text)
    out, last = [], 0
    for match in _INVISIBLE.finditer(text):
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
    text = _INVISIBLE.sub(lambda m: marker(m.group()), _as_text(value))
    return f"{FSI}{text}{PDI}" if text else ""


def neutralise(value: Any) -> str:
    """Markers as text and nothing else: for CSV cells and other plain files."""
    return _INVISIBLE.sub(lambda m: marker(m.group()), _as_text(value))


def _json_escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def escape_json(document: str) -> str:
    """`document` is JSON text; such characters only occur inside its strings, where `\\uXXXX`
    is the same value. Parsing the result gives exactly the same data."""
    return _INVISIBLE.sub(_json_escape, document)


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

"""Invisible and bidirectional format characters in text that agents, tools and people
produced, for the places that write such text out: the audit exports (runs/audit.py) and the
console (approvals/untrusted.py).

The stored data is never changed. What changes is how it is written:
- `escape_json()`: inside a JSON document, as `\\uXXXX` escapes. That is the same JSON value, so
  hashes computed over the parsed data still match; a text editor shows the escape instead of
  obeying the character.
- `neutralise()`: in plain text (CSV cells), as a visible marker `[U+202E]`.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

# Invisible letters and marks that are not in a "format" category but draw nothing.
INVISIBLE_EXTRA = {0x034F, 0x115F, 0x1160, 0x17B4, 0x17B5, 0x3164, 0xFFA0}

# Every code point `is_invisible()` accepts, as ranges (the same for Unicode 15.0 and 15.1, i.e.
# Python 3.12 and 3.13). Scanning all of Unicode at start-up costs most of a second, so the
# table is written out; tests/approvals/test_untrusted.py recomputes it and fails when Python's
# Unicode data moves on.
INVISIBLE_RANGES = (
    (0x0000, 0x0008),
    (0x000B, 0x000C),
    (0x000E, 0x001F),
    (0x007F, 0x009F),
    (0x00AD, 0x00AD),
    (0x034F, 0x034F),
    (0x0600, 0x0605),
    (0x061C, 0x061C),
    (0x06DD, 0x06DD),
    (0x070F, 0x070F),
    (0x0890, 0x0891),
    (0x08E2, 0x08E2),
    (0x115F, 0x1160),
    (0x17B4, 0x17B5),
    (0x180E, 0x180E),
    (0x200B, 0x200F),
    (0x2028, 0x202E),
    (0x2060, 0x2064),
    (0x2066, 0x206F),
    (0x3164, 0x3164),
    (0xFEFF, 0xFEFF),
    (0xFFA0, 0xFFA0),
    (0xFFF9, 0xFFFB),
    (0x110BD, 0x110BD),
    (0x110CD, 0x110CD),
    (0x13430, 0x1343F),
    (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A),
    (0xE0001, 0xE0001),
    (0xE0020, 0xE007F),
)


def is_invisible(char: str) -> bool:
    """Format characters (bidi controls, zero-width ones, tags, BOM), line/paragraph
    separators, control characters other than tab and newlines, and invisible fillers."""
    if ord(char) in INVISIBLE_EXTRA:
        return True
    category = unicodedata.category(char)
    if category == "Cc":
        return char not in "\t\n\r"
    return category in ("Cf", "Zl", "Zp")


def _class(ranges) -> str:
    return "".join(f"\\U{a:08x}" if a == b else f"\\U{a:08x}-\\U{b:08x}" for a, b in ranges)


INVISIBLE = re.compile(f"[{_class(INVISIBLE_RANGES)}]")


def marker(char: str) -> str:
    return f"[U+{ord(char):04X}]"


def has_invisible(value: str) -> bool:
    return bool(INVISIBLE.search(value))


def as_text(value: Any) -> str:
    return "" if value is None else str(value)


def neutralise(value: Any) -> str:
    """Markers as text and nothing else: for CSV cells and other plain files."""
    return INVISIBLE.sub(lambda m: marker(m.group()), as_text(value))


def _json_escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def escape_json(document: str) -> str:
    """`document` is JSON text; such characters only occur inside its strings, where `\\uXXXX`
    is the same value. Parsing the result gives exactly the same data."""
    return INVISIBLE.sub(_json_escape, document)

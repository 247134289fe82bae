"""Invisible and bidirectional format characters: how text that agents, tools and people
produced is written out (the audit exports, runs/audit/export.py, and the console, approvals/
untrusted.py), and which characters an identifier may not hold at all (the API and the console
refuse them; see "Identifiers" below).

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


# --------------------------------------------------------------------------------------------
# Identifiers: keys, names and references a person reads or a machine matches exactly
# (business keys, event ids, session references, user names, workflow, step, tool and queue
# names). Two identifiers that look the same must be the same, so an identifier may hold no
# character that draws nothing, reorders what is shown or breaks the line:
# - Unicode's Default_Ignorable_Code_Point (DerivedCoreProperties.txt). Python's unicodedata has
#   no such property, so the ranges are written out from the definition; they are the same in
#   Unicode 15.0, 15.1 and 16.0. They include the Hangul fillers (U+115F, U+1160, U+3164,
#   U+FFA0), the combining grapheme joiner (U+034F), the variation selectors (U+FE00..FE0F,
#   U+E0100..E01EF) and the tag characters.
# - Every control (Cc), format (Cf), line separator (Zl) and paragraph separator (Zp).
# - U+2800 BRAILLE PATTERN BLANK, a symbol that draws nothing (used to fake blank names).
DEFAULT_IGNORABLE_RANGES = (
    (0x00AD, 0x00AD),
    (0x034F, 0x034F),
    (0x061C, 0x061C),
    (0x115F, 0x1160),
    (0x17B4, 0x17B5),
    (0x180B, 0x180F),
    (0x200B, 0x200F),
    (0x202A, 0x202E),
    (0x2060, 0x206F),
    (0x3164, 0x3164),
    (0xFE00, 0xFE0F),
    (0xFEFF, 0xFEFF),
    (0xFFA0, 0xFFA0),
    (0xFFF0, 0xFFF8),
    (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A),
    (0xE0000, 0xE0FFF),
)
BLANK_SYMBOLS = (0x2800,)
IDENTIFIER_CATEGORIES = ("Cc", "Cf", "Zl", "Zp")


def forbidden_in_identifier(char: str) -> bool:
    """The definition `IDENTIFIER_FORBIDDEN_RANGES` is computed from (tests recompute it)."""
    code = ord(char)
    return (
        any(low <= code <= high for low, high in DEFAULT_IGNORABLE_RANGES)
        or code in BLANK_SYMBOLS
        or unicodedata.category(char) in IDENTIFIER_CATEGORIES
    )


# `forbidden_in_identifier` over all of Unicode (surrogates aside: no valid string holds one
# alone, and the API refuses them as invalid UTF-8), as ranges: for Python 3.12 and 3.13
# (Unicode 15.0, 15.1). tests/runs/test_bad_input_api.py recomputes it and fails when Python's
# Unicode data moves on. The API's schema states it as a pattern (runs/api/errors.py).
IDENTIFIER_FORBIDDEN_RANGES = (
    (0x0000, 0x001F),
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
    (0x180B, 0x180F),
    (0x200B, 0x200F),
    (0x2028, 0x202E),
    (0x2060, 0x206F),
    (0x2800, 0x2800),
    (0x3164, 0x3164),
    (0xFE00, 0xFE0F),
    (0xFEFF, 0xFEFF),
    (0xFFA0, 0xFFA0),
    (0xFFF0, 0xFFFB),
    (0x110BD, 0x110BD),
    (0x110CD, 0x110CD),
    (0x13430, 0x1343F),
    (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A),
    (0xE0000, 0xE0FFF),
)
IDENTIFIER_FORBIDDEN = re.compile(f"[{_class(IDENTIFIER_FORBIDDEN_RANGES)}]")


# The same, but for escaping a JSON document: tab, newline and carriage return are its layout
# (json.dumps escapes them inside strings already).
_ESCAPED_IN_DOCUMENTS = re.compile(f"(?![\t\n\r])[{_class(IDENTIFIER_FORBIDDEN_RANGES)}]")


def escape_json_fully(document: str) -> str:
    """`escape_json` for every character an identifier may not hold: for pages that show JSON
    holding such characters on purpose (the API's schema, whose identifier pattern lists them)."""
    return _ESCAPED_IN_DOCUMENTS.sub(_json_escape, document)


def first_forbidden_in_identifier(value: str) -> str | None:
    """The first character `value` may not hold as an identifier, or None."""
    match = IDENTIFIER_FORBIDDEN.search(value)
    return match.group() if match else None


def character_name(char: str) -> str:
    """`U+202E (RIGHT-TO-LEFT OVERRIDE)`, for messages."""
    name = unicodedata.name(char, "")
    return f"U+{ord(char):04X} ({name})" if name else f"U+{ord(char):04X}"

"""The console's sentences are template partials (templates/console/sentences/, rendered by
approvals.console.sentence): every one escapes and isolates what an agent, a tool or a person
wrote into it, and every one reads in Chinese, which it does only while its text is still the
catalogue's msgid (a sentence reworded in its template and not translated would show English)."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import pytest
from django.conf import settings
from django.utils import translation
from django.utils.safestring import SafeString, mark_safe

from approvals.console import sentence

SENTENCES = Path(settings.BASE_DIR) / "templates" / "console" / "sentences"
RLO = "\u202e"
HOSTILE = f'<script>alert(1)</script>{RLO}" hx-get="/admin/'
# Values of ours: counts, times, the run's status and a decision's verb (shown by their labels),
# a sentence put inside another, an amount formatted in Python. Everything else is data.
OURS = {
    "count": 3, "n": 3, "attempts": 3, "minutes": 3,
    "at": datetime(2026, 10, 14, 15, 11, 5, tzinfo=UTC), "due": None,
    "status": "cancelled", "verb": "reject",
    "suggestion": mark_safe("<em>…</em>"), "amount": "1,250.00",
}  # fmt: skip
DATA = ("owner", "step", "effects", "queue", "tool", "who", "key", "ref", "target", "event",
        "rule", "reason", "user", "comment", "error", "result", "person", "currency")  # fmt: skip
PARTIAL = re.compile(r"\{%\s*partialdef\s+([\w-]+)")
ASSIGNED = re.compile(r"\b(\w+)=")
READ = re.compile(r"\b\w+=(\w+)|\{\{\s*(\w+)")


def _partials() -> list[str]:
    return [
        f"{path.name}#{name}"
        for path in sorted(SENTENCES.glob("*.html"))
        for name in PARTIAL.findall(path.read_text(encoding="utf-8"))
    ]


def _values() -> dict:
    return {
        **dict.fromkeys(DATA, HOSTILE),
        **OURS,
        "ended": OURS["at"],
        "decided": OURS["at"],
        "time": OURS["at"],
    }


def test_every_value_a_sentence_reads_is_one_this_test_gives():
    # A new placeholder unknown here would render empty below and prove nothing.
    for path in SENTENCES.glob("*.html"):
        text = path.read_text(encoding="utf-8")
        read = {name for pair in READ.findall(text) for name in pair if name}
        assert read - set(ASSIGNED.findall(text)) <= set(_values()), path.name


@pytest.mark.parametrize("partial", _partials())
def test_every_sentence_escapes_and_isolates_the_data_in_it(partial):
    shown = sentence(partial, **_values())
    assert isinstance(shown, SafeString) and shown.strip() == shown and shown
    assert "<script" not in shown and 'hx-get="/admin/' not in shown
    assert RLO not in shown  # shown as a marker: the value went through |untrusted
    quoted = shown.count("&lt;script&gt;")
    assert quoted == shown.count("<bdi>&lt;script&gt;"), shown


@pytest.mark.parametrize("partial", [p for p in _partials() if p != "labels.html#amount"])
def test_every_sentence_reads_in_chinese(partial):
    english = sentence(partial, **_values())
    with translation.override("zh-hans"):
        chinese = sentence(partial, **_values())
    assert chinese != english
    assert not re.search(r"\b(the|run|is|and|to|of|it)\b", re.sub(r"<bdi>.*?</bdi>", "", chinese))

"""Nothing in the console is left in English for a zh-Hans reader: every message in the catalog
is translated (and none is fuzzy, which gettext leaves out of the .mo), and every piece of
template text is marked for translation.

Issue 33 §5 found English on the bulk page, in titles, "Done", "Created", "Approval" and the
form's "- Select an option -"; these tests fail on the next such string instead."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.conf import settings

CATALOG = Path(settings.BASE_DIR) / "locale" / "zh_Hans" / "LC_MESSAGES" / "django.po"
TEMPLATES = Path(settings.BASE_DIR) / "templates"
# English on purpose: the API reference is for developers and says lang="en" (its texts come
# from the OpenAPI schema, which is English).
ENGLISH_ONLY = {"api/docs.html"}
# Names and codes that read the same in every language.
ALLOWED = {
    "TaskPilots", "JSON", "CSV", "API", "SLA", "UTC", "ID", "URL", "HTTP", "OAuth", "PostgreSQL",
    "sha", "Lines",  # "JSON Lines" is a format's name
    "Webhook", "Slack",
}  # fmt: skip

# Template syntax that holds no text of its own, or whose text is translated.
STRIPPED = [
    # Blocks that hold class names: {% block nav_inbox %}is-active{% endblock %}.
    re.compile(r"\{%\s*block\s+(?:nav_\w+|body_class)\s*%\}.*?\{%\s*endblock\s*%\}", re.S),
    re.compile(r"\{%\s*comment\s*%\}.*?\{%\s*endcomment\s*%\}", re.S),
    re.compile(r"\{#.*?#\}", re.S),
    re.compile(r"\{%\s*blocktrans(?:late)?\b.*?\{%\s*endblocktrans(?:late)?\s*%\}", re.S),
    re.compile(r"<(script|style)\b.*?</\1>", re.S),
    re.compile(r"\{%.*?%\}", re.S),
    re.compile(r"\{\{.*?\}\}", re.S),
]
# Attributes a person reads (or a screen reader says).
READ_ATTRIBUTES = re.compile(r"""\b(?:title|aria-label|placeholder|alt)=(["'])(.*?)\1""", re.S)
TAG = re.compile(r"<[^>]*>", re.S)
ENTITY = re.compile(r"&#?\w+;")
WORD = re.compile(r"[A-Za-z]{2,}")


def _po_messages(text: str) -> list[dict]:
    """Each entry of a .po file as {"flags", "msgid", "msgstr"} (msgstr[n] joined)."""
    entries = []
    for block in text.split("\n\n"):
        lines = [line for line in block.splitlines() if line.strip()]
        flags, fields, current = "", {}, None
        for line in lines:
            if line.startswith("#,"):
                flags += line[2:]
            elif line.startswith("#"):
                continue
            elif line.startswith('"'):
                fields[current] += line.strip()[1:-1]
            else:
                current, _, value = line.partition(" ")
                current = "msgstr" if current.startswith("msgstr") else current
                fields[current] = fields.get(current, "") + ("\0" if current in fields else "")
                fields[current] += value.strip()[1:-1]
        if fields.get("msgid"):
            entries.append({"flags": flags, **fields})
    return entries


def _untranslated_text(source: str) -> list[str]:
    shown = [value for _, value in READ_ATTRIBUTES.findall(source)]
    for pattern in STRIPPED:
        source = pattern.sub(" ", source)
        shown = [pattern.sub(" ", value) for value in shown]
    text = " ".join([TAG.sub(" ", source), *shown])
    return [word for word in WORD.findall(ENTITY.sub(" ", text)) if word not in ALLOWED]


def test_every_catalog_message_is_translated_and_none_is_fuzzy():
    entries = _po_messages(CATALOG.read_text(encoding="utf-8"))
    assert len(entries) > 500  # the parser read the catalog
    fuzzy = [e["msgid"] for e in entries if "fuzzy" in e["flags"]]
    empty = [e["msgid"] for e in entries if not e["msgstr"].replace("\0", "").strip()]
    partly = [e["msgid"] for e in entries if "" in e["msgstr"].split("\0")]
    assert not fuzzy, f"fuzzy in the zh-Hans catalog: {fuzzy}"
    assert not empty, f"untranslated in the zh-Hans catalog: {empty}"
    assert not partly, f"a plural form left empty: {partly}"


def test_every_template_text_is_marked_for_translation():
    found = {}
    for path in sorted(TEMPLATES.rglob("*.html")):
        name = path.relative_to(TEMPLATES).as_posix()
        if name in ENGLISH_ONLY:
            continue
        words = _untranslated_text(path.read_text(encoding="utf-8"))
        if words:
            found[name] = words
    assert not found, f"template text not marked for translation: {found}"


def test_the_checker_finds_unmarked_text_and_passes_marked_text():
    unmarked = '<p title="Open it">{% translate "Done" %} Created</p>'
    assert sorted(_untranslated_text(unmarked)) == ["Created", "Open", "it"]
    marked = (
        "<p title=\"{% translate 'Open' %}\">"
        "{% blocktranslate %}Hi {{ n }}{% endblocktranslate %}</p>"
    )
    assert _untranslated_text(marked) == []
    assert _untranslated_text("<td>{{ run.pk }} · TaskPilots &amp; CSV</td>") == []


OPTION = re.compile(r'<option value="([^"]*)"[^>]*>([^<]*)</option>')


@pytest.mark.django_db
def test_form_options_read_in_chinese(client, admin_user):
    """The options of the bulk, rule and channel forms (issue 33 §5: the bulk page's actions and
    statuses, and "- Select an option -", were English). Options whose text is their value are
    names (workflows, queues, tools) and stay as they are."""
    client.force_login(admin_user)
    english = {}
    for url in (
        "/console/",
        "/console/bulk/new/",
        "/console/rules/new/",
        "/console/rules/channels/",
    ):
        html = client.get(url, HTTP_ACCEPT_LANGUAGE="zh-Hans").content.decode()
        for value, text in OPTION.findall(html):
            words = [w for w in WORD.findall(text) if w not in ALLOWED]
            if text.strip("\u2068\u2069 ") != value and words:
                english.setdefault(url, []).append(text)
    assert not english, english

"""Untrusted text is shown as it is: right-to-left and invisible format characters cannot
disguise a business key, a parameter or a comment, and nothing they carry becomes markup."""

from __future__ import annotations

import json
import re

import pytest
from django.urls import reverse

from approvals import untrusted
from runs.invisible import neutralise
from runs.models import TimelineEvent
from tests.approvals.console_helpers import (  # noqa: F401  (fast_passwords is autouse)
    approval_run,
    fast_passwords,
    start,
)

pytestmark = pytest.mark.django_db

RLO, ZWSP = "\u202e", "\u200b"
# Rendered naively this key reads "bk-exe.jpg-1LTRXDAB".
SPOOFED_KEY = f"bk-{RLO}BADXRTL1-gpj.exe"


def test_the_table_of_invisible_characters_matches_pythons_unicode_data():
    # The ranges are written out (scanning Unicode costs most of a second at start-up); when a
    # new Python ships newer Unicode data, this says which ranges to write.
    found, start, previous = [], None, None
    for code in range(0x110000):
        if 0xD800 <= code <= 0xDFFF or not untrusted.is_invisible(chr(code)):
            continue
        if start is not None and code == previous + 1:
            previous = code
            continue
        if start is not None:
            found.append((start, previous))
        start = previous = code
    found.append((start, previous))
    assert tuple(found) == untrusted.INVISIBLE_RANGES


def test_reveal_escapes_and_marks_every_invisible_character():
    text = untrusted.reveal(f'<b onclick="x">{RLO}a{ZWSP}b\U000e0041\u2066\n\tc')
    assert "<b" not in text and "&lt;b onclick=&quot;x&quot;&gt;" in text
    for code in ("202E", "200B", "E0041", "2066"):
        assert f">[U+{code}]</span>" in text
    assert RLO not in text and ZWSP not in text and "\u2066" not in text
    assert "\n\tc" in text  # newlines and tabs are ordinary text
    assert 'title="RIGHT-TO-LEFT OVERRIDE"' in text
    assert untrusted.isolate("abc") == "<bdi>abc</bdi>"


def test_plain_text_gets_markers_and_isolates_but_no_markup():
    plain = untrusted.reveal_plain(f"<i>{RLO}x")
    assert plain == "\u2068<i>[U+202E]x\u2069"  # the template escapes it
    assert neutralise(f"a{ZWSP}b") == "a[U+200B]b"  # CSV cells


def test_json_escaping_keeps_the_same_value():
    data = {"key": SPOOFED_KEY, f"k{ZWSP}": ["tag\U000e0041", "plain ünïcode 中文"]}
    document = untrusted.escape_json(json.dumps(data, ensure_ascii=False))
    assert RLO not in document and ZWSP not in document and "\\u202e" in document
    assert "\\udb40\\udc41" in document  # astral characters as a surrogate pair
    assert "中文" in document  # only invisible characters are escaped
    assert json.loads(document) == data


def test_json_html_isolates_every_string_and_escapes_the_rest():
    text = json.dumps({"a": f'x"{RLO}</pre>', "n": 1}, ensure_ascii=False, indent=2)
    html = untrusted.json_html(text)
    assert '"<bdi>a</bdi>"' in html and "</pre>" not in html
    assert '"<bdi>x\\&quot;<span class="invisible-char"' in html
    assert '"<bdi>n</bdi>": 1' in html
    # A preview cut in the middle of a string still escapes and marks its tail.
    assert untrusted.json_html(f'{{"a": "<x{RLO}') == '{"<bdi>a</bdi>": &quot;&lt;x' + (
        '<span class="invisible-char" title="RIGHT-TO-LEFT OVERRIDE">[U+202E]</span>'
    )


def _outside_form_values(html: str) -> str:
    return re.sub(r'<input [^>]*value="[^"]*"', "", html)


def test_the_run_page_shows_a_spoofed_business_key_as_it_is(client, sandbox, support_user):
    run = start("test.refund", {"amount": 150, "payment": f"pay{ZWSP}_1"},
                business_key=SPOOFED_KEY)  # fmt: skip
    client.force_login(support_user)
    for path in (
        reverse("console:run-detail", args=[run.pk]),
        reverse("console:run-list") + "?q=bk-",
    ):
        text = _outside_form_values(client.get(path).content.decode())
        assert RLO not in text and ZWSP not in text, path
        assert '<bdi>bk-<span class="invisible-char"' in text, path
    detail = client.get(reverse("console:run-detail", args=[run.pk])).content.decode()
    # The edit form keeps the real value (that is what is edited) and says what it holds.
    assert 'value="pay\u200b_1"' in detail
    assert "This value contains invisible characters" in detail
    # The parameters (a JSON block) and the target show the zero-width space too.
    assert 'pay<span class="invisible-char" title="ZERO WIDTH SPACE">[U+200B]</span>_1' in detail


def test_reasons_comments_and_errors_are_isolated_everywhere(client, sandbox, support_user):
    from approvals import actions

    run = approval_run(payment=f"pay_{RLO}2")
    actions.take_over(run.pk, support_user, comment=f"checked {RLO}by phone")
    client.force_login(support_user)
    decisions = client.get(reverse("console:run-detail", args=[run.pk]) + "?tab=decisions")
    text = _outside_form_values(decisions.content.decode())
    assert RLO not in text and "<bdi>checked <span" in text
    events = client.get(reverse("console:run-detail", args=[run.pk]) + "?tab=events")
    assert RLO not in _outside_form_values(events.content.decode())
    rehydration = client.get(reverse("console:run-detail", args=[run.pk]) + "?tab=rehydration")
    assert RLO not in _outside_form_values(rehydration.content.decode())
    inbox = client.get("/console/").content.decode()
    assert RLO not in inbox


def test_the_raw_json_escapes_invisible_characters_but_keeps_the_value(
    client, sandbox, support_user
):
    run = approval_run(payment=f"pay_{RLO}3")
    client.force_login(support_user)
    raw = client.get(reverse("console:run-raw", args=[run.pk, "input"]))
    assert raw["Content-Type"] == "application/json"
    assert RLO.encode() not in raw.content and b"\\u202e" in raw.content
    assert raw.json()["payment"] == f"pay_{RLO}3"


def test_an_auditor_reads_the_timeline_with_invisible_characters_shown(
    client, sandbox, auditor_user
):
    run = approval_run(payment=f"pay_{RLO}4")
    client.force_login(auditor_user)
    text = client.get(reverse("console:run-timeline", args=[run.pk])).content.decode()
    assert RLO not in text
    # The payload is fetched when its line is opened (issue 33 §1), with the marker shown.
    seq = TimelineEvent.objects.get(run=run, verb="approval.requested").seq
    payload = reverse("console:run-timeline-event", args=[run.pk, seq])
    text = client.get(payload, HTTP_HX_REQUEST="true").content.decode()
    assert RLO not in text and "[U+202E]" in text
    audit = client.get("/console/audit/", {"workflow": "test.refund"}).content.decode()
    assert RLO not in audit


def test_filter_options_show_invisible_characters_in_names(client, support_user, monkeypatch):
    # Workflow and queue names come from agents' registrations and from rules.
    from approvals import console

    name = f"agent.{RLO}fer"
    monkeypatch.setattr(
        console, "filter_choices", lambda: {"queues": [f"q{ZWSP}"], "workflows": [name]}
    )
    client.force_login(support_user)
    for path in ("/console/", "/console/runs/"):
        text = _outside_form_values(client.get(path).content.decode())
        assert ">agent.[U+202E]fer</option>" in text, path
    assert ">q[U+200B]</option>" in client.get("/console/").content.decode()

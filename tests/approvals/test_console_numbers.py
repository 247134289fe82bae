"""Numbers as people read them (issue 33 §4): thousands separators on counts, each currency's
own decimals, durations in hours and minutes rather than seconds."""

from __future__ import annotations

import pytest
from django.template import Context, Template
from django.utils import translation

from approvals.console import amount_of, human_duration
from approvals.models import EscalationRule
from tests.approvals.console_helpers import fast_passwords, visible_text  # noqa: F401

MATCHES = Template(
    "{% load i18n console %}{% blocktranslate count n=c|grouped %}{{ n }} run matches."
    "{% plural %}{{ n }} runs match.{% endblocktranslate %}"
)


def test_counts_have_thousands_separators_and_still_choose_the_plural():
    assert MATCHES.render(Context({"c": 20000})) == "20,000 runs match."
    assert MATCHES.render(Context({"c": 1})) == "1 run matches."
    assert Template("{% load console %}{{ n|grouped }}").render(Context({"n": 11369})) == "11,369"


@pytest.mark.parametrize(
    ("params", "shown"),
    [
        ({"amount": 300000, "currency": "JPY"}, "300,000 <bdi>JPY</bdi>"),
        ({"amount": 240.0, "currency": "USD"}, "240.00 <bdi>USD</bdi>"),
        ({"amount": 1250.5, "currency": "EUR"}, "1,250.50 <bdi>EUR</bdi>"),
        ({"amount": 12.345, "currency": "KWD"}, "12.345 <bdi>KWD</bdi>"),
        # Finer than the currency allows: every digit, since that is what will be sent.
        ({"amount": 1.5, "currency": "JPY"}, "1.5 <bdi>JPY</bdi>"),
    ],
)
def test_amounts_have_their_currencys_decimals(params, shown):
    assert amount_of(params) == shown


def test_durations_read_in_hours_and_minutes():
    assert [human_duration(s) for s in (45, 600, 5400, 14400, 90000)] == [
        "45 s", "10 min", "1 h 30 min", "4 h", "1 d 1 h",
    ]  # fmt: skip
    with translation.override("zh-hans"):
        assert human_duration(14400) == "4 小时"


@pytest.mark.django_db
def test_the_rules_page_shows_windows_and_slas_in_hours(client, admin_user):
    EscalationRule.objects.create(name="Outage: wait", position=1, action="wait", queue="ops",
                                  wait_window_seconds=14400, probe_interval_seconds=30)  # fmt: skip
    client.force_login(admin_user)
    text = visible_text(client.get("/console/rules/"))
    assert "window 4 h, probe every 30 s" in text and "14400 s" not in text

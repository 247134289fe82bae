"""The dashboard's number formats (approvals.metrics_views.Formats) look the locale up once per
page and write every number exactly as Django's number_format does, in every language."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.test import override_settings
from django.utils import formats, translation

from approvals.metrics_views import Formats

VALUES = [0, 0.004, 0.05, 0.1234, 1, 7.25, 9.96, 59.4, 999.5, 1234.5678, 98765432.1, -3.5]


@pytest.mark.parametrize("language", [code for code, _name in settings.LANGUAGES])
@pytest.mark.parametrize("thousands", [False, True])
def test_numbers_are_written_as_django_writes_them(language, thousands):
    with override_settings(USE_THOUSAND_SEPARATOR=thousands), translation.override(language):
        fmt = Formats()
        for value in VALUES:
            for decimal_pos in (None, 0, 1, 2):
                for grouping in (False, True):
                    expected = formats.number_format(value, decimal_pos, force_grouping=grouping)
                    assert fmt.number(value, decimal_pos, grouping) == expected


def test_values_by_unit():
    with translation.override("en"):
        fmt = Formats()
        assert fmt.value(None, "ratio") == "—"
        assert fmt.value(0.5, "ratio") == "50.0 %"
        assert fmt.value(0.0004, "ratio") == "0.04 %"
        assert fmt.value(12345, "count") == "12,345"
        assert fmt.value(250, "ms") == "250 ms"
        assert fmt.value(2500, "ms") == "2.5 s"
        assert fmt.value(90, "s") == "1.5 min"
        assert fmt.value(7200, "s") == "2.0 h"
        assert fmt.value(3 * 86400, "s") == "3.0 d"
    with translation.override("zh-hans"):
        # The unit words are the language's own, looked up when the page's Formats is made.
        assert Formats().units["ms"] == translation.gettext("%(n)s ms")

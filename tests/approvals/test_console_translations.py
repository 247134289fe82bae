"""Simplified Chinese: labels that come from the models (failure classes, risk levels) are
translated, plurals read right in both languages, and the committed .mo is the .po compiled."""

from __future__ import annotations

import ast
import gettext
import re
from pathlib import Path

import pytest
from django.conf import settings

from approvals import actions
from approvals.models import EscalationRule
from tests.approvals.console_helpers import (  # noqa: F401  (fast_passwords is autouse)
    approval_run,
    fast_passwords,
    visible_text,
)

pytestmark = pytest.mark.django_db

ZH = {"HTTP_ACCEPT_LANGUAGE": "zh-Hans"}
CATALOGUE = Path(settings.BASE_DIR) / "locale" / "zh_Hans" / "LC_MESSAGES"


def test_failure_class_chips_and_risk_levels_are_in_chinese(client, admin_user):
    EscalationRule.objects.create(name="Retry fast", position=1, action="retry",
                                  failure_class="transient", risk="high", queue="ops")  # fmt: skip
    client.force_login(admin_user)
    rules = visible_text(client.get("/console/rules/", **ZH))
    assert "持续失败" in rules and "Kept failing" not in rules
    assert "风险 高" in rules
    query = {"tool": "payments.refund", "failure_class": "outage"}
    tester = visible_text(client.get("/console/rules/", query, **ZH))
    assert "失败类别 系统故障" in tester and "取自工具的风险 高" in tester
    tools = client.get("/console/rules/tools/", **ZH).content.decode()
    for english in (">high<", ">medium<", ">low<"):
        assert english not in tools
    assert 'badge--risk-high">高</span>' in tools and 'badge--risk-low">低</span>' in tools


def test_the_approval_risk_badge_is_in_chinese(client, sandbox, support_user):
    run = approval_run()
    client.force_login(support_user)
    text = visible_text(client.get(f"/console/runs/{run.pk}/", **ZH))
    assert "风险：高" in text and "High risk" not in text


def test_one_takeover_reads_right_in_both_languages(client, sandbox, support_user):
    run = approval_run()
    actions.take_over(run.pk, support_user)
    client.force_login(support_user)
    assert "1 takeover in 1 run" in visible_text(client.get("/console/metrics/"))
    assert "1 次运行中接管 1 次" in visible_text(client.get("/console/metrics/", **ZH))


def _po_entries(path: Path) -> dict:
    """msgid (or (msgid, n) for plurals, context-prefixed like gettext) → msgstr, for the
    translated entries that are not fuzzy: what msgfmt puts in the .mo."""
    entries, block = {}, []
    for line in [*path.read_text(encoding="utf-8").splitlines(), ""]:
        if line.strip():
            block.append(line)
            continue
        fields, key, fuzzy = {}, None, False
        for item in block:
            fuzzy = fuzzy or (item.startswith("#,") and "fuzzy" in item)
            match = re.match(r"^(msgctxt|msgid_plural|msgid|msgstr(?:\[\d+\])?) (\".*\")$", item)
            if match:
                key = match.group(1)
                fields[key] = ast.literal_eval(match.group(2))
            elif item.startswith('"') and key:
                fields[key] += ast.literal_eval(item)
        block = []
        msgid = fields.get("msgid")
        if not msgid or fuzzy:
            continue
        if "msgctxt" in fields:
            msgid = f"{fields['msgctxt']}\x04{msgid}"
        if "msgid_plural" in fields:
            for name, value in fields.items():
                if name.startswith("msgstr[") and value:
                    entries[(msgid, int(name[7:-1]))] = value
        elif fields.get("msgstr"):
            entries[msgid] = fields["msgstr"]
    return entries


def test_the_committed_mo_is_the_po_compiled():
    # The .mo is committed (docs/console.md: compilemessages after editing the .po); a .po
    # edited without recompiling would ship English for the new strings.
    with (CATALOGUE / "django.mo").open("rb") as compiled:
        catalogue = gettext.GNUTranslations(compiled)._catalog
    expected = _po_entries(CATALOGUE / "django.po")
    assert len(expected) > 500
    stale = {key: value for key, value in expected.items() if catalogue.get(key) != value}
    assert stale == {}

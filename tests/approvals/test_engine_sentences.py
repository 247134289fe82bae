"""Sentences the engine stores in English are shown in the reader's language (issue 33 §5:
"Compensation finished, but…" and "crm.create may or may not have done this…" stayed English
on zh-Hans pages). The engine writes each one here, so a change to its wording fails this test
rather than falling back to English unnoticed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from django.utils import translation

from approvals.console import engine_text
from runs.engine.compensation import finish_compensation
from runs.engine.ledger import unknown_outcome
from runs.models import Run, SideEffect
from tests.factories import SideEffectFactory


@pytest.mark.parametrize("verification", [None, object()])
def test_an_unknown_outcome_reads_in_chinese(verification):
    tool = SimpleNamespace(name="crm.create", verification=verification)
    effect = SimpleNamespace(idempotency_key="tp-7f3a")
    written = unknown_outcome(tool, effect, "HTTP 500 from crm").error
    assert engine_text(written) == written  # English: as stored
    with translation.override("zh-hans"):
        shown = engine_text(written)
    assert "may or may not" not in shown
    assert "crm.create" in shown and "tp-7f3a" in shown and "HTTP 500 from crm" in shown


@pytest.mark.django_db
def test_compensation_left_to_a_person_reads_in_chinese():
    effect = SideEffectFactory(status=SideEffect.Status.COMMITTED)
    run = effect.run
    Run.objects.filter(pk=run.pk).update(status=Run.Status.COMPENSATING)
    run.refresh_from_db()
    finish_compensation(run)
    run.refresh_from_db()
    assert run.attention_reason.startswith("Compensation finished, but")
    with translation.override("zh-hans"):
        shown = engine_text(run.attention_reason)
    assert "Compensation" not in shown and f"mail.send ({effect.idempotency_key})" in shown


def test_other_text_is_left_as_written():
    assert engine_text("Connection refused") == "Connection refused"
    assert engine_text(None) is None

"""Local decisions over a tool's own metadata: every change is a new row (who, when, why, old →
new), the newest is in force, a clear goes back to the tool's own metadata, and a change that
makes the engine less careful is refused unless confirmed."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, transaction

from approvals.models import MetadataConflict, MetadataLoosened, ToolMetadataOverride
from runs import tools
from tests.approvals.console_helpers import fast_passwords  # noqa: F401  (autouse)
from tests.dbroles import as_owner

pytestmark = pytest.mark.django_db

decide = ToolMetadataOverride.decide


def mail():
    return tools.registered("mail.send")  # side effect, medium, looks up by key, no dedupe


def test_every_change_is_a_row_and_the_newest_is_in_force(admin_user):
    first, changed = decide(mail(), admin_user, "customers complain", risk="high")
    assert changed and first.overrides() == {"risk": "high"}
    assert tools.get("mail.send").risk == "high"
    second, _ = decide(mail(), admin_user, "and it never dedupes", risk="high",
                       dedupes_by_key=False)  # fmt: skip
    assert ToolMetadataOverride.in_force("mail.send") == second
    cleared, changed = decide(mail(), admin_user, "incident over", confirmed=True)
    assert changed and cleared.clears
    assert ToolMetadataOverride.objects.filter(tool="mail.send").count() == 3
    # Back to the tool exactly as its code registered it: the same object, not a copy.
    assert tools.get("mail.send") is tools.registered("mail.send")


def test_each_row_reads_as_old_to_new_on_its_own(admin_user):
    first, _ = decide(mail(), admin_user, "risky", risk="high")
    assert first.tool_metadata == {"risk": "medium", "side_effect": True, "dedupes_by_key": False}
    assert first.before == first.tool_metadata
    assert first.changes == [("risk", "medium", "high")]
    assert (first.changed_by, first.reason, first.loosened) == (admin_user, "risky", [])
    cleared, _ = decide(mail(), admin_user, "fine again", confirmed=True)
    assert cleared.before["risk"] == "high"
    assert cleared.changes == [("risk", "high", "medium")]
    assert cleared.loosened == ["risk"]  # going back down was confirmed


def test_the_same_decision_again_writes_nothing(admin_user):
    decide(mail(), admin_user, "risky", risk="high")
    again, changed = decide(mail(), admin_user, "risky (double click)", risk="high")
    assert not changed and again.reason == "risky"
    none, changed = decide(tools.registered("crm.lookup"), admin_user, "nothing to clear")
    assert (none, changed) == (None, False)
    assert ToolMetadataOverride.objects.count() == 1


def test_a_form_older_than_the_decision_in_force_loses(admin_user, support_user):
    seen = 0  # the form was loaded when mail.send had no decision
    decide(mail(), admin_user, "risky", risk="high", expected=seen)
    with pytest.raises(MetadataConflict) as lost:
        decide(mail(), admin_user, "low after all", risk="low", expected=seen, confirmed=True)
    assert lost.value.current.reason == "risky"
    assert ToolMetadataOverride.objects.count() == 1


@pytest.mark.parametrize(
    ("change", "field"),
    [({"side_effect": False}, "side_effect"),
     ({"dedupes_by_key": True}, "dedupes_by_key"),
     ({"risk": "low"}, "risk")],
)  # fmt: skip
def test_making_the_engine_less_careful_needs_confirming(admin_user, change, field):
    with pytest.raises(MetadataLoosened) as refused:
        decide(mail(), admin_user, "trust me", **change)
    assert refused.value.fields == [field]
    assert not ToolMetadataOverride.objects.exists()
    row, changed = decide(mail(), admin_user, "trust me", confirmed=True, **change)
    assert changed and row.loosened == [field]


def test_more_careful_changes_need_no_confirming(admin_user):
    lookup = tools.registered("crm.lookup")  # a read, low risk
    row, changed = decide(lookup, admin_user, "it writes an audit log", side_effect=True,
                          risk="medium")  # fmt: skip
    assert changed and row.loosened == []
    tickets = tools.registered("tickets.update")  # dedupes by key
    row, changed = decide(tickets, admin_user, "the key is ignored", dedupes_by_key=False)
    assert changed and row.loosened == []
    assert tools.get("tickets.update").dedupes_by_key is False


def test_clearing_a_stricter_decision_is_a_loosening_too(admin_user):
    decide(mail(), admin_user, "risky", risk="high")
    with pytest.raises(MetadataLoosened) as refused:
        decide(mail(), admin_user, "over")
    assert refused.value.fields == ["risk"]
    assert ToolMetadataOverride.in_force("mail.send").risk == "high"


def test_the_history_never_changes(admin_user):
    row, _ = decide(mail(), admin_user, "risky", risk="high")
    for attempt in (
        lambda: ToolMetadataOverride.objects.filter(pk=row.pk).update(risk="low"),
        lambda: ToolMetadataOverride.objects.filter(pk=row.pk).delete(),
    ):
        # As the owner: the application's role may not even try (tests/runs/test_app_role.py).
        with as_owner(), pytest.raises(IntegrityError, match="append-only"), transaction.atomic():
            attempt()
    assert ToolMetadataOverride.objects.get(pk=row.pk).risk == "high"


def test_a_decision_needs_a_reason_and_a_known_risk(admin_user):
    with pytest.raises(ValueError, match="reason"):
        decide(mail(), admin_user, "   ", risk="high")
    with pytest.raises(ValueError, match="risk"):
        decide(mail(), admin_user, "why", risk="extreme")
    with pytest.raises(IntegrityError), transaction.atomic():  # the database says so too
        ToolMetadataOverride.objects.create(tool="mail.send", risk="high", reason=" ",
                                            changed_by=admin_user)  # fmt: skip
    assert not ToolMetadataOverride.objects.exists()

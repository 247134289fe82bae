"""Sealed records (runs/seal.py): every decision, takeover, approval request, settlement of an
unknown outcome, bulk job and item, rule change, tool pause and metadata decision carries a seal
in a hash chain, so an edit made behind the application's back — raw SQL as the owner with the
triggers off, the attack of issue 32 — is named by verify_audit (row, seal seq, columns), in
the database and in an export checked offline. TRUNCATE is refused on every audit table, for
the owner too."""

from __future__ import annotations

import io
import json
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction
from django.db.models import Q

from approvals import actions, bulk, rules
from approvals.models import (
    ApprovalRequest,
    AuditRecord,
    BulkAction,
    BulkActionItem,
    EscalationRule,
    HumanDecision,
    RuleVersion,
    Takeover,
    ToolMetadataOverride,
    ToolPause,
)
from runs import audit, seal, tools
from runs.models import Run, SideEffect, Step, TimelineEvent
from tests.approvals.console_helpers import approval_run, unknown_outcome_run
from tests.dbroles import as_owner

pytestmark = pytest.mark.django_db


@contextmanager
def tampering():
    """Raw SQL as someone with the owner's access who switched every trigger off."""
    with as_owner(), connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")
        try:
            yield cursor
        finally:
            cursor.execute("SET session_replication_role = DEFAULT")


def verify(*args) -> tuple[int, str]:
    out = io.StringIO()
    try:
        call_command("verify_audit", *args, stdout=out, stderr=io.StringIO())
        return 0, out.getvalue()
    except CommandError as exc:
        return exc.returncode, out.getvalue() + str(exc)


def broken(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("BROKEN")]


def seal_seq(obj) -> tuple[str, int]:
    """(chain, seq) of the latest seal of `obj`'s row."""
    label = obj._meta.label_lower
    spec = seal.spec_of(type(obj))
    if spec.run is None:
        entry = AuditRecord.objects.filter(data__model=label, data__id=obj.pk).last()
        return seal.RECORDS, entry.seq
    event = (
        TimelineEvent.objects.filter(verb=seal.SEALED, data__model=label, data__id=obj.pk)
        .order_by("-seq")
        .first()
    )
    return str(event.run_id), event.seq


@pytest.fixture
def story(sandbox, support_user, admin_user):
    """One of each: a bulk job (cancel, by an admin), an approval decided, an unknown outcome
    settled by a person, a takeover begun and ended, a rule changed, a tool paused and resumed,
    a decision over a tool's metadata."""
    cancelled = approval_run(payment="pay_bulk")
    job = bulk.preview(admin_user, "cancel", {"workflow": "test.refund"}, {"comment": "dupe"})
    bulk.start(job, admin_user)
    assert bulk.execute(job.pk) == 1
    job.refresh_from_db()
    assert job.status == "done" and Run.objects.get(pk=cancelled.pk).status == "cancelled"

    refund = approval_run()
    approval = ApprovalRequest.objects.get(run=refund)
    actions.decide_approval(approval.pk, support_user, "approved", comment="within policy")

    lead = unknown_outcome_run(sandbox)
    step = Step.objects.get(run=lead, name="create_contact")
    actions.confirm_outcome(step.pk, support_user, happened=True, proof="crm-proof-1")

    held = approval_run(payment="pay_2")
    actions.take_over(held.pk, support_user)
    actions.release(held.pk, support_user, needed_engineer=False, comment="checked")

    rule = EscalationRule.objects.order_by("position", "id").first()
    rules.set_enabled(rule.pk, not rule.enabled, admin_user)
    rules.pause_tool("mail.send", admin_user, "provider incident")
    rules.resume_tool("mail.send", admin_user)
    ToolMetadataOverride.decide(
        tools.registered("mail.send"), admin_user, "sends to customers", risk="high"
    )
    return {
        "decision": HumanDecision.objects.get(run=refund, verb="approve"),
        "approval": ApprovalRequest.objects.get(pk=approval.pk),
        "settled": SideEffect.objects.get(step=step),
        "takeover": Takeover.objects.get(run=held),
        "item": BulkActionItem.objects.get(bulk_action=job),
        "job": BulkAction.objects.get(pk=job.pk),
        "version": RuleVersion.objects.filter(rule=rule).order_by("-version").first(),
        "rule": EscalationRule.objects.get(pk=rule.pk),
        "pause": ToolPause.objects.get(tool="mail.send"),
        "override": ToolMetadataOverride.objects.get(tool="mail.send"),
        "admin": admin_user,
    }


def test_every_kind_is_sealed_and_verifies(story):
    labels = set(
        TimelineEvent.objects.filter(verb=seal.SEALED).values_list("data__model", flat=True)
    )
    labels |= set(AuditRecord.objects.values_list("data__model", flat=True))
    assert {spec.label for spec in seal.specs()} <= labels
    report = audit.verify_database()
    assert report.ok, report.problems
    assert report.records >= 10 and report.record_entries > 0
    code, out = verify()
    assert code == 0 and out.startswith("OK: ") and "the records chain (" in out, out


# (object, SQL SET clause, the columns verify_audit must name)
EDITS = [
    # issue 32: the decision rewritten as someone else's, with another comment
    ("decision", "comment = 'rubber-stamped', user_id = {admin}", ["user_id", "comment"]),
    (
        "approval",
        "decided_by_id = {admin}, edited_params = '{{\"amount\": 9999}}', conditions = '[]'",
        ["edited_params", "decided_by_id"],
    ),
    (
        "takeover",
        "needed_engineer = true, engineer_note = 'it did'",
        ["engineer_note", "needed_engineer"],
    ),
    ("settled", "confirmed_by = 'tool', receipt = '{{}}'", ["receipt", "confirmed_by"]),
    ("item", "status = 'skipped', reason = 'nobody did this'", ["status", "reason"]),
    ("version", "data = jsonb_set(data, '{{max_attempts}}', '99')", ["data"]),
    ("rule", "approvers_required = 2, queue = 'nobody'", ["queue", "approvers_required"]),
    ("pause", "reason = 'routine', paused_by_id = NULL", ["reason", "paused_by_id"]),
    ("override", "risk = 'low'", ["risk"]),
    ("job", 'params = \'{{"comment": "approved by the board"}}\'', ["params"]),
]


@pytest.mark.parametrize(("name", "change", "columns"), EDITS, ids=[e[0] for e in EDITS])
def test_an_edited_row_is_named_with_its_seal_and_columns(story, name, change, columns):
    obj = story[name]
    chain, seq = seal_seq(obj)
    with tampering() as cursor:
        cursor.execute(
            f"UPDATE {obj._meta.db_table} SET {change.format(admin=story['admin'].pk)} "
            "WHERE id = %s",
            [obj.pk],
        )
    where = "records" if chain == seal.RECORDS else f"run {chain}"
    expected = (
        f"BROKEN {where}: {obj._meta.model_name} {obj.pk} does not match its seal at seq {seq} "
        f"({', '.join(sorted(columns))} changed)"
    )
    code, out = verify()
    assert code == 1 and broken(out) == [expected], out
    if chain != seal.RECORDS:  # the run alone names it too, and so does the run's page
        code, out = verify("--run", chain)
        assert broken(out) == [expected], out
        assert str(audit.verify_run(Run(pk=chain)).problems[0]) in expected


def test_a_bulk_jobs_frozen_set_is_sealed_with_the_job(story):
    job, item = story["job"], story["item"]
    _chain, seq = seal_seq(job)
    with tampering() as cursor:
        cursor.execute(
            "UPDATE approvals_bulkactionitem SET plan = 'cancel every run' WHERE id = %s",
            [item.pk],
        )
    _code, out = verify()
    assert f"BROKEN records: bulkaction {job.pk} does not match its seal at seq {seq} " in out
    assert "(items changed)" in out and f"bulkactionitem {item.pk} does not match" in out


def test_a_row_written_behind_the_verbs_has_no_seal(story):
    decision = story["decision"]
    with tampering() as cursor:
        cursor.execute(
            "INSERT INTO approvals_humandecision (run_id, user_id, verb, shown, proof, comment, "
            "conditions, created_at) SELECT run_id, user_id, 'reject', shown, '', 'forged', "
            "conditions, created_at FROM approvals_humandecision WHERE id = %s RETURNING id",
            [decision.pk],
        )
        forged = cursor.fetchone()[0]
    _code, out = verify()
    assert broken(out) == [
        f"BROKEN run {decision.run_id}: humandecision {forged} has no seal (it was written or "
        "changed outside the verbs that seal it)"
    ], out


def test_a_deleted_row_is_named_by_its_seal(story):
    takeover = story["takeover"]
    chain, seq = seal_seq(takeover)
    with tampering() as cursor:
        cursor.execute("DELETE FROM approvals_takeover WHERE id = %s", [takeover.pk])
    _code, out = verify()
    assert broken(out) == [
        f"BROKEN run {chain}: takeover {takeover.pk} is sealed at seq {seq}, but its row is missing"
    ], out


def test_the_records_chain_is_a_chain_with_a_head(story):
    last = AuditRecord.objects.order_by("-seq").first()
    with tampering() as cursor:
        cursor.execute("DELETE FROM approvals_auditrecord WHERE id = %s", [last.pk])
    _code, out = verify()
    assert broken(out)[0].startswith(f"BROKEN records seq {last.seq}: the chain ends at seq")
    with tampering() as cursor:
        cursor.execute(
            "UPDATE approvals_auditrecord SET data = jsonb_set(data, '{digest}', '\"0\"') "
            "WHERE seq = 2"
        )
    _code, out = verify()
    assert broken(out)[0].startswith("BROKEN records seq 2: data was changed"), out


def test_a_seal_in_the_chain_cannot_be_edited_to_match(story):
    # Re-sealing by hand means editing a chained event: the chain names that event instead.
    decision = story["decision"]
    chain, seq = seal_seq(decision)
    with tampering() as cursor:
        cursor.execute(
            "UPDATE approvals_humandecision SET comment = 'x' WHERE id = %s", [decision.pk]
        )
        spec = seal.spec_of(HumanDecision)
        row = seal.read(spec, HumanDecision, Q(pk=decision.pk))[decision.pk]
        cursor.execute(
            "UPDATE runs_timelineevent SET data = %s WHERE run_id = %s AND seq = %s",
            [json.dumps(seal.seal_data(row)), chain, seq],
        )
    _code, out = verify("--run", chain)
    expected = f"BROKEN run {chain} seq {seq}: data was changed (it no longer matches its "
    assert broken(out) == [expected + "data_digest)"], out


# --------------------------------------------------------------------------------------------
# Exports


def export(tmp_path, *args) -> Path:
    path = tmp_path / "audit.jsonl"
    call_command("export_audit", *args, "--output", str(path), stderr=io.StringIO())
    return path


def lines_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def write(path: Path, lines: list[dict]) -> None:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")


def test_an_export_carries_the_sealed_rows_and_verifies_offline(story, tmp_path, django_db_blocker):
    path = export(tmp_path, "--records")
    lines = lines_of(path)
    records = [line for line in lines if line["type"] == "record"]
    models = {line["model"] for line in records}
    assert {spec.label for spec in seal.specs()} <= models
    assert lines[-1]["records"] == len(records) and lines[-1]["entries"] > 0
    with django_db_blocker.block():
        code, out = verify("--file", str(path))
    assert code == 0 and "the records chain (" in out, out


@pytest.mark.parametrize("doctor", ["edit", "drop", "edit_records_chain"])
def test_a_doctored_record_in_an_export_is_named_offline(
    story, tmp_path, django_db_blocker, doctor
):
    decision, version = story["decision"], story["version"]
    path = export(tmp_path, "--records")
    lines = lines_of(path)

    def find(obj):
        label = obj._meta.label_lower
        return next(
            i
            for i, line in enumerate(lines)
            if line["type"] == "record" and line["model"] == label and line["id"] == obj.pk
        )

    chain, seq = seal_seq(decision)
    if doctor == "edit":
        lines[find(decision)]["content"]["comment"] = "rubber-stamped"
        expected = (
            f"BROKEN run {chain}: humandecision {decision.pk} does not match its seal at seq "
            f"{seq} (comment changed)"
        )
    elif doctor == "drop":
        del lines[find(decision)]
        lines[-1]["records"] -= 1
        expected = (
            f"BROKEN run {chain}: humandecision {decision.pk} is sealed at seq {seq}, but its "
            "row is missing"
        )
    else:
        _chain, seq = seal_seq(version)
        lines[find(version)]["content"]["changed_by_id"] = None
        expected = (
            f"BROKEN records: ruleversion {version.pk} does not match its seal at seq {seq} "
            "(changed_by_id changed)"
        )
    write(path, lines)
    with django_db_blocker.block():
        code, out = verify("--file", str(path))
    assert code == 1 and broken(out) == [expected], out


def test_prune_keeps_the_seals_and_everything_still_verifies(story):
    from datetime import timedelta

    from django.utils import timezone

    finished = Run.objects.filter(status__in=Run.TERMINAL)
    assert finished.exists()
    report = audit.prune_payloads(0, now=timezone.now() + timedelta(days=1))
    assert report.events > 0
    seals = TimelineEvent.objects.filter(run__in=finished, verb=seal.SEALED)
    assert seals.exists() and not seals.filter(pruned=True).exists()
    assert audit.verify_database().ok


# --------------------------------------------------------------------------------------------
# TRUNCATE


AUDIT_TABLES = [
    "runs_run",
    "runs_step",
    "runs_snapshot",
    "runs_sideeffect",
    "runs_timelineevent",
    "approvals_approvalrequest",
    "approvals_takeover",
    "approvals_humandecision",
    "approvals_ruleversion",
    "approvals_toolpause",
    "approvals_toolmetadataoverride",
    "approvals_bulkaction",
    "approvals_bulkactionitem",
    "approvals_auditrecord",
    "approvals_auditrecordhead",
]


@pytest.mark.parametrize("table", AUDIT_TABLES)
def test_truncate_is_refused_even_for_the_owner(table):
    with as_owner(), connection.cursor() as cursor:
        cursor.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
        assert cursor.fetchone() == (True,)  # the suite's owner is a superuser: still refused
        with pytest.raises(DatabaseError) as refused, transaction.atomic():
            cursor.execute(f"TRUNCATE {table} CASCADE")
    assert f"taskpilots: {table} is part of the audit trail" in str(refused.value)
    assert "TRUNCATE refused" in str(refused.value)


def test_every_sealed_table_is_guarded():
    from django.apps import apps

    sealed = {apps.get_model(spec.label)._meta.db_table for spec in seal.specs()}
    sealed.discard("approvals_escalationrule")  # a rule's history is its versions (guarded)
    assert sealed <= set(AUDIT_TABLES)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
            "JOIN pg_proc p ON p.oid = t.tgfoid WHERE p.proname = 'taskpilots_refuse_truncate'"
        )
        guarded = {name for (name,) in cursor.fetchall()}
    assert guarded == set(AUDIT_TABLES)

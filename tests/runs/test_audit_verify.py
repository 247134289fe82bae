"""verify_audit and export_audit: real chains verify; any edit, deletion, insertion or reorder
made behind the ORM's back (raw SQL with the append-only trigger disabled) is named by run and
seq; an export verifies offline, with no database, and a doctored export does not."""

from __future__ import annotations

import io
import json
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from runs import audit
from runs.models import Run, SideEffect, Snapshot, TimelineEvent, chain_hash, digest
from tests.approvals.console_helpers import approval_run, start
from tests.dbroles import as_owner

pytestmark = pytest.mark.django_db


@contextmanager
def trigger_disabled():
    """Tamper like someone with raw database access: the append-only trigger is off (as the
    owner: the application's role may not touch triggers, tests/dbroles.py)."""
    with as_owner(), _trigger_off():
        yield connection.cursor()


@contextmanager
def _trigger_off():
    with connection.cursor() as cursor:
        # Django's foreign keys are deferred; ALTER TABLE refuses while checks are pending.
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute(
            "ALTER TABLE runs_timelineevent DISABLE TRIGGER runs_timelineevent_append_only"
        )
        cursor.execute("ALTER TABLE runs_snapshot DISABLE TRIGGER runs_snapshot_append_only")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(
                "ALTER TABLE runs_timelineevent ENABLE TRIGGER runs_timelineevent_append_only"
            )
            cursor.execute("ALTER TABLE runs_snapshot ENABLE TRIGGER runs_snapshot_append_only")
            cursor.execute("SET CONSTRAINTS ALL DEFERRED")


def verify(*args) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("verify_audit", *args, stdout=out, stderr=err)
        code = 0
    except CommandError as exc:
        code, err = exc.returncode, io.StringIO(err.getvalue() + str(exc))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def runs(sandbox):
    """A finished reply run (side effects, receipts) and a refund waiting for approval."""
    reply = start("test.reply", {"message": "refund?", "email": "a@example.com", "ticket": "T-1"})
    assert reply.status == "succeeded"
    return reply, approval_run()


def test_untouched_chains_verify(runs):
    code, out, _err = verify()
    assert code == 0, out
    assert out.startswith("OK: 2 runs")
    code, out, _err = verify("--run", str(runs[0].pk))
    assert code == 0 and "OK: 1 runs" in out


def _event(run, seq):
    return TimelineEvent.objects.get(run=run, seq=seq)


@pytest.mark.parametrize(
    ("tamper", "seq", "message"),
    [
        ("edit_data", 3, "data was changed"),
        ("edit_actor", 3, "hash does not match"),
        ("edit_time", 2, "hash does not match"),
        ("delete_middle", 3, "event missing"),
        ("delete_last", None, "events were removed from the end"),
        ("insert", 3, "prev_hash does not match"),
        ("reorder", 2, "prev_hash does not match"),
        ("fake_prune", 4, "data was changed"),
    ],
)
def test_tampering_is_named_by_run_and_seq(runs, tamper, seq, message):
    reply = runs[0]
    last = Run.objects.get(pk=reply.pk).event_seq
    with trigger_disabled() as cursor:
        table = "runs_timelineevent"
        if tamper == "edit_data":
            cursor.execute(
                f"UPDATE {table} SET data = jsonb_set(data, '{{step}}', '\"other\"') "
                "WHERE run_id = %s AND seq = 3",
                [reply.pk],
            )
        elif tamper == "edit_actor":
            cursor.execute(
                f"UPDATE {table} SET actor = 'user:mallory' WHERE run_id = %s AND seq = 3",
                [reply.pk],
            )
        elif tamper == "edit_time":
            cursor.execute(
                f"UPDATE {table} SET at = at + interval '1 hour' WHERE run_id = %s AND seq = 2",
                [reply.pk],
            )
        elif tamper == "delete_middle":
            cursor.execute(f"DELETE FROM {table} WHERE run_id = %s AND seq = 3", [reply.pk])
        elif tamper == "delete_last":
            cursor.execute(f"DELETE FROM {table} WHERE run_id = %s AND seq = %s", [reply.pk, last])
        elif tamper == "insert":
            # Make room at seq 3 and insert a plausible event whose own hash is right.
            cursor.execute(
                f"UPDATE {table} SET seq = seq + 1000 WHERE run_id = %s AND seq >= 3", [reply.pk]
            )
            cursor.execute(
                f"UPDATE {table} SET seq = seq - 999 WHERE run_id = %s AND seq > 1000", [reply.pk]
            )
            before = _event(reply, 2)
            data = {"note": "added later"}
            data_digest = digest(data)
            at = before.at
            event_hash = chain_hash(
                3, at.isoformat(), "system", "run.note", data_digest, "not-the-real-prev"
            )
            cursor.execute(
                f"INSERT INTO {table} (run_id, seq, at, actor, verb, data, data_digest, pruned, "
                "prev_hash, hash) VALUES (%s, 3, %s, 'system', 'run.note', %s, %s, false, %s, %s)",
                [reply.pk, at, json.dumps(data), data_digest, "not-the-real-prev", event_hash],
            )
        elif tamper == "reorder":
            for old, new in ((2, 100000), (3, 2), (100000, 3)):  # (run, seq) is unique
                cursor.execute(
                    f"UPDATE {table} SET seq = %s WHERE run_id = %s AND seq = %s",
                    [new, reply.pk, old],
                )
        elif tamper == "fake_prune":
            # Hiding a payload by calling it pruned does not hide it: the data must be the
            # pruned marker, and changing it to that breaks the digest of an unpruned event.
            cursor.execute(
                f"UPDATE {table} SET data = '{{\"pruned\": true}}' WHERE run_id = %s AND seq = 4",
                [reply.pk],
            )
    code, out, _err = verify()
    assert code == 1
    broken = [line for line in out.splitlines() if line.startswith("BROKEN")]
    assert len(broken) == 1, out  # the other run still verifies
    expected = f"BROKEN run {reply.pk}" + (f" seq {seq}:" if seq else "")
    assert broken[0].startswith(expected), broken[0]
    assert message in broken[0]


def test_a_changed_snapshot_is_caught_by_its_recorded_checksum(runs):
    reply = runs[0]
    snapshot = Snapshot.objects.filter(run=reply).order_by("pk").first()
    written = TimelineEvent.objects.get(
        run=reply, verb="snapshot.written", data__snapshot=snapshot.pk
    )
    with trigger_disabled() as cursor:
        cursor.execute(
            'UPDATE runs_snapshot SET params = \'{"to": "mallory@example.com"}\' WHERE id = %s',
            [snapshot.pk],
        )
    code, out, _err = verify("--run", str(reply.pk))
    assert code == 1
    assert f"seq {written.seq}: snapshot {snapshot.pk} content does not match" in out


def test_progress_goes_to_stderr(runs, monkeypatch):
    monkeypatch.setattr(audit.verify, "RUN_BATCH", 1)  # the module that walks the runs
    monkeypatch.setattr(audit.verify, "PROGRESS_EVERY", 1)
    code, _out, err = verify()
    assert code == 0
    assert "… 1 runs" in err and "… 2 runs" in err


def test_a_missing_run_is_an_error(db):
    import uuid

    code, _out, err = verify("--run", str(uuid.uuid4()))
    assert code == 1 and "No run" in err
    code, _out, err = verify("--run", "nope")
    assert code == 1 and "not a run id" in err


# --------------------------------------------------------------------------------------------
# Export, then verify offline


def export(tmp_path, *args) -> str:
    path = tmp_path / "audit.jsonl"
    call_command("export_audit", *args, "--output", str(path), stderr=io.StringIO())
    return str(path)


def test_an_export_verifies_offline_without_a_database(runs, tmp_path, django_db_blocker):
    path = export(tmp_path)
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    header, end = json.loads(lines[0]), json.loads(lines[-1])
    assert header["format"] == "taskpilots-audit" and end["runs"] == 2
    event = next(json.loads(line) for line in lines if '"type": "event"' in line)
    assert set(audit.EVENT_FIELDS) <= set(event)
    with django_db_blocker.block():  # any query would raise
        code, out, _err = verify("--file", path)
    assert code == 0, out
    assert out.startswith("OK: 2 runs")


@pytest.mark.parametrize(
    ("doctor", "message"),
    [
        ("edit", "data was changed"),
        ("drop_event", "event missing"),
        ("drop_last_event", "events were removed from the end"),
        ("truncate", "truncated"),
        ("swap", "prev_hash does not match"),
    ],
)
def test_a_doctored_export_fails(runs, tmp_path, django_db_blocker, doctor, message):
    path = export(tmp_path, "--run", str(runs[0].pk))
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    events = [i for i, line in enumerate(lines) if '"type": "event"' in line]
    if doctor == "edit":
        record = json.loads(lines[events[2]])
        record["data"]["step"] = "other"
        lines[events[2]] = json.dumps(record)
    elif doctor == "drop_event":
        del lines[events[2]]
    elif doctor == "drop_last_event":
        del lines[events[-1]]
    elif doctor == "truncate":
        lines = lines[: events[4]]
    elif doctor == "swap":
        lines[events[1]], lines[events[2]] = lines[events[2]], lines[events[1]]
        for index in (events[1], events[2]):  # renumber so only the chain can tell
            record = json.loads(lines[index])
            record["seq"] = index - events[0] + 1
            lines[index] = json.dumps(record)
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")
    with django_db_blocker.block():
        code, out, err = verify("--file", path)
    assert code == 1
    assert message in out + err


def test_export_filters_and_csv(runs, tmp_path):
    reply, refund = runs
    path = export(tmp_path, "--workflow", "test.refund")
    text = Path(path).read_text(encoding="utf-8")
    assert str(refund.pk) in text and str(reply.pk) not in text
    csv_path = tmp_path / "audit.csv"
    call_command("export_audit", "--run", str(reply.pk), "--format", "csv", "-o", str(csv_path),
                 stderr=io.StringIO())  # fmt: skip
    rows = csv_path.read_text(encoding="utf-8").splitlines()
    assert rows[0].startswith("run,workflow,seq,at,actor,verb,data")
    # A CSV is for people: verifying one says so, rather than reporting a broken chain.
    code, out, err = verify("--file", str(csv_path))
    assert code != 0 and "this is a CSV export" in out + err and "jsonl" in out + err
    assert rows[0].endswith(",hash,external_id")
    assert len(rows) == 1 + TimelineEvent.objects.filter(run=reply).count()
    import csv

    committed = [r for r in csv.DictReader(io.StringIO("\n".join(rows)))
                 if r["verb"] == "side_effect.committed"]  # fmt: skip
    effects = SideEffect.objects.filter(run=reply, status="committed")
    assert sorted(r["external_id"] for r in committed) == sorted(e.external_id for e in effects)
    assert all(r["external_id"] for r in committed)


def test_invisible_characters_are_escaped_in_exports_and_the_chain_still_verifies(
    sandbox, tmp_path, django_db_blocker
):
    # An auditor opens exports in editors, terminals and spreadsheets, where U+202E would
    # reorder what they read. JSON Lines writes it as \u202e (the same value, so the chain
    # verifies); CSV text shows a marker; the CSV's JSON cell still parses to the exact data.
    import csv

    from approvals import actions
    from runs.models import digest
    from tests.factories import UserFactory

    rlo, zwsp = "\u202e", "\u200b"
    run = start("test.refund", {"amount": 150, "payment": "pay_1"},
                business_key=f"bk-{rlo}gpj.exe{zwsp}")  # fmt: skip
    person = UserFactory(username=f"{rlo}=mei", groups=["support"])
    actions.take_over(run.pk, person)
    path = export(tmp_path, "--run", str(run.pk))
    text = Path(path).read_text(encoding="utf-8")
    assert rlo not in text and zwsp not in text
    assert '"business_key": "bk-\\u202egpj.exe\\u200b"' in text
    events = [json.loads(line) for line in text.splitlines() if '"type": "event"' in line]
    stored = {e.seq: e for e in TimelineEvent.objects.filter(run=run)}
    assert all(event["data"] == stored[event["seq"]].data for event in events)
    assert any(event["actor"] == f"user:{rlo}=mei" for event in events)
    with django_db_blocker.block():
        code, out, _err = verify("--file", path)
    assert code == 0, out

    csv_path = tmp_path / "audit.csv"
    call_command("export_audit", "--run", str(run.pk), "--format", "csv", "-o", str(csv_path),
                 stderr=io.StringIO())  # fmt: skip
    content = csv_path.read_text(encoding="utf-8")
    assert rlo not in content and zwsp not in content
    rows = list(csv.DictReader(io.StringIO(content)))
    assert any(row["actor"] == "user:[U+202E]=mei" for row in rows)
    for row in rows:
        data = json.loads(row["data"])
        assert data == stored[int(row["seq"])].data
        assert digest(data) == row["data_digest"]  # verifiable from the CSV cell too


@pytest.mark.parametrize(
    ("at", "actor", "verb", "prev"),
    [
        ("2026-12-01T20:00:00.123456+00:00", "system", "step.succeeded", "ab" * 32),
        ("2026-12-01T20:00:00+00:00", 'user:a"b\\c', "run.note", ""),
        ("2026-12-01T20:00:00+00:00", "api:société\u2028x", "approval.décidé", "0" * 64),
        # A time or hash holding what JSON escapes (an edited export) is encoded, not spliced.
        ('2026-12-01T20:00:00+00:00","system', "x", "y", "z"),
        ("t", "x", "y", 'evil"]'),
    ],
)
def test_the_chain_hash_hashes_the_canonical_json_of_its_fields(at, actor, verb, prev):
    # chain_hash builds the JSON itself on the hot path; it must be canonical_json's bytes.
    import hashlib

    from runs.models import canonical_json

    expected = hashlib.sha256(
        canonical_json([7, at, actor, verb, "d" * 64, prev]).encode()
    ).hexdigest()
    assert chain_hash(7, at, actor, verb, "d" * 64, prev) == expected

"""Principle 5: every state change writes its timeline event in the same transaction.

Two tests guard it, because each catches what the other cannot:

1. `test_only_the_transition_methods_write_status` reads the source (AST) of every module
   under runs/, approvals/ and taskpilots/ and lists each place that could write the `status`
   of a Run, Step or SideEffect without going through `Run/Step/SideEffect.transition` (which
   append their event in the same atomic block): `.update(status=...)` or `.update(**fields)`
   on those models, `create/bulk_create/bulk_update/...` with a status, `x.status = ...`
   assignments, model constructors with a status, and raw SQL that updates or inserts those
   tables. Each such place must be in ALLOWED with the reason it is safe. A new code path
   that writes status fails this test until someone explains it — or routes it through a
   transition. The allowlist cannot go stale: an entry nothing matches fails too.

2. `test_every_status_change_has_its_event_in_the_same_transaction` watches the database
   itself: temporary triggers log every INSERT and every status change of runs_run,
   runs_step and runs_sideeffect, and every timeline event, each with its transaction id.
   The engine and the console actions are then driven through every route the tests know
   (success, retries, outages, unknown outcomes settled by lookup or by a person, approvals,
   edits, rejection with compensation, skip, done by hand, takeover, cancel, timers, events,
   a crashed worker's lease, dynamic agent steps, a failing rule). Every logged change must
   have an event of the same transaction that names the row and says from → to exactly as
   the row changed — and every event that claims a from → to must match a real change.
   This catches a forgotten event, an event written in a separate transaction (one could
   commit without the other), and an event whose "from" was read from a stale object.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
from collections import defaultdict
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from tests.dbroles import as_owner

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("runs", "approvals", "taskpilots")
MODEL = re.compile(r"^(Run|Step|SideEffect|Wait|ApprovalRequest|Takeover)(Model)?$")
# The column that holds each model's state (a takeover is open until it has ended_at).
STATE_FIELDS = {"status", "ended_at"}
RELATED = {"steps", "side_effects"}  # run.steps / run.side_effects managers
WRITE_METHODS = {"update", "create", "bulk_create", "bulk_update", "update_or_create",
                 "get_or_create"}  # fmt: skip
RAW_SQL = re.compile(
    r"\b(UPDATE|INSERT\s+INTO)\s+(runs_(run|step|sideeffect|wait)|approvals_(approvalrequest|"
    r"takeover))\b",
    re.I,
)

# (file, enclosing function) → why writing status there cannot lose an event.
ALLOWED = {
    ("runs/models/run.py", "Run._move"): "the transition itself: event in the same atomic",
    ("runs/models/step.py", "Step._move"): "the transition itself: event in the same atomic",
    ("runs/models/ledger.py", "SideEffect._move"): (
        "the transition itself: event in the same atomic"
    ),
    ("runs/models/step.py", "Wait._move"): "the transition itself: event in the same atomic",
    ("approvals/models/requests.py", "ApprovalRequest._move"): (
        "the transition itself: event in the same atomic"
    ),
    (
        "approvals/models/requests.py",
        "Takeover.end",
    ): "ends the takeover with takeover.ended beside it",
    ("runs/models/run.py", "Run.count_failure"): (
        "UPDATE(**updates) holds only failure_count and escalation_level"
    ),
    ("runs/models/step.py", "Step.reclaim"): (
        "the lease-reclaim UPDATE(**fields) holds only the lease (attempts, owner, expiry); the "
        "status stays running and step.lease_reclaimed is appended with it"
    ),
    ("runs/engine/claim.py", "new_step"): (
        "builds the unsaved row of a step created already running (one INSERT instead of "
        "INSERT + claim); Step.open writes it with step.started, in the caller's transaction "
        "or into a batch's one statement"
    ),
    ("runs/statements.py", "<module>"): (
        "the engine's hand-written statements: APPEND_EVENT, the timeline append itself (its "
        "UPDATE runs_run moves only the chain head); CREATE_RUN, a new run's row (pending, its "
        "default status) inserted by the same statement as its run.created event; "
        "TAKE_BACK_STALE / TAKE_BACK_PREVIOUS, which move only lease_expires_at (no status "
        "change; the claim that reclaims the step writes step.lease_reclaimed)"
    ),
    ("runs/statements.py", "run_change"): (
        "the run's row in a batch: the chain head, and the changes Run._move describes into "
        "the batch, which adds their events to the same statement"
    ),
    ("taskpilots/evidence/loadgen.py", "*"): (
        "synthetic history for the metrics benchmarks: builds whole finished runs together "
        "with their timelines in bulk, never touches a live run"
    ),
}


def _root_and_chain(node: ast.AST) -> tuple[str, list[str]]:
    chain = []
    while True:
        if isinstance(node, ast.Attribute):
            chain.append(node.attr)
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Subscript):
            node = node.value
        else:
            return (node.id if isinstance(node, ast.Name) else ""), chain


class _Finder(ast.NodeVisitor):
    """Collects possible status writes per enclosing function. A `x.status = …` counts only
    where the same function also saves (x.save(), bulk_create/bulk_update): elsewhere it is an
    in-memory object (HTTP responses, tool results, the transition methods' own setattr)."""

    def __init__(self):
        self.scope: list[str] = []
        self.found: list[tuple[str, int, str]] = []
        self.assigned: dict[str, list[int]] = defaultdict(list)
        self.saves: set[str] = set()

    def finish(self) -> list[tuple[str, int, str]]:
        for scope, lines in self.assigned.items():
            if scope in self.saves:
                self.found.extend((scope, line, "….status = … then save") for line in lines)
        return self.found

    def _hit(self, node, what):
        self.found.append((".".join(self.scope) or "<module>", node.lineno, what))

    def _scoped(self, node):
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scoped

    def visit_Call(self, node):
        func = node.func
        keywords = {k.arg for k in node.keywords}
        if isinstance(func, ast.Attribute) and func.attr in ("save", "bulk_create", "bulk_update"):
            self.saves.add(".".join(self.scope) or "<module>")
        if isinstance(func, ast.Attribute) and func.attr in WRITE_METHODS:
            root, chain = _root_and_chain(func.value)
            if root == "cls" and any(MODEL.match(name) for name in self.scope):
                root = next(name for name in self.scope if MODEL.match(name))
            if MODEL.match(root) or RELATED & set(chain):
                if STATE_FIELDS & keywords or func.attr.startswith("bulk_"):
                    self._hit(node, f"{root}….{func.attr}(status=…)")
                elif None in keywords and func.attr in ("update", "update_or_create"):
                    self._hit(node, f"{root}….{func.attr}(**…)")
        if isinstance(func, ast.Name) and MODEL.match(func.id) and STATE_FIELDS & keywords:
            self._hit(node, f"{func.id}(status=…)")
        if (  # runs.models.new_row(Step, status=…): a constructor by another name
            isinstance(func, ast.Name)
            and func.id == "new_row"
            and node.args
            and isinstance(node.args[0], ast.Name)
            and MODEL.match(node.args[0].id)
            and STATE_FIELDS & keywords
        ):
            self._hit(node, f"new_row({node.args[0].id}, status=…)")
        self.generic_visit(node)

    def visit_Assign(self, node):
        for target in node.targets:
            elements = target.elts if isinstance(target, ast.Tuple) else [target]
            for element in elements:
                if isinstance(element, ast.Attribute) and element.attr in STATE_FIELDS:
                    self.assigned[".".join(self.scope) or "<module>"].append(node.lineno)
        self.generic_visit(node)

    def visit_Constant(self, node):
        if isinstance(node.value, str) and RAW_SQL.search(node.value):
            self._hit(node, "raw SQL")


def status_writes() -> dict[tuple[str, str], list[str]]:
    found: dict[tuple[str, str], list[str]] = defaultdict(list)
    for package in SCANNED:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if "/migrations/" in relative:
                continue  # schema history, not a code path that runs against live runs
            finder = _Finder()
            finder.visit(ast.parse(path.read_text(encoding="utf-8"), relative))
            for scope, line, what in finder.finish():
                found[(relative, scope)].append(f"{relative}:{line} {what}")
    return found


def test_only_the_transition_methods_write_status():
    found = status_writes()
    whole_files = {path for path, scope in ALLOWED if scope == "*"}
    unexplained = [
        where
        for key, wheres in found.items()
        if key not in ALLOWED and key[0] not in whole_files
        for where in wheres
    ]
    assert not unexplained, (
        "These write the state of a Run/Step/SideEffect/Wait/ApprovalRequest/Takeover outside "
        "the model verbs; route them through a verb (which records the event) or add them to "
        "ALLOWED with the reason no event can be lost:\n" + "\n".join(unexplained)
    )
    stale = [
        key
        for key in ALLOWED
        if (ROOT / key[0]).exists()
        and (key not in found if key[1] != "*" else not any(k[0] == key[0] for k in found))
    ]
    assert not stale, f"ALLOWED entries that match nothing any more: {stale}"


def test_the_scanner_sees_the_forms_it_must_refuse(tmp_path):
    # The scanner itself is tested, so a silent miss cannot make the test above vacuous.
    source = """
def sneaky(run, step, effect, sql):
    Step.objects.filter(pk=step.pk).update(status="failed")
    run.side_effects.filter(pk=1).update(status="committed")
    Run.objects.filter(pk=run.pk).update(**{"status": "failed"})
    effect.status = "committed"
    effect.save()
    Step(status="running")
    new_row(Step, status="running")
    sql.execute("UPDATE runs_run SET status = 'failed'")
"""
    finder = _Finder()
    finder.visit(ast.parse(source))
    assert len(finder.finish()) == 7, finder.found


# --------------------------------------------------------------------------------------------
# The database's view: every status change against the events of its transaction

LOG_SQL = """
CREATE TABLE audit_test_log (
    id bigserial PRIMARY KEY,
    xid xid8 NOT NULL DEFAULT pg_current_xact_id(),
    tbl text NOT NULL, op text NOT NULL, old_status text, new_status text, row_data jsonb
);
CREATE FUNCTION audit_test_log_change() RETURNS trigger AS $$
DECLARE
  new_state text;
  old_state text;
BEGIN
  IF TG_TABLE_NAME = 'runs_timelineevent' THEN
    INSERT INTO audit_test_log (tbl, op, row_data) VALUES (TG_TABLE_NAME, TG_OP, to_jsonb(NEW));
    RETURN NULL;
  END IF;
  -- A takeover's state is whether it has ended; every other table has a status column.
  IF TG_TABLE_NAME = 'approvals_takeover' THEN
    new_state := CASE WHEN NEW.ended_at IS NULL THEN 'open' ELSE 'ended' END;
    IF TG_OP = 'UPDATE' THEN
      old_state := CASE WHEN OLD.ended_at IS NULL THEN 'open' ELSE 'ended' END;
    END IF;
  ELSE
    new_state := to_jsonb(NEW)->>'status';
    IF TG_OP = 'UPDATE' THEN old_state := to_jsonb(OLD)->>'status'; END IF;
  END IF;
  IF TG_OP = 'INSERT' OR new_state IS DISTINCT FROM old_state THEN
    INSERT INTO audit_test_log (tbl, op, old_status, new_status, row_data)
    VALUES (TG_TABLE_NAME, TG_OP, old_state, new_state, to_jsonb(NEW));
  END IF;
  RETURN NULL;
END $$ LANGUAGE plpgsql;
"""
WATCHED = [
    "runs_run",
    "runs_step",
    "runs_sideeffect",
    "runs_wait",
    "approvals_approvalrequest",
    "approvals_takeover",
    "runs_timelineevent",
]


@pytest.fixture
def change_log(transactional_db):
    # Triggers and the log table are the owner's to make (tests/dbroles.py); the application's
    # role writes the log through them.
    with as_owner(), connection.cursor() as cursor:
        cursor.execute(LOG_SQL)
        for table in WATCHED:
            cursor.execute(
                f"CREATE TRIGGER audit_test_log AFTER INSERT OR UPDATE ON {table} "
                "FOR EACH ROW EXECUTE FUNCTION audit_test_log_change()"
            )
    try:
        yield _read_log
    finally:
        with as_owner(), connection.cursor() as cursor:
            for table in WATCHED:
                cursor.execute(f"DROP TRIGGER IF EXISTS audit_test_log ON {table}")
            cursor.execute("DROP FUNCTION IF EXISTS audit_test_log_change() CASCADE")
            cursor.execute("DROP TABLE IF EXISTS audit_test_log")


def _read_log():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT xid::text, tbl, op, old_status, new_status, row_data FROM audit_test_log "
            "ORDER BY id"
        )
        return [(*row[:5], json.loads(row[5]) if isinstance(row[5], str) else row[5])
                for row in cursor.fetchall()]  # fmt: skip


# Which row an event speaks for, by the keys its data carries (in this order of precedence):
# a takeover, a wait, a ledger row, an approval request (its own verbs), a step, else the run.
SUBJECTS = {
    "approvals_takeover": "takeover",
    "runs_wait": "wait",
    "runs_sideeffect": "key",
    "approvals_approvalrequest": "approval",
    "runs_step": "step",
    "runs_run": None,
}


def _subject(verb: str, data: dict) -> str:
    if "takeover" in data:
        return "approvals_takeover"
    if "wait" in data and verb.startswith("wait."):
        return "runs_wait"
    if "key" in data and verb.startswith("side_effect."):
        return "runs_sideeffect"
    if "approval" in data and verb.startswith("approval.") and verb != "approval.requested":
        return "approvals_approvalrequest"
    return "runs_step" if "step" in data else "runs_run"


def _names_row(table: str, row: dict, data: dict) -> bool:
    if table == "runs_step":
        if data.get("step") != row["name"]:
            return False
        return "iteration" not in data or data["iteration"] == row["iteration"]
    if table == "runs_sideeffect":
        return data.get("key") == row["idempotency_key"]
    if table in ("runs_wait", "approvals_approvalrequest", "approvals_takeover"):
        return data.get(SUBJECTS[table]) == row["id"]
    return True


def _birth_event(table: str, row: dict, verb: str, data: dict) -> bool:
    """The event that records a row created in a given state."""
    if table == "runs_run":
        return verb == "run.created"
    if table == "runs_step":
        if row["status"] == "running":
            return verb == "step.started" and _names_row(table, row, data)
        return data.get("step") == row["name"]  # e.g. compensation.planned for a pending step
    if table == "approvals_approvalrequest":
        return verb == "approval.requested" and data.get("approval") == row["id"]
    if table == "runs_wait":
        return verb == "wait.opened" and _names_row(table, row, data)
    if table == "approvals_takeover":
        return verb == "takeover.started" and _names_row(table, row, data)
    return verb == "side_effect.intended" and _names_row(table, row, data)


def _chain(events: list[dict], old, new) -> list[dict]:
    """Events of one transaction, in order, that take a row from `old` to `new` step by step;
    [] when they do not."""
    state, chain = old, []
    for event in sorted(events, key=lambda e: e["seq"]):
        if event["data"].get("from") == state and "to" in event["data"]:
            state = event["data"]["to"]
            chain.append(event)
            if state == new:
                return chain
    return []


def check_log(rows) -> tuple[list[str], list[str], set[tuple[str, str]]]:
    events = defaultdict(list)  # (xid, run id) → events of that transaction
    for xid, table, _op, _old, _new, row in rows:
        if table == "runs_timelineevent":
            data = row["data"] if isinstance(row["data"], dict) else {}
            events[(xid, str(row["run_id"]))].append({**row, "data": data, "matched": False})
    missing, seen = [], set()
    for xid, table, op, old, new, row in rows:
        if table == "runs_timelineevent":
            continue
        run_id = str(row["id"] if table == "runs_run" else row["run_id"])
        seen.add((table, new))
        candidates = events[(xid, run_id)]
        if op == "INSERT":
            ok = [e for e in candidates if _birth_event(table, row, e["verb"], e["data"])]
        else:
            about = [
                e
                for e in candidates
                if _names_row(table, row, e["data"]) and _subject(e["verb"], e["data"]) == table
            ]
            ok = [e for e in about if e["data"].get("from") == old and e["data"].get("to") == new]
            # One statement may make two transitions of a row (the hot path starts a run and
            # finishes it when every step was done ahead): then the events chain old → new.
            ok = ok or _chain(about, old, new)
        if not ok:
            ident = row.get("name") or row.get("idempotency_key") or row["id"]
            missing.append(f"{table} {op} {ident}: {old} → {new} (run {run_id}) has no event")
        for event in ok:
            event["matched"] = True
    unbacked = [
        f"run {key[1]} #{e['seq']} {e['verb']} says {e['data']['from']} → {e['data']['to']}"
        for key, evs in events.items()
        for e in evs
        if "from" in e["data"] and "to" in e["data"] and not e["matched"]
    ]
    return missing, unbacked, seen


def test_the_checker_notices_a_change_without_its_event(change_log, sandbox):
    # A status written behind the transition's back (as a forgotten event would be).
    from runs.models import Run
    from tests.approvals.console_helpers import approval_run

    run = approval_run()
    Run.objects.filter(pk=run.pk).update(status="failed")
    missing, _unbacked, _seen = check_log(change_log())
    assert missing == [
        f"runs_run UPDATE {run.pk}: needs_human → failed (run {run.pk}) has no event"
    ]


def test_the_checker_notices_a_wait_or_approval_settled_without_its_event(change_log, sandbox):
    # A cancelled wait or approval once left nothing for the auditor.
    from approvals.models import ApprovalRequest
    from runs.models import Wait
    from tests.approvals.console_helpers import approval_run

    run = approval_run()
    Wait.objects.filter(run=run).update(status="cancelled")
    ApprovalRequest.objects.filter(run=run).update(status="cancelled")
    missing, _unbacked, _seen = check_log(change_log())
    assert [line.split(" ")[0] for line in missing] == ["runs_wait", "approvals_approvalrequest"]


def _ensure_default_rules():
    # A transactional test may follow another one that flushed the migrations' data.
    from approvals.models import EscalationRule

    seeded = importlib.import_module("approvals.migrations.0002_groups_and_default_rules")
    for rule in seeded.DEFAULT_RULES:
        EscalationRule.objects.get_or_create(name=rule["name"], defaults=rule)


def test_every_status_change_has_its_event_in_the_same_transaction(change_log, sandbox):
    from approvals import actions
    from approvals.models import ApprovalRequest
    from runs import engine
    from runs.models import Run, SideEffect, Step
    from tests.approvals.console_helpers import start
    from tests.factories import EscalationRuleFactory, UserFactory

    _ensure_default_rules()
    person = UserFactory(username="audit-support", groups=["support"])
    reply = {"message": "Where is my refund?", "email": "ann@example.com", "ticket": "T-1"}
    lead = {"email": "lee@example.com", "name": "Lee"}
    later = timezone.now

    def drive(run):
        return engine.run_until_quiet(run.pk)

    def make_due(run):
        past = timezone.now() - timedelta(hours=1)
        Step.objects.filter(run=run, status__in=["retry_scheduled", "waiting"]).update(
            next_attempt_at=past
        )
        SideEffect.objects.filter(run=run).update(attempted_at=past)

    def approval_of(run):
        return ApprovalRequest.objects.get(run=run, status="pending")

    def parked(run):
        return Step.objects.get(run=run, status="unknown_outcome")

    start("test.reply", reply)  # every step kind, two side effects
    start("test.branch", {"n": 20})
    start("test.agent", {"mails": 2})  # dynamic steps
    # retries, then success
    sandbox.inject("mail", "429", action="send", count=1)
    run = start("test.reply", reply)
    make_due(run)
    drive(run)
    # an outage: wait, probe, recover
    sandbox.inject("mail", "outage", seconds=600)
    run = start("test.reply", reply)
    sandbox.clear_faults()
    engine.sweep(now=later() + timedelta(seconds=31))
    drive(run)
    # half-success settled by lookup; a lost request resent with the same key
    sandbox.inject("mail", "commit_then_500", action="send")
    start("test.reply", reply)
    sandbox.inject("mail", "timeout_before_commit", action="send", seconds=3)
    run = start("test.reply", reply)
    make_due(run)
    drive(run)
    # unknown outcomes settled by a person, both ways
    for happened in (True, False):
        sandbox.inject("crm", "commit_then_500" if happened else "timeout_before_commit",
                       action="create", seconds=3)  # fmt: skip
        run = start("test.lead", lead)
        actions.confirm_outcome(parked(run).pk, person, happened=happened, proof="crm_1")
        drive(run)
    # approvals: approve, approve with edits, reject; takeover and release; cancel
    run = start(*("test.refund", {"amount": 150, "payment": "pay_1"}))
    actions.decide_approval(approval_of(run).pk, person, "approved")
    drive(run)
    run = start("test.refund", {"amount": 150, "payment": "pay_2"})
    actions.decide_approval(approval_of(run).pk, person, "approved_with_edits",
                            edited_params={"payment_id": "pay_2", "amount": 99.5})  # fmt: skip
    drive(run)
    run = start("test.refund", {"amount": 150, "payment": "pay_3"})
    actions.decide_approval(approval_of(run).pk, person, "rejected", comment="no")
    run = start("test.refund", {"amount": 150, "payment": "pay_4"})
    actions.take_over(run.pk, person)
    actions.release(run.pk, person, needed_engineer=False)
    actions.take_over(run.pk, person)
    actions.cancel_run(run.pk, person, reason="customer withdrew")
    # invalid data: edit and retry, retry, skip, done by hand
    for act in ("edit", "retry", "skip", "complete"):
        run = start("test.reply", {**reply, "ticket": ""})
        if act == "edit":
            actions.retry_with_edits(run.pk, person, {"ticket_id": "T-1", "status": "solved"})
        elif act == "retry":
            actions.retry_step(run.pk, person)
        elif act == "skip":
            actions.skip_step(run.pk, person, reason="closed by phone")
        else:
            actions.complete_by_hand(run.pk, person, result={"id": "T-1"})
        drive(run)
    # timers and awaited events; a wait that times out into compensation
    run = start("test.timer", {})
    engine.sweep(now=later() + timedelta(minutes=6))
    drive(run)
    run = start("test.refund", {"amount": 20, "payment": "pay_5"})
    refund_id = SideEffect.objects.get(run=run).external_id
    engine.deliver_event("evt-audit-1", "payment.settled", refund_id, {"ok": True})
    drive(run)
    EscalationRuleFactory(position=1, workflow="test.refund", step="settlement",
                          failure_class="timeout", action="compensate")  # fmt: skip
    run = start("test.refund", {"amount": 30, "payment": "pay_6"})
    engine.sweep(now=later() + timedelta(hours=2))
    drive(run)
    # a crashed worker's lease is taken back
    run, _ = engine.start_run("test.reply", reply)
    claim = engine.claim_next(run.pk, worker="doomed")
    Step.objects.filter(pk=claim.step.pk).update(lease_expires_at=later() - timedelta(seconds=1))
    drive(run)
    # a rule that fails the run
    EscalationRuleFactory(position=2, failure_class="invalid_input", action="fail")
    start("test.reply", {**reply, "ticket": ""})
    # an approval nobody decides in time: the SLA rule fails it (request and wait expire)
    EscalationRuleFactory(position=3, workflow="test.refund", failure_class="timeout",
                          action="fail")  # fmt: skip
    run = start("test.refund", {"amount": 150, "payment": "pay_7"})
    Run.objects.filter(pk=run.pk).update(attention_due_at=later() - timedelta(minutes=1))
    engine.sweep()

    missing, unbacked, seen = check_log(change_log())
    assert not missing, "\n".join(missing)
    assert not unbacked, "\n".join(unbacked)
    # The drive really went through the state machines (so this test cannot pass vacuously).
    reached = {status for table, status in seen}
    for status in ("running", "waiting", "needs_human", "taken_over", "compensating",
                   "succeeded", "failed", "cancelled", "compensated", "retry_scheduled",
                   "unknown_outcome", "skipped", "pending", "committed", "unknown",
                   "not_committed", "intended"):  # fmt: skip
        assert status in reached, f"no change to {status!r} was driven"
    tables = defaultdict(set)
    for table, status in seen:
        tables[table].add(status)
    assert {"pending", "resolved", "expired", "cancelled"} <= tables["runs_wait"]
    assert {"pending", "decided", "expired", "cancelled"} <= tables["approvals_approvalrequest"]
    assert {"open", "ended"} <= tables["approvals_takeover"]
    assert Run.objects.count() >= 20

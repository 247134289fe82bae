"""Reconciliation by verification: a tool that cannot be asked by key and does not dedupe says,
with a read, whether a call's effect is there. The receiving side here is an in-process store
whose writes are counted; the engine is stepped by hand (DISPATCH "none")."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.utils import timezone

from runs import engine, tools, workflows
from runs.engine import calls, ledger
from runs.models import FailureClass, Run, SideEffect, Snapshot, Step, TimelineEvent
from runs.tools import ToolError, Verification, python_tool
from runs.verbs import Verb
from runs.workflows import Workflow, side_effect

pytestmark = pytest.mark.django_db


class Store:
    """The receiving side: files by path, and a commit log; every write counted."""

    def __init__(self) -> None:
        self.files: dict[str, str] = {}
        self.log: list[dict] = []
        self.writes = 0
        self.fail: str = ""  # "after" (the write lands, the answer is lost), "before", "read"
        self.lock = threading.Lock()

    def write(self, params: dict, ctx) -> dict:
        if self.fail == "before":
            raise ToolError(FailureClass.UNKNOWN_OUTCOME, "the connection broke before sending")
        if self.fail == "refuse":  # an answer: the system processed the call and did nothing
            raise ToolError(FailureClass.UNKNOWN_OUTCOME, "parent folder missing", answered=True)
        with self.lock:
            self.writes += 1
            self.files[params["path"]] = params["content"]
        if self.fail == "after":
            raise ToolError(FailureClass.UNKNOWN_OUTCOME, "no answer after sending")
        return {"path": params["path"]}

    def commit(self, params: dict, ctx) -> dict:
        with self.lock:
            self.writes += 1
            entry = {"hash": f"c{len(self.log) + 1:04d}", "message": params["message"]}
            self.log.append(entry)
        if self.fail == "after":
            raise ToolError(FailureClass.UNKNOWN_OUTCOME, "no answer after sending")
        return entry

    def read_file(self, params: dict, ctx):
        if self.fail == "read":
            raise ToolError(FailureClass.OUTAGE, "the store cannot be read")
        return {"content": self.files.get(params["path"])}

    def read_log(self, params: dict, ctx):
        if self.fail == "read":
            raise ToolError(FailureClass.OUTAGE, "the store cannot be read")
        return list(self.log)


STORE = Store()


def _file_there(params, observed, baseline):
    if observed.get("content") is None:
        return False
    return observed["content"] == params["content"]


def _new_commit(params, observed, baseline):
    new = observed[len(baseline) :]
    return any(entry["message"] == params["message"] for entry in new)


def _new_commit_hash(params, observed, baseline):
    new = observed[len(baseline) :]
    return next(e["hash"] for e in new if e["message"] == params["message"])


tools.register(
    python_tool(
        "test.verified_write",
        lambda p, c: STORE.write(p, c),
        side_effect=True,
        target=lambda p: f"file:{p['path']}",
        settle_seconds=5,
        verification=Verification(
            read=lambda p, c: STORE.read_file(p, c),
            recognise=_file_there,
            external_id=lambda p, o, b: f"{p['path']}@{len(o['content'])}",
            description="read the file",
        ),
    ),
    replace=True,
)
tools.register(
    python_tool(
        "test.verified_commit",
        lambda p, c: STORE.commit(p, c),
        side_effect=True,
        target=lambda p: "repo",
        settle_seconds=5,
        external_id=lambda value: value["hash"],
        verification=Verification(
            read=lambda p, c: STORE.read_log(p, c),
            baseline=lambda p, c: STORE.read_log(p, c),
            recognise=_new_commit,
            external_id=_new_commit_hash,
            description="list the commits",
        ),
    ),
    replace=True,
)
tools.register(
    python_tool(
        "test.undecidable_write",
        lambda p, c: STORE.write(p, c),
        side_effect=True,
        target=lambda p: f"file:{p['path']}",
        verification=Verification(
            read=lambda p, c: STORE.read_file(p, c), recognise=lambda p, o, b: None
        ),
    ),
    replace=True,
)
for name, tool, params in (
    ("test.verify_write", "test.verified_write", lambda ctx: dict(ctx.input)),
    ("test.verify_commit", "test.verified_commit", lambda ctx: dict(ctx.input)),
    ("test.verify_undecidable", "test.undecidable_write", lambda ctx: dict(ctx.input)),
):
    workflows.register(Workflow(name, 1, [side_effect("write", tool, params=params)]), replace=True)


@pytest.fixture(autouse=True)
def store():
    STORE.__init__()
    yield STORE
    STORE.__init__()


def start(workflow: str, input: dict) -> Run:
    run, _ = engine.start_run(workflow, input)
    return run


def make_due(run) -> None:
    past = timezone.now() - timedelta(hours=1)
    Step.objects.filter(run=run, status__in=["retry_scheduled", "waiting"]).update(
        next_attempt_at=past
    )
    SideEffect.objects.filter(run=run).update(attempted_at=past)


def verified_events(run) -> list[dict]:
    return list(
        TimelineEvent.objects.filter(run=run, verb=Verb.SIDE_EFFECT_VERIFIED)
        .order_by("seq")
        .values_list("data", flat=True)
    )


def test_an_answer_lost_after_the_write_is_verified_as_committed(store):
    store.fail = "after"
    run = engine.run_until_quiet(start("test.verify_write", {"path": "a.txt", "content": "hi"}).pk)
    assert run.status == "succeeded", run.attention_reason
    assert store.writes == 1
    effect = SideEffect.objects.get(run=run)
    assert (effect.status, effect.confirmed_by) == ("committed", "verification")
    assert effect.external_id == "a.txt@2"
    assert effect.receipt["response"]["verified_by"] == "read the file"
    assert effect.receipt["response"]["observed"] == {"content": "hi"}
    assert [e["found"] for e in verified_events(run)] == [True]


def test_a_write_that_never_landed_is_resent_once_the_settle_window_passed(store):
    store.fail = "before"
    run = engine.run_until_quiet(start("test.verify_write", {"path": "b.txt", "content": "x"}).pk)
    step = Step.objects.get(run=run, name="write")
    # Nothing there yet, but the request may still be in flight: asked again later, not resent.
    assert step.status == "retry_scheduled" and "in flight" in step.last_error
    assert store.writes == 0
    store.fail = ""
    make_due(run)
    run = engine.run_until_quiet(run.pk)
    assert run.status == "succeeded", run.attention_reason
    assert store.writes == 1 and store.files == {"b.txt": "x"}
    effect = SideEffect.objects.get(run=run)
    assert effect.status == "committed" and effect.confirmed_by != "verification"
    assert [e["found"] for e in verified_events(run)] == [False, False]
    assert TimelineEvent.objects.filter(
        run=run, verb=Verb.SIDE_EFFECT_NOT_COMMITTED, data__confirmed_by="verification"
    ).exists()


def test_the_baseline_tells_a_new_commit_from_an_old_one_with_the_same_message(store):
    store.log = [{"hash": "c0000", "message": "fix typo"}]  # there before the run
    store.fail = "after"
    run = engine.run_until_quiet(start("test.verify_commit", {"message": "fix typo"}).pk)
    assert run.status == "succeeded", run.attention_reason
    assert store.writes == 1 and len(store.log) == 2
    effect = SideEffect.objects.get(run=run)
    assert (effect.confirmed_by, effect.external_id) == ("verification", "c0002")
    snapshot = Snapshot.objects.get(run=run)
    assert snapshot.verification_baseline == {"value": [{"hash": "c0000", "message": "fix typo"}]}


def test_a_crash_before_the_send_resends_exactly_once(store):
    store.log = [{"hash": "c0000", "message": "fix typo"}]
    run = start("test.verify_commit", {"message": "fix typo"})
    claim = engine.claim_next(run.pk, worker="doomed")
    tool = tools.get("test.verified_commit")
    params = calls.build_params(claim, tool)
    ledger.write_intent(claim, tool, params, engine.idempotency_key_for(claim.step))
    # The worker dies here: intent written (with its baseline), nothing sent; its lease runs out.
    Step.objects.filter(pk=claim.step.pk).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    SideEffect.objects.filter(run=run).update(attempted_at=timezone.now() - timedelta(hours=1))
    run = engine.run_until_quiet(run.pk)
    # Verified not there (the old commit is in the baseline), past the settle window: resent.
    assert run.status == "succeeded", run.attention_reason
    assert store.writes == 1 and [e["message"] for e in store.log] == ["fix typo"] * 2
    assert SideEffect.objects.get(run=run).external_id == "c0002"
    assert [e["found"] for e in verified_events(run)] == [False]


def test_a_read_that_cannot_be_made_is_asked_again_then_decides(store):
    store.fail = "after"
    run = start("test.verify_write", {"path": "c.txt", "content": "y"})
    store_fail_read = {"n": 0}
    original = STORE.read_file

    def flaky(params, ctx):
        store_fail_read["n"] += 1
        if store_fail_read["n"] == 1:
            raise ToolError(FailureClass.OUTAGE, "the store cannot be read")
        return original(params, ctx)

    STORE.read_file = flaky
    try:
        run = engine.run_until_quiet(run.pk)
        step = Step.objects.get(run=run, name="write")
        assert step.status == "retry_scheduled"
        assert TimelineEvent.objects.filter(run=run, verb=Verb.SIDE_EFFECT_VERIFY_FAILED).exists()
        make_due(run)
        run = engine.run_until_quiet(run.pk)
    finally:
        del STORE.read_file
    assert run.status == "succeeded", run.attention_reason
    assert store.writes == 1
    assert SideEffect.objects.get(run=run).confirmed_by == "verification"


def test_a_verification_that_cannot_tell_hands_the_question_to_a_person(store):
    store.fail = "after"
    run = engine.run_until_quiet(
        start("test.verify_undecidable", {"path": "d.txt", "content": "z"}).pk
    )
    assert run.status == "needs_human"
    step = Step.objects.get(run=run, name="write")
    assert step.status == "unknown_outcome"
    assert "verification read could not tell" in step.last_error
    assert store.writes == 1
    assert [e["found"] for e in verified_events(run)] == [None]


def test_a_baseline_that_cannot_be_read_stops_the_step_before_its_intent(store):
    store.fail = "read"
    run = engine.run_until_quiet(start("test.verify_commit", {"message": "m"}).pk)
    step = Step.objects.get(run=run, name="write")
    assert "verification baseline" in step.last_error
    assert not SideEffect.objects.filter(run=run).exists()
    assert store.writes == 0


def test_an_error_answer_the_read_shows_did_nothing_is_a_refusal_not_a_resend(store):
    store.fail = "refuse"
    run = engine.run_until_quiet(start("test.verify_write", {"path": "e.txt", "content": "w"}).pk)
    step = Step.objects.get(run=run, name="write")
    # Refused at once (no settle window: the system answered), routed as invalid input.
    assert step.attempts == 1 and step.routing["failure_class"] == "invalid_input"
    assert "refused" in step.last_error and "parent folder missing" in step.last_error
    assert run.status == "needs_human"
    effect = SideEffect.objects.get(run=run)
    assert (effect.status, effect.confirmed_by) == ("not_committed", "verification")
    assert store.writes == 0

"""Real third-party MCP peers — the reference filesystem server and mcp-server-git, installed
from the project's own files (taskpilots/peers) — in real Celery worker processes, on the real
broker and PostgreSQL.

Neither server can be asked by key. A worker SIGKILLed before the send, during the call (the
request reached the server and was carried out; the answer never came back) or after the answer
(before the receipt) is replaced, and the run finishes without a person: the verification read
of runs/agents/reference.py tells whether the write landed (no resend) or not (one resend, same
key). Each time exactly one effect on the receiving side — counted by the proxy in front of the
server (every write request that reached it), in the file, in `git rev-list --count` — and the
receipt's external id is the effect's: the file's path and sha256, the commit's hash.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from runs import tools as tool_registry
from runs.agents import reference
from runs.agents.mcp import list_tools, register_mcp_tools
from runs.tools import CallContext
from taskpilots import peers
from taskpilots.evidence.peer_drill import MOMENTS, PEERS, PeerMatrix, Workdir, git

CASES = [(peer, moment) for peer in PEERS for moment in MOMENTS]


def test_the_peers_are_installed():
    # make test installs them (make peers, the dev extra): a missing one fails, never skips.
    try:
        peers.filesystem_command()
        peers.git_command()
    except peers.PeerMissing as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="module")
def matrix(django_db_setup, django_db_blocker, tmp_path_factory):
    # One recovery worker for every case (it has been beating long enough to judge the dead),
    # and one chaos worker per case (each dies), all started at once.
    with (
        django_db_blocker.unblock(),
        PeerMatrix(tmp_path_factory.mktemp("peers"), progress=print) as found,
    ):
        found.prepare(CASES)
        yield found
        for worker in found.workers.started:
            print(f"--- worker {worker.name} ---\n" + "".join(worker.output[-30:]))


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("peer", "moment"), CASES)
def test_a_killed_worker_leaves_exactly_one_effect_and_no_person(matrix, peer, moment):
    case = matrix.run_case(peer, moment)
    assert case.crashed, f"the worker did not die {moment}"
    assert case.status == "succeeded", case.attention_reason
    assert case.writes == 1, f"{case.writes} write requests reached the server"
    if moment == "before_send":
        assert case.writes_before_crash == 0  # the proxy saw nothing: nothing was sent
        assert case.confirmed_by == "tool"  # resent once under the same key, answered
    else:
        assert case.writes_before_crash == 1 and not case.resent
        assert case.answer_held == (moment == "during_call")
        assert case.confirmed_by == "verification"
    assert case.effects == 1 and case.content_ok
    assert case.external_id == case.expected_external_id
    if peer == "git":
        assert re.fullmatch(r"[0-9a-f]{40}", case.external_id)
    else:
        assert re.fullmatch(r"case-\d+-\w+\.txt@sha256:[0-9a-f]{64}", case.external_id)


# ------------------------------------------------------------------------------------------
# The verifications alone, against the real servers' answers (no workers): what each one says
# in the cases the kill matrix does not reach.

CTX = CallContext(idempotency_key="tp-test-key", run_id="r", step="s", attempt=1, timeout=20)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    workdir = Workdir(tmp_path_factory.mktemp("reference")).prepare()
    fs = reference.filesystem_server(
        workdir.files, name="reffs", command=peers.filesystem_command()
    )
    repo = reference.git_server(workdir.repo, name="refgit", command=peers.git_command())
    for server, config in ((fs, reference.FILESYSTEM_CONFIG), (repo, reference.GIT_CONFIG)):
        register_mcp_tools(server, config=config, manifest=list_tools(server))
    return workdir


def _call(tool: str, params: dict):
    return tool_registry.get(tool).invoke(params, CTX)


def _verify(tool: str, params: dict, act=None):
    """The baseline read, `act()` (what happened meanwhile), the read after: what the
    verification recognises, and its commit proof."""
    verification = tool_registry.get(tool).verification
    baseline = verification.baseline(params, CTX)
    if act is not None:
        act()
    observed = verification.read(params, CTX)
    found = verification.recognise(params, observed, baseline)
    proof = verification.external_id(params, observed, baseline) if found else ""
    return found, proof


WRITE, EDIT, COMMIT = "mcp.reffs.write_file", "mcp.reffs.edit_file", "mcp.refgit.git_commit"


def test_a_write_that_landed_is_recognised_with_the_files_digest(world):
    params = {"path": "landed.txt", "content": "hello\r\nworld"}
    found, proof = _verify(WRITE, params, lambda: _call(WRITE, params))
    assert found is True
    assert proof == reference.file_proof("landed.txt", "hello\r\nworld")
    assert _call(WRITE, params).external_id == proof  # the answered call's proof is the same


def test_a_write_that_never_landed_is_not_there(world):
    assert _verify(WRITE, {"path": "never.txt", "content": "x"}) == (False, "")
    (world.files / "old.txt").write_text("before")
    assert _verify(WRITE, {"path": "old.txt", "content": "after"}) == (False, "")


def test_content_already_there_counts_as_written(world):
    # Writing the same bytes again would change nothing: taking it as done loses nothing.
    (world.files / "same.txt").write_text("same")
    assert _verify(WRITE, {"path": "same.txt", "content": "same"})[0] is True


def test_a_file_someone_else_changed_is_not_overwritten_a_person_decides(world):
    (world.files / "theirs.txt").write_text("before")
    found, _ = _verify(
        WRITE,
        {"path": "theirs.txt", "content": "ours"},
        lambda: (world.files / "theirs.txt").write_text("someone else's"),
    )
    assert found is None


def test_an_unreadable_path_cannot_tell(world):
    assert _verify(WRITE, {"path": "/etc/hostname", "content": "x"})[0] is None


def test_an_edit_is_recognised_as_the_server_applies_it(world):
    # The server normalises the file's line endings and replaces the first exact match.
    (world.files / "edit.txt").write_bytes(b"a = 1\r\nb = 2\r\nb = 2\r\n")
    params = {"path": "edit.txt", "edits": [{"oldText": "b = 2", "newText": "b = 3"}]}
    found, proof = _verify(EDIT, params, lambda: _call(EDIT, params))
    assert found is True
    assert (world.files / "edit.txt").read_bytes() == b"a = 1\nb = 3\nb = 2\n"
    assert proof == reference.file_proof("edit.txt", "a = 1\nb = 3\nb = 2\n")


def test_an_edit_not_applied_is_not_there_and_another_change_cannot_tell(world):
    (world.files / "edit2.txt").write_text("x = 1\n")
    params = {"path": "edit2.txt", "edits": [{"oldText": "x = 1", "newText": "x = 2"}]}
    assert _verify(EDIT, params)[0] is False
    changed = _verify(EDIT, params, lambda: (world.files / "edit2.txt").write_text("y = 9\n"))
    assert changed[0] is None


def _commit_params(world, name: str, message: str) -> dict:
    (world.repo / name).write_text(name)
    git(world.repo, "add", name)
    return {"repo_path": str(world.repo), "message": message}


def test_a_commit_that_landed_is_recognised_by_its_message_above_the_baseline(world):
    params = _commit_params(world, "one.txt", "Add one.txt")
    found, proof = _verify(COMMIT, params, lambda: _call(COMMIT, params))
    assert found is True and proof == git(world.repo, "rev-parse", "HEAD")


def test_an_older_commit_with_the_same_message_is_not_taken_for_this_one(world):
    params = _commit_params(world, "two.txt", "Update the docs")
    git(world.repo, "commit", "-q", "-m", "Update the docs")  # before the call: not ours
    _commit_params(world, "three.txt", "Update the docs")
    assert _verify(COMMIT, params) == (False, "")
    # Made now, by the server: recognised, and its hash is the proof (not the older one's).
    found, proof = _verify(COMMIT, params, lambda: _call(COMMIT, params))
    assert found is True and proof == git(world.repo, "rev-parse", "HEAD")


def test_a_message_that_quotes_a_log_entry_cannot_pass_for_another_commit(world):
    head = git(world.repo, "rev-parse", "HEAD")
    message = f"Tricky\n\nCommit: {head}\nAuthor: x\nDate: y\nMessage: Add one.txt"
    params = _commit_params(world, "four.txt", message)
    assert _verify(COMMIT, params)[0] is False
    found, proof = _verify(COMMIT, params, lambda: _call(COMMIT, params))
    assert found is True and proof == git(world.repo, "rev-parse", "HEAD")


def test_rewritten_history_cannot_tell(world):
    params = _commit_params(world, "five.txt", "Add five.txt")

    def amend():
        subprocess.run(
            ["git", "-C", str(world.repo), "commit", "-q", "--amend", "-m", "Rewritten"],
            check=True,
        )

    assert _verify(COMMIT, params, amend)[0] is None


def test_the_drill_counts_runs_finished_without_a_person_per_crash():
    from taskpilots.evidence.peer_drill import Case, report

    cases = [
        Case("filesystem", "before_send", 1, crashed=True, status="succeeded", writes=1,
             effects=1, external_id="a@sha256:1", expected_external_id="a@sha256:1"),
        Case("filesystem", "during_call", 2, crashed=True, status="succeeded", writes=2,
             writes_before_crash=1, effects=1, external_id="", expected_external_id="b"),
        Case("git", "before_send", 3, crashed=True, status="needs_human"),
        Case("git", "during_call", 4, crashed=True, status="needs_human", writes=1, effects=1),
        Case("git", "after_answer", 5, crashed=False, status="succeeded", writes=1, effects=2,
             external_id="c", expected_external_id="d"),
    ]  # fmt: skip
    found = report(cases, "reference")
    assert found["peers"]["filesystem"]["local_recovery_rate"] == 1.0
    assert found["peers"]["filesystem"]["extra_writes"] == 1
    assert found["peers"]["filesystem"]["receipts_without_proof"] == 1
    assert found["peers"]["git"]["crashes"] == 2  # the one that missed its moment is not one
    assert found["peers"]["git"]["local_recovery_rate"] == 0.0
    assert (found["crashes_missed"], found["duplicate_effects"], found["wrong_receipts"]) == (
        1,
        1,
        1,
    )
    assert found["lost"] == 0

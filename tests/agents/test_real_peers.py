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

import pytest

from taskpilots import peers
from taskpilots.evidence.peer_drill import MOMENTS, PEERS, PeerMatrix

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

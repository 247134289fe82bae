"""`manage.py bench inbox`, short: a few open inboxes polling through gunicorn get 304s at the
query count the unit tests guard (tests/approvals/test_live.py). Times and PostgreSQL's
counters are not asserted: a few polls over 11 s are within the noise of an idle database; the
50-console figures are in docs/benchmarks.md."""

from __future__ import annotations

import pytest

from taskpilots.evidence.bench_live import bench_inbox

pytestmark = [pytest.mark.bench, pytest.mark.django_db(transaction=True), pytest.mark.timeout(600)]


def test_open_inboxes_poll_for_304s_at_a_few_queries_each():
    result = bench_inbox(100, 3, 11, lambda line: None, vacuum=False)
    assert result["requests"] >= 6  # 2 or 3 polls each
    # Nothing changed: no rendering, but for the once-a-minute refresh (ages, SLA countdowns),
    # which a phase shorter than a minute crosses at most once per console.
    answers = result["answers"]
    assert set(answers) <= {"200", "304"} and answers.get("200", 0) <= 3, answers
    # The session, the user, their groups, the stamp (autocommit: one transaction each).
    assert result["queries_per_unchanged_poll"] == 4
    assert result["polling"]["pg"]["xact_commit"] > 0  # the counters were read

"""`manage.py bench console`, short: every page it times answers 200 through gunicorn, and at
the same number of queries for few runs as for more (the 100k-run figures are in
docs/console.md; times are not asserted here, counts are)."""

from __future__ import annotations

import pytest

from taskpilots.evidence.bench_console import bench_console

pytestmark = [pytest.mark.bench, pytest.mark.django_db(transaction=True), pytest.mark.timeout(600)]


def test_every_page_answers_at_a_query_count_that_does_not_grow_with_the_runs():
    # Enough runs that every list spans several pages at both sizes (a page that holds every
    # match needs no estimate of how many there are: one query fewer).
    small = bench_console(200, lambda line: None, requests=2, vacuum=False)
    assert small["not_200"] == []
    large = bench_console(600, lambda line: None, requests=2, vacuum=False)
    assert large["not_200"] == []
    assert large["runs"] == 600
    assert set(small["pages"]) == set(large["pages"]) and len(small["pages"]) >= 26
    counts = {
        name: (small["pages"][name]["queries"], r["queries"]) for name, r in large["pages"].items()
    }
    differ = {name: (few, many) for name, (few, many) in counts.items() if few != many}
    assert differ == {}, differ

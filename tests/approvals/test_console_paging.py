"""Keyset pages on all runs and the audit search: First, Previous, Next and Last walk every run
once, in order, with no OFFSET and no COUNT, at a cost that does not grow with the runs; a page
link that was edited is a 400 that says so."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from approvals import paging
from runs.models import Run
from tests.approvals.console_helpers import fast_passwords, visible_text  # noqa: F401
from tests.factories import RunFactory

pytestmark = pytest.mark.django_db

RUNS = "/console/runs/"
AUDIT = "/console/audit/"


def _runs(n: int, *, base=None) -> list[Run]:
    """n runs a minute apart, newest first; every third shares its neighbour's created_at, so
    the id breaks ties."""
    base = base or timezone.now() - timedelta(days=1)
    runs = []
    for i in range(n):
        at = base - timedelta(minutes=i - (i % 3 == 2))
        runs.append(RunFactory.build(created_at=at, updated_at=at))
    Run.objects.bulk_create(runs)
    return list(Run.objects.order_by("-created_at", "-id"))


def _ids(response) -> list:
    return [run.pk for run in response.context["page"].object_list]


def _link(response, label: str) -> str | None:
    """The href of a pager button, by its label."""
    html = response.content.decode()
    match = re.search(rf'<a class="btn btn--small"[^>]*href="([^"]+)"[^>]*>[^<]*{label}', html)
    return match.group(1).replace("&amp;", "&") if match else None


@pytest.mark.parametrize("url", [RUNS, AUDIT])
def test_next_walks_every_run_once_newest_first_and_previous_walks_back(client, admin_user, url):
    expected = [run.pk for run in _runs(60)]
    client.force_login(admin_user)
    query = {"outcome": "open"} if url == AUDIT else {}
    response = client.get(url, query)
    pages = [_ids(response)]
    assert _link(response, "Previous") is None and _link(response, "First") is None
    while (href := _link(response, "Next")) is not None:
        assert "outcome=open" in href or url == RUNS  # the filters go along
        response = client.get(href)
        pages.append(_ids(response))
    assert [len(p) for p in pages] == [25, 25, 10]
    assert [pk for page in pages for pk in page] == expected
    back = []
    while (href := _link(response, "Previous")) is not None:
        response = client.get(href)
        back.append(_ids(response))
    assert back == pages[-2::-1]


@pytest.mark.parametrize("url", [RUNS, AUDIT])
def test_last_is_the_oldest_runs_read_in_reverse(client, admin_user, url):
    expected = [run.pk for run in _runs(60)]
    client.force_login(admin_user)
    first = client.get(url, {"outcome": ""} if url == AUDIT else {})
    last = client.get(_link(first, "Last"))
    assert _ids(last) == expected[-25:]
    assert _link(last, "Next") is None and _link(last, "Last") is None
    previous = client.get(_link(last, "Previous"))
    assert _ids(previous) == expected[10:35]
    assert _ids(client.get(_link(last, "First"))) == expected[:25]


def test_a_page_says_how_many_match_exactly_only_when_they_all_fit(client, admin_user):
    _runs(3)
    client.force_login(admin_user)
    assert "3 runs match." in visible_text(client.get(RUNS))
    _runs(120, base=timezone.now() - timedelta(days=3))
    text = visible_text(client.get(RUNS))
    # PostgreSQL's estimate, rounded: never claimed exact, never fewer than the page shows.
    match = re.search(r"About ([\d,]+) runs match\.", text)
    assert match and int(match.group(1).replace(",", "")) >= 26


def test_estimates_are_rounded_to_two_significant_digits():
    assert [paging.about(n) for n in (7, 99, 123, 12_345, 98_765)] == [7, 99, 120, 12_000, 99_000]


@pytest.mark.parametrize("url", [RUNS, AUDIT])
@pytest.mark.parametrize(
    "params",
    [
        {"after": "not-a-cursor"},
        {"before": "1.2"},
        {"after": ""},
        {"after": "1700000000000000." + "g" * 32},
    ],
)
def test_an_edited_page_link_is_a_400_that_says_so(client, admin_user, url, params):
    _runs(3)
    client.force_login(admin_user)
    response = client.get(url, params)
    assert response.status_code == 400
    text = visible_text(response)
    assert "This page link is not one the console gave out" in text
    assert "Go to the first page" in text


def test_a_cursor_of_the_right_form_is_a_position_even_if_never_given_out(client, admin_user):
    runs = _runs(30)
    client.force_login(admin_user)
    middle = paging.Position.of(runs[9])
    response = client.get(RUNS, {"after": str(middle)})
    assert _ids(response) == [run.pk for run in runs[10:30]]


@pytest.mark.parametrize("url", [RUNS, AUDIT])
@pytest.mark.parametrize("which", ["first", "last", "after"])
def test_a_page_costs_the_same_queries_for_30_or_300_runs(
    client, admin_user, query_count, url, which
):
    # Deep pages must cost what the first does at 100k runs: a fixed number of queries
    # (the page, one EXPLAIN for the estimate), none of them an OFFSET or a COUNT.
    client.force_login(admin_user)

    def measure() -> tuple[int, list[str]]:
        runs = list(Run.objects.order_by("-created_at", "-id"))
        params = {"last": "1"} if which == "last" else {}
        if which == "after":
            params = {"after": str(paging.Position.of(runs[len(runs) // 2]))}
        if url == AUDIT:
            params["outcome"] = "open"
        with query_count() as ctx:
            assert client.get(url, params).status_code == 200
        return len(ctx), [q["sql"] for q in ctx.captured_queries]

    _runs(30)
    client.get(url)  # the session and the user
    few, _sql = measure()
    _runs(270, base=timezone.now() - timedelta(days=5))
    many, sql = measure()
    assert many == few
    assert not any(" OFFSET " in q or "COUNT(" in q.upper() for q in sql)

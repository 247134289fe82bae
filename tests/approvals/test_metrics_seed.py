"""seed_figures(): the dashboard's figures for a given set of runs, by the same definitions.

A drill reads its report from here instead of counting by its own rules, so the figures of a
set of runs must be exactly the dashboard's when the set is a window's runs.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from approvals.metrics import sketch
from approvals.metrics.dashboard import seed_figures
from approvals.metrics.figures import FIGURES
from runs.models import Run
from tests.approvals.test_metrics import world  # noqa: F401 (the fixture)
from tests.approvals.test_metrics_rollup import _rounded, board, same

pytestmark = pytest.mark.django_db


def test_the_figures_of_a_windows_runs_are_the_dashboards(world):  # noqa: F811
    now = world
    runs = Run.objects.filter(created_at__gte=now - timedelta(hours=24))
    assert runs.count() == 12  # R1–R12
    seeds = seed_figures(runs.values_list("pk", flat=True))
    figures = board(now, "24h")["figures"]
    for figure in figures.values():
        figure.pop("series")
    same(seeds, figures)
    assert seeds["execution_success_rate"]["counts"] == [7, 8]
    assert seeds["time_to_recover_median"]["extra"] == {"mean": _rounded(sketch.mean([50, 200]))}


def test_the_figures_of_one_run_whenever_it_started(world):  # noqa: F811
    # R2: mail.send failed twice (t+10 s, t+20 s) and the engine retried it; step done at t+60 s.
    r2 = Run.objects.get(failure_count=2)
    seeds = seed_figures([r2.pk])
    assert seeds["auto_recovery_rate"]["value"] == 1.0
    assert seeds["local_recovery_rate"]["counts"] == [1, 1]
    assert seeds["tool_failure_rate"]["counts"] == [2, 3]
    assert seeds["time_to_recover_median"]["value"] == _rounded(sketch.quantile([50], 0.5))
    assert seeds["time_to_close_median"]["value"] == _rounded(sketch.quantile([90], 0.5))
    assert seeds["human_takeover_rate"]["counts"] == [0, 1]
    # R0 started 40 days ago, outside every window: its figures are there all the same.
    r0 = Run.objects.order_by("created_at").first()
    assert seed_figures([str(r0.pk)])["execution_success_rate"]["counts"] == [1, 1]


def test_no_runs_have_no_figures(db, django_assert_max_num_queries):
    with django_assert_max_num_queries(4):  # the savepoint, the SET, the query, the release
        seeds = seed_figures([])
    assert len(seeds) == len(FIGURES) == 21
    assert seeds["execution_success_rate"]["value"] is None
    assert seeds["execution_success_rate"]["counts"] == [0, 0]
    assert seeds["time_to_recover_median"]["value"] is None

"""Recovery metrics: is recovery getting better? Definitions and the queries behind them.

Every windowed figure describes the *cohort* of runs started in the window (`Run.created_at` in
[start, end)), whatever happened to them later; its trend buckets those runs by the hour or day
they started. State-inconsistency alerts and the "needs a person" gauge describe *now*.

How it stays fast: FACTS (facts.py) is everything the dashboard counts about one run, as one
row. The rollup (store.py) stores that row (RunMetrics) once a run has been still for a minute,
and sums the rows of each past day's ended runs (MetricsDay). A window (queries.py) adds up day
rows and run rows, and computes live, by the same SQL, only the runs without a current row.
figures.py turns the sums into the dashboard's figures; dashboard.py puts a window's together;
prometheus.py serves /metrics. docs/metrics.md has the definitions and the measurements.
"""

from approvals.metrics.dashboard import ROLLUP_BEHIND_RUNS, Dashboard, compute, seed_figures
from approvals.metrics.facts import FACTS, FAILURE_VERBS, RESEND_VERBS
from approvals.metrics.figures import FIGURES, INCONSISTENCIES, INCONSISTENCY_LABELS, Figure, median
from approvals.metrics.prometheus import PROMETHEUS_CONTENT_TYPE, prometheus_text
from approvals.metrics.queries import STALE_MINUTES
from approvals.metrics.store import ROLLUP_AFTER, ROLLUP_BATCH, before_pruning, rollup
from approvals.metrics.window import BadWindow, Window, parse_window

__all__ = [
    "FACTS",
    "FAILURE_VERBS",
    "FIGURES",
    "INCONSISTENCIES",
    "INCONSISTENCY_LABELS",
    "PROMETHEUS_CONTENT_TYPE",
    "RESEND_VERBS",
    "ROLLUP_AFTER",
    "ROLLUP_BATCH",
    "ROLLUP_BEHIND_RUNS",
    "STALE_MINUTES",
    "BadWindow",
    "Dashboard",
    "Figure",
    "Window",
    "before_pruning",
    "compute",
    "median",
    "parse_window",
    "prometheus_text",
    "rollup",
    "seed_figures",
]

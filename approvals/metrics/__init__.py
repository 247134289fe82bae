"""Recovery metrics: is recovery getting better? Definitions and the queries behind them.

Every windowed figure describes the *cohort* of runs started in the window (`Run.created_at` in
[start, end)), whatever happened to them later; its trend buckets those runs by the hour or day
they started. State-inconsistency alerts and the "needs a person" gauge describe *now*.

How it stays fast: FACTS (facts.py) is everything the dashboard counts about one run, as one
row. The rollup (store.py) stores that row (RunMetrics) once a run has been still for a minute,
and sums the rows of each past day's ended runs (MetricsDay). A window (queries.py) adds up day
rows and run rows, and computes live, by the same SQL, only the runs without a current row.
figures.py turns the sums into the dashboard's figures; dashboard.py puts a window's together;
prometheus.py serves /metrics; tables.py holds the tables the rollup writes (RunMetrics, the
day and hour sums, the counters), which `approvals.models` re-exports. Import the module you
need (`from approvals.metrics import dashboard`): the package itself imports nothing, so
`approvals.models` can import its tables without importing the queries that read them.
docs/metrics.md has the definitions and the measurements.
"""

"""Per-run facts: FACTS is everything the dashboard counts about one run, as one row of SQL.
It is the one definition of every seed metric: the dashboard, the rollup and seed_figures() all
add up these rows.

A **tool failure** is one failed tool attempt as the engine routed it: a timeline event
`step.retry_scheduled`, `step.waiting_for_tool`, `step.failed`, `step.escalated` (with the
failure class the escalation rule saw, `data.routing.failure_class`), `step.degraded` (the
tool failed and its fallback did the step: `data.failure_class`), `step.tool_paused` when the
step's own call paused the tool (API drift; a hold by an admin's pause has no routing and is not
counted) or `step.unknown_outcome` (class `unknown_outcome`), on a step that calls a tool.
Wait and approval deadlines (class `timeout`) and human actions are not tool failures.
"""

from __future__ import annotations

from approvals.metrics.sql import T
from approvals.metrics.tables import SUM_FIELDS, TOOL_FIELDS, VALUE_FIELDS
from runs.models import RecoveryCause, Run
from runs.verbs import Verb

# Verbs whose event records one failed tool attempt (see the module docstring).
FAILURE_VERBS = (
    Verb.STEP_RETRY_SCHEDULED,
    Verb.STEP_WAITING_FOR_TOOL,
    Verb.STEP_FAILED,
    Verb.STEP_ESCALATED,
    Verb.STEP_DEGRADED,
    Verb.STEP_TOOL_PAUSED,
    Verb.STEP_UNKNOWN_OUTCOME,
)
RESEND_VERBS = (Verb.SIDE_EFFECT_NOT_COMMITTED, Verb.SIDE_EFFECT_RESEND_WITH_SAME_KEY)
# Verbs whose event resumes a run that had stopped: a wait resolved or a person's action put it
# back to work (run.resumed), a person handed it back to the engine (run.released to running),
# or a crashed worker's step was taken back (step.lease_reclaimed).
RESUME_VERBS = (Verb.RUN_RESUMED, Verb.RUN_RELEASED, Verb.STEP_LEASE_RECLAIMED)
# Why a resume went to a person for want of metadata (run.needs_human's data.cause), and the
# column counting each.
MISSING_METADATA = {
    RecoveryCause.WORKFLOW_NOT_REGISTERED: "recovery_missing_workflow",
    RecoveryCause.STEP_NOT_IN_WORKFLOW: "recovery_missing_step",
    RecoveryCause.NOTHING_TO_WAIT_FOR: "recovery_missing_wait",
}
TERMINAL = tuple(sorted(Run.TERMINAL))

# FACTS works out, for a cohort of runs, one row per run holding everything the
# dashboard counts about it; a window adds those rows up (WINDOW_SQL). An ended run never
# changes again, so rollup() stores its row in RunMetrics a few minutes after it ends, and a
# window reads the stored rows and computes live only the runs without one (still open, or just
# ended). Stored or live, a run's row comes from the same SQL, so the figures are the same.

_FAILURE_CLASS = (
    f"CASE WHEN e.verb = '{Verb.STEP_UNKNOWN_OUTCOME}' THEN 'unknown_outcome' "
    f"WHEN e.verb = '{Verb.STEP_DEGRADED}' THEN e.data ->> 'failure_class' "
    "ELSE e.data #>> '{routing,failure_class}' END"
)
_NOT_TIMEOUT = f"COALESCE({_FAILURE_CLASS}, 'timeout') <> 'timeout'"
_DONE = "s.status IN ('succeeded', 'degraded')"


def _epoch(expr: str) -> str:
    return f"EXTRACT(EPOCH FROM ({expr}))::float8"


_MISSING_COUNTS = ", ".join(
    f"count(*) FILTER (WHERE e.data ->> 'cause' = '{cause}') AS {column}"
    for cause, column in MISSING_METADATA.items()
)


# The caller supplies `cohort` (id, status, created_at, finished_at, failure_count,
# escalation_level). Every join starts from it by run id, so the cost follows the cohort's size.
_FACTS_CTES = f"""
events AS MATERIALIZED (
  -- The cohort's events that count, read run by run: the OFFSET keeps the verb test out of the
  -- index scan (a BitmapAnd with timeline_verb_idx reads every such event of every run).
  SELECT e.* FROM cohort c CROSS JOIN LATERAL (
    SELECT e.run_id, e.verb, e.at, e.data FROM {T["event"]} e WHERE e.run_id = c.id OFFSET 0
  ) e
  WHERE e.verb = ANY(%(fact_verbs)s)
),
failures AS (
  SELECT e.run_id, s.id AS step_id, s.tool, {_FAILURE_CLASS} AS failure_class, e.at
  FROM events e
  JOIN {T["step"]} s ON s.run_id = e.run_id AND s.name = e.data ->> 'step'
       AND s.iteration = COALESCE((e.data ->> 'iteration')::int, 0)
  WHERE e.verb = ANY(%(failure_verbs)s) AND s.tool <> '' AND {_NOT_TIMEOUT}
),
first_failure AS (
  SELECT e.run_id, min(e.at) AS at FROM events e
  WHERE e.verb = ANY(%(failure_verbs)s) AND {_NOT_TIMEOUT}
  GROUP BY e.run_id
),
humans AS (
  SELECT d.run_id, count(*) FILTER (WHERE d.approval_id IS NULL) AS recovery_decisions
  FROM cohort c JOIN {T["decision"]} d ON d.run_id = c.id GROUP BY d.run_id
),
takeovers AS (
  SELECT t.run_id, count(*) AS n
  FROM cohort c JOIN {T["takeover"]} t ON t.run_id = c.id GROUP BY t.run_id
),
after_release AS (
  SELECT DISTINCT d.run_id FROM cohort c JOIN {T["decision"]} d ON d.run_id = c.id
  WHERE d.verb <> 'release' AND EXISTS (
    SELECT 1 FROM {T["decision"]} r
    WHERE r.run_id = d.run_id AND r.verb = 'release' AND r.created_at < d.created_at)
),
step_f AS (
  SELECT fs.run_id, count(*) AS failed_steps,
    count(*) FILTER (WHERE {_DONE}) AS recovered_steps,
    count(*) FILTER (WHERE {_DONE} AND NOT EXISTS (
      SELECT 1 FROM {T["decision"]} d WHERE d.step_id = s.id)) AS recovered_locally,
    array_agg({_epoch("s.finished_at - fs.first_at")})
      FILTER (WHERE {_DONE} AND s.finished_at IS NOT NULL) AS recover_s
  FROM (SELECT run_id, step_id, min(at) AS first_at FROM failures GROUP BY run_id, step_id) fs
  JOIN {T["step"]} s ON s.id = fs.step_id
  GROUP BY fs.run_id
),
tool_f AS (
  SELECT x.run_id,
    array_agg(x.tool ORDER BY x.tool, x.failure_class) AS tool_names,
    array_agg(x.failure_class ORDER BY x.tool, x.failure_class) AS tool_classes,
    array_agg(x.n ORDER BY x.tool, x.failure_class) AS tool_counts,
    sum(x.n) FILTER (WHERE x.failure_class = '') AS calls,
    sum(x.n) FILTER (WHERE x.failure_class <> '') AS failures
  FROM (
    SELECT s.run_id, s.tool, ''::text AS failure_class, sum(s.attempts)::int AS n
    FROM cohort c JOIN {T["step"]} s ON s.run_id = c.id
    WHERE s.tool <> '' AND s.attempts > 0
    GROUP BY s.run_id, s.tool
    UNION ALL
    SELECT run_id, tool, failure_class, count(*)::int FROM failures
    GROUP BY run_id, tool, failure_class
  ) x
  GROUP BY x.run_id
),
effects AS (
  SELECT e.run_id, e.step_id, e.status FROM cohort c JOIN {T["effect"]} e ON e.run_id = c.id
),
resend_events AS (
  SELECT ef.step_id, ev.verb, ev.at, ev.data ->> 'confirmed_by' AS confirmed_by
  FROM events ev JOIN {T["effect"]} ef ON ef.idempotency_key = ev.data ->> 'key'
  WHERE ev.verb = ANY(%(resend_verbs)s) OR (ev.verb = '{Verb.SIDE_EFFECT_COMMITTED}'
    AND ev.data ->> 'confirmed_by' = 'reconcile')
),
resends AS (
  SELECT step_id, min(at) AS first_at FROM resend_events
  WHERE verb = ANY(%(resend_verbs)s) GROUP BY step_id
),
reconciled_after_resend AS (
  SELECT DISTINCT ev.step_id FROM resend_events ev JOIN resends r ON r.step_id = ev.step_id
  WHERE ev.verb = '{Verb.SIDE_EFFECT_COMMITTED}' AND ev.confirmed_by = 'reconcile'
    AND ev.at > r.first_at
),
effect_f AS (
  SELECT p.run_id,
    count(*) FILTER (WHERE p.committed_keys >= 1) AS steps_committed,
    count(*) FILTER (WHERE p.committed_keys >= 2) AS steps_duplicated,
    count(*) FILTER (WHERE r.step_id IS NOT NULL OR p.keys >= 2) AS steps_resent,
    count(*) FILTER (WHERE (r.step_id IS NOT NULL OR p.keys >= 2) AND (
        p.committed_keys >= 2 OR ra.step_id IS NOT NULL OR EXISTS (
          SELECT 1 FROM {T["decision"]} d WHERE d.step_id = p.step_id
          AND d.verb = 'confirm_happened' AND d.created_at > r.first_at))) AS wrong_retries
  FROM (
    SELECT run_id, step_id, count(*) AS keys,
      count(*) FILTER (WHERE status IN ('committed', 'compensated')) AS committed_keys
    FROM effects GROUP BY run_id, step_id
  ) p
  LEFT JOIN resends r ON r.step_id = p.step_id
  LEFT JOIN reconciled_after_resend ra ON ra.step_id = p.step_id
  GROUP BY p.run_id
),
cov_f AS (
  SELECT e.run_id, count(*) AS committed,
    count(*) FILTER (WHERE sn.created_at <= e.committed_at) AS covered,
    array_agg({_epoch("e.committed_at - sn.created_at")} * 1000)
      FILTER (WHERE sn.created_at <= e.committed_at) AS latency_ms
  FROM cohort c JOIN {T["effect"]} e ON e.run_id = c.id
  JOIN {T["snapshot"]} sn ON sn.id = e.snapshot_id
  WHERE e.committed_at IS NOT NULL
  GROUP BY e.run_id
),
snap_f AS (
  SELECT sn.run_id, count(*) AS snapshots,
    COALESCE(sum(jsonb_array_length(sn.missing_fields)), 0) AS missing
  FROM cohort c JOIN {T["snapshot"]} sn ON sn.run_id = c.id GROUP BY sn.run_id
),
wait_f AS (
  SELECT w.run_id,
    count(*) FILTER (WHERE w.status IN ('resolved', 'expired')) AS settled,
    count(*) FILTER (WHERE w.status = 'expired') AS expired,
    array_agg({_epoch("w.resolved_at - w.created_at")})
      FILTER (WHERE w.status = 'resolved' AND w.resolved_at IS NOT NULL) AS resume_s
  FROM cohort c JOIN {T["wait"]} w ON w.run_id = c.id GROUP BY w.run_id
),
approval_f AS (
  SELECT a.run_id, count(*) FILTER (WHERE a.status = 'decided') AS decided,
    array_agg({_epoch("a.decided_at - a.created_at")})
      FILTER (WHERE a.status = 'decided' AND a.decided_at IS NOT NULL) AS handling_s
  FROM cohort c JOIN {T["approval"]} a ON a.run_id = c.id GROUP BY a.run_id
),
missing_f AS (
  SELECT e.run_id, {_MISSING_COUNTS}
  FROM events e
  WHERE e.verb = '{Verb.RUN_NEEDS_HUMAN}' AND e.data ->> 'cause' IS NOT NULL
  GROUP BY e.run_id
),
-- Ended takeovers: how long each took (start to release, or to the cancel or rejection that
-- ended it), the people's actions in between (their own take over and release aside), and
-- the released ones' answer to "did this need an engineer?".
takeover_f AS (
  SELECT t.run_id, count(*) AS ended,
    count(*) FILTER (WHERE t.needed_engineer IS NOT NULL) AS answered,
    count(*) FILTER (WHERE t.needed_engineer) AS needing_engineer,
    sum((SELECT count(*) FROM {T["decision"]} d WHERE d.run_id = t.run_id
         AND d.created_at >= t.started_at AND d.created_at <= t.ended_at
         AND d.verb NOT IN ('take_over', 'release'))) AS actions,
    array_agg({_epoch("t.ended_at - t.started_at")}) AS takeover_s
  FROM cohort c JOIN {T["takeover"]} t ON t.run_id = c.id
  WHERE t.ended_at IS NOT NULL GROUP BY t.run_id
),
resume_events AS (
  SELECT e.run_id, e.at FROM events e
  WHERE e.verb = ANY(%(resume_verbs)s)
    AND (e.verb <> '{Verb.RUN_RELEASED}' OR e.data ->> 'to' = 'running')
),
-- Each duplicate (a step's second and later committed keys, as steps_duplicated counts them)
-- with the last resume before it was sent.
duplicates AS (
  SELECT x.run_id, (SELECT max(r.at) FROM resume_events r
                    WHERE r.run_id = x.run_id AND r.at <= x.sent_at) AS resumed_at
  FROM (
    SELECT e.run_id, COALESCE(e.attempted_at, e.committed_at) AS sent_at,
      row_number() OVER (PARTITION BY e.step_id ORDER BY e.committed_at, e.id) AS nth
    FROM cohort c JOIN {T["effect"]} e ON e.run_id = c.id
    WHERE e.status IN ('committed', 'compensated')
  ) x
  WHERE x.nth >= 2
),
resume_f AS (
  SELECT r.run_id, count(*) AS resumes,
    (SELECT count(DISTINCT d.resumed_at) FROM duplicates d WHERE d.run_id = r.run_id)
      AS with_duplicate,
    (SELECT count(d.resumed_at) FROM duplicates d WHERE d.run_id = r.run_id) AS duplicates
  FROM resume_events r GROUP BY r.run_id
)"""

_ENDED = "c.status = ANY(%(terminal)s)"
_NONE = "'{}'::float8[]"


def _flag(condition: str) -> str:
    return f"({condition})::int"


# A run that hit a tool failure and succeeded with nobody stepping in (no escalation, no
# takeover, no human decision other than an approval).
_AUTO_RECOVERED = (
    "c.failure_count > 0 AND c.status = 'succeeded' AND c.escalation_level = 0"
    " AND COALESCE(h.recovery_decisions, 0) = 0 AND t.n IS NULL"
)
# Taken over twice or more, or a human decision after a release.
_SECOND_INTERVENTION = "COALESCE(t.n >= 2 OR (t.n IS NOT NULL AND ar.run_id IS NOT NULL), false)"
# An ended run's first tool failure to its end, as a one-element array (empty otherwise).
_CLOSE_S = (
    f"CASE WHEN {_ENDED} AND ff.at IS NOT NULL AND c.finished_at IS NOT NULL"
    f" THEN ARRAY[{_epoch('c.finished_at - ff.at')}] ELSE {_NONE} END"
)

# (column, expression): a run's row (RunMetrics), in this order; the counts are 0/1 flags or
# tallies so that any set of rows, or of MetricsDay rows, adds up with sum().
FACTS: list[tuple[str, str]] = [
    ("run_id", "c.id"),
    ("created_at", "c.created_at"),
    ("finished_at", "c.finished_at"),
    ("event_seq", "c.event_seq"),
    ("status", "c.status"),
    ("runs", "1"),
    ("finished", _flag(_ENDED)),
    ("succeeded", _flag("c.status = 'succeeded'")),
    ("faulted_finished", _flag(f"c.failure_count > 0 AND {_ENDED}")),
    ("auto_recovered", _flag(_AUTO_RECOVERED)),
    ("human_stepped_in", _flag("COALESCE(h.recovery_decisions, 0) > 0 OR t.n IS NOT NULL")),
    ("takeovers", "COALESCE(t.n, 0)"),
    ("runs_taken_over", _flag("t.n IS NOT NULL")),
    ("second_intervention", _flag(_SECOND_INTERVENTION)),
    ("failed_steps", "COALESCE(sf.failed_steps, 0)"),
    ("recovered", "COALESCE(sf.recovered_steps, 0)"),
    ("recovered_locally", "COALESCE(sf.recovered_locally, 0)"),
    ("tool_calls", "COALESCE(tf.calls, 0)"),
    ("tool_failures", "COALESCE(tf.failures, 0)"),
    ("steps_committed", "COALESCE(ef.steps_committed, 0)"),
    ("steps_duplicated", "COALESCE(ef.steps_duplicated, 0)"),
    ("steps_resent", "COALESCE(ef.steps_resent, 0)"),
    ("wrong_retries", "COALESCE(ef.wrong_retries, 0)"),
    ("committed", "COALESCE(cv.committed, 0)"),
    ("covered", "COALESCE(cv.covered, 0)"),
    ("snapshots", "COALESCE(sp.snapshots, 0)"),
    ("missing", "COALESCE(sp.missing, 0)"),
    ("settled", "COALESCE(wf.settled, 0)"),
    ("expired", "COALESCE(wf.expired, 0)"),
    ("decided", "COALESCE(af.decided, 0)"),
    *((column, f"COALESCE(mf.{column}, 0)") for column in MISSING_METADATA.values()),
    ("takeovers_ended", "COALESCE(tk.ended, 0)"),
    ("takeover_actions", "COALESCE(tk.actions, 0)"),
    ("takeovers_answered", "COALESCE(tk.answered, 0)"),
    ("takeovers_needing_engineer", "COALESCE(tk.needing_engineer, 0)"),
    ("resumes", "COALESCE(rs.resumes, 0)"),
    ("resumes_with_duplicate", "COALESCE(rs.with_duplicate, 0)"),
    ("duplicates_after_resume", "COALESCE(rs.duplicates, 0)"),
    ("close_s", _CLOSE_S),
    ("recover_s", f"COALESCE(sf.recover_s, {_NONE})"),
    ("resume_s", f"COALESCE(wf.resume_s, {_NONE})"),
    ("handling_s", f"COALESCE(af.handling_s, {_NONE})"),
    ("latency_ms", f"COALESCE(cv.latency_ms, {_NONE})"),
    ("takeover_s", f"COALESCE(tk.takeover_s, {_NONE})"),
    ("tool_names", "COALESCE(tf.tool_names, '{}'::text[])"),
    ("tool_classes", "COALESCE(tf.tool_classes, '{}'::text[])"),
    ("tool_counts", "COALESCE(tf.tool_counts, '{}'::int[])"),
]
assert [name for name, _expr in FACTS[5:]] == [*SUM_FIELDS, *VALUE_FIELDS, *TOOL_FIELDS]
FACT_COLUMNS = ", ".join(name for name, _expr in FACTS)


def facts_sql(cohort: str) -> str:
    """One row per run of `cohort` (a SELECT of the cohort columns), in FACTS' column order."""
    select = ",\n  ".join(f"{expr} AS {name}" for name, expr in FACTS)
    return f"""
WITH cohort AS MATERIALIZED ({cohort}),
{_FACTS_CTES}
SELECT {select}
FROM cohort c
LEFT JOIN first_failure ff ON ff.run_id = c.id
LEFT JOIN humans h ON h.run_id = c.id
LEFT JOIN takeovers t ON t.run_id = c.id
LEFT JOIN after_release ar ON ar.run_id = c.id
LEFT JOIN step_f sf ON sf.run_id = c.id
LEFT JOIN tool_f tf ON tf.run_id = c.id
LEFT JOIN effect_f ef ON ef.run_id = c.id
LEFT JOIN cov_f cv ON cv.run_id = c.id
LEFT JOIN snap_f sp ON sp.run_id = c.id
LEFT JOIN wait_f wf ON wf.run_id = c.id
LEFT JOIN approval_f af ON af.run_id = c.id
LEFT JOIN missing_f mf ON mf.run_id = c.id
LEFT JOIN takeover_f tk ON tk.run_id = c.id
LEFT JOIN resume_f rs ON rs.run_id = c.id"""


_COHORT_COLUMNS = (
    "r.id, r.status, r.created_at, r.finished_at, r.event_seq, r.failure_count, r.escalation_level"
)
# The cohort is passed as a list of run ids (read by a first query): PostgreSQL then knows its
# size and plans the joins for it, where a subquery's estimate (often one row) led it into
# nested loops over whole aggregates.
COHORT_SQL = f"SELECT {_COHORT_COLUMNS} FROM {T['run']} r WHERE r.id = ANY(%(ids)s::uuid[])"
# A stored row counts while the run's timeline head is the one it was computed at. A run has no
# current row when none is stored, or the stored one was computed at another head. A scalar
# subquery is one primary-key lookup per run, where NOT EXISTS let the planner hash every stored
# row to check a few thousand open runs.
NO_CURRENT_ROW = (
    f"(SELECT m.event_seq FROM {T['metrics']} m WHERE m.run_id = r.id) IS DISTINCT FROM r.event_seq"
)


def fact_params() -> dict:
    """The parameters facts_sql() reads besides the cohort's."""
    return {
        "terminal": list(TERMINAL),
        "failure_verbs": list(FAILURE_VERBS),
        "resend_verbs": list(RESEND_VERBS),
        "fact_verbs": [
            *FAILURE_VERBS,
            *RESEND_VERBS,
            Verb.SIDE_EFFECT_COMMITTED,
            Verb.RUN_NEEDS_HUMAN,
            *RESUME_VERBS,
        ],
        "resume_verbs": list(RESUME_VERBS),
        "open": sorted(set(Run.Status) - Run.TERMINAL),
    }

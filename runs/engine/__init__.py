"""The engine: the flows that span several models. Models own their state changes (verbs with
their timeline events); this package decides which happen, in which order.

Invariants (docs/architecture.md): PostgreSQL is the source of truth and Celery messages are
hints; no side effect is called without a committed Snapshot and an `intended` SideEffect row;
completed steps never run again; an unknown outcome is reconciled by key or handed to a person;
every state change writes its timeline event in the same transaction.

Modules, in the order a step meets them: start (runs), claim (lease the next step), steps (run
it: one executor per kind), calls (parameters, call context, scope), ledger (the side-effect
protocol and reconciliation), record (commit what happened), routing (the one place a failure
is decided), compensation, waits (events, timers, deadlines), sweep (re-derive due work),
execute (the loop), dispatch (Celery hints). People are reached through runs.people only.
Other apps use the names below, never the modules (approvals imports `runs.engine` only).
"""

from runs.engine.claim import Claim, claim_next
from runs.engine.compensation import BY_HAND_QUEUE, begin_compensation, undoable
from runs.engine.context import build_context, prior_results_summary
from runs.engine.dispatch import enqueue
from runs.engine.execute import advance, advance_each, invoke_step, run_until_quiet
from runs.engine.gate import params_change
from runs.engine.ledger import IdempotencyKeyConflict, Verdict, idempotency_key_for
from runs.engine.outcomes import Outcome
from runs.engine.record import record_outcome
from runs.engine.routing import Origin, Route, choose, decide, end_step, route_failure, tool_risk
from runs.engine.start import BusinessKeyConflict, StartError, start_run
from runs.engine.steps import execute
from runs.engine.sweep import SweepReport, sweep
from runs.engine.waits import deliver_event

__all__ = [
    "BY_HAND_QUEUE",
    "BusinessKeyConflict",
    "Claim",
    "IdempotencyKeyConflict",
    "Origin",
    "Outcome",
    "Route",
    "StartError",
    "SweepReport",
    "Verdict",
    "advance",
    "advance_each",
    "begin_compensation",
    "build_context",
    "choose",
    "claim_next",
    "decide",
    "deliver_event",
    "end_step",
    "enqueue",
    "execute",
    "idempotency_key_for",
    "invoke_step",
    "params_change",
    "prior_results_summary",
    "record_outcome",
    "route_failure",
    "run_until_quiet",
    "start_run",
    "sweep",
    "tool_risk",
    "undoable",
]

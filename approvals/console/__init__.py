"""What the console shows: the inbox and run-list queries, and a run's context for a person
(timeline, pending snapshot, why it stopped, the suggested next action, which actions apply).

Views load rows and call these; nothing here changes state (approvals/actions.py does that).

One module each, importing only those before it: `labels` (what people read, and `sentence`,
which renders a sentence from its partial under templates/console/sentences/ with every value
escaped) ← `context` (what a run's page is built from) ← `next_action` (which sentence: the
suggested next action, how a run ended, what happens next) ← `run_page` (a run as a person sees
it); `inbox` (the inbox and run-list queries). Re-exported here.
"""

from approvals.console.context import (
    Pending,
    RunContext,
    TimelineItem,
)
from approvals.console.inbox import (
    PARKED_STATUSES,
    awaits_approval,
    filter_choices,
    inbox_counts,
    inbox_queryset,
    reason_filter,
    reason_of,
    search_runs,
    unclaimed,
)
from approvals.console.labels import (
    CURRENCY_DECIMALS,
    DECISION_LABELS,
    EFFECT_STATUS_LABELS,
    ENGINE_SENTENCES,
    FAILURE_CLASS_LABELS,
    FAILURE_LABELS,
    PAGE_SIZE,
    REASON_LABELS,
    RISK_LABELS,
    RUN_STATUS_LABELS,
    SECOND_APPROVAL,
    STEP_KIND_LABELS,
    STEP_STATUS_LABELS,
    VERB_LABELS,
    amount_of,
    engine_text,
    failure_class_choices,
    label,
    sentence,
    sentences,
)
from approvals.console.next_action import (
    conflict_message,
    how_it_ended,
    idle_sentence,
    suggest_next_action,
    what_happens_next,
)
from approvals.console.run_page import (
    JSON_PREVIEW_CHARS,
    JSON_PREVIEW_DEPTH,
    JsonPreview,
    available_actions,
    build_run_context,
    changed_side,
    human_duration,
    not_yours_to_approve,
    preview_json,
    readable_results,
    to_pretty_json,
)
from approvals.permissions import is_admin  # approvals/metrics_views.py reads it here

__all__ = [
    "is_admin",
    "PAGE_SIZE",
    "RUN_STATUS_LABELS",
    "STEP_STATUS_LABELS",
    "EFFECT_STATUS_LABELS",
    "FAILURE_LABELS",
    "SECOND_APPROVAL",
    "REASON_LABELS",
    "failure_class_choices",
    "STEP_KIND_LABELS",
    "VERB_LABELS",
    "DECISION_LABELS",
    "FAILURE_CLASS_LABELS",
    "RISK_LABELS",
    "label",
    "ENGINE_SENTENCES",
    "engine_text",
    "sentence",
    "sentences",
    "CURRENCY_DECIMALS",
    "amount_of",
    "TimelineItem",
    "Pending",
    "RunContext",
    "reason_of",
    "PARKED_STATUSES",
    "reason_filter",
    "unclaimed",
    "awaits_approval",
    "inbox_queryset",
    "inbox_counts",
    "filter_choices",
    "search_runs",
    "suggest_next_action",
    "how_it_ended",
    "idle_sentence",
    "what_happens_next",
    "conflict_message",
    "JSON_PREVIEW_CHARS",
    "JSON_PREVIEW_DEPTH",
    "to_pretty_json",
    "JsonPreview",
    "preview_json",
    "readable_results",
    "build_run_context",
    "changed_side",
    "not_yours_to_approve",
    "human_duration",
    "available_actions",
]

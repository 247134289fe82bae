"""People in the loop: approval requests, takeovers, every human decision, and escalation rules.

One module per aggregate, each importing only those it builds on: `requests` (approval requests,
takeovers, human decisions) ← `rules` (escalation rules, their versions, tool pauses) ←
`claims` (soft claims, the queues people work from); `tool_metadata` (local decisions over a
tool's metadata), `notifications` (SLA breaches, channels, deliveries), `bulk` (bulk actions),
`records` (the audit records and their head). The metrics tables live with the metrics, in
`approvals/metrics/tables.py`, and are re-exported here. Everything else imports from
`approvals.models`.
"""

from approvals.metrics.tables import (
    SKETCH_FIELDS,
    SUM_FIELDS,
    TOOL_FIELDS,
    VALUE_FIELDS,
    MetricCounts,
    MetricsCounter,
    MetricsCounterMark,
    MetricsDay,
    MetricsHour,
    MetricSums,
    PeriodSums,
    RunMetrics,
)
from approvals.models.bulk import (
    MAX_RUNS,
    BulkAction,
    BulkActionItem,
    BulkItemQuerySet,
    BulkItemStatus,
    BulkStatus,
    BulkVerb,
)
from approvals.models.claims import (
    ClaimHeld,
    SoftClaim,
    known_queues,
    routed_queues,
)
from approvals.models.notifications import (
    ChannelKind,
    DeliveryStatus,
    NotificationChannel,
    NotificationCursor,
    NotificationDelivery,
    SlaBreach,
)
from approvals.models.records import (
    AuditRecord,
    AuditRecordHead,
)
from approvals.models.requests import (
    ApprovalRequest,
    ApprovalStatus,
    DecisionVerb,
    HumanDecision,
    RuleAction,
    Takeover,
    params_diff,
    shown,
)
from approvals.models.rules import (
    EscalationRule,
    RuleChange,
    RulesStamp,
    RuleVersion,
    ToolPause,
)
from approvals.models.slack import SlackIdentity, SlackMessage
from approvals.models.tool_metadata import (
    OVERRIDABLE,
    RISK_ORDER,
    MetadataConflict,
    MetadataLoosened,
    ToolMetadataOverride,
    loosened,
    metadata_of,
)

__all__ = [
    "ApprovalStatus",
    "ApprovalRequest",
    "shown",
    "params_diff",
    "Takeover",
    "DecisionVerb",
    "HumanDecision",
    "RuleAction",
    "EscalationRule",
    "RuleChange",
    "RulesStamp",
    "RuleVersion",
    "ToolPause",
    "OVERRIDABLE",
    "RISK_ORDER",
    "metadata_of",
    "loosened",
    "MetadataConflict",
    "MetadataLoosened",
    "ToolMetadataOverride",
    "SlaBreach",
    "ChannelKind",
    "NotificationChannel",
    "DeliveryStatus",
    "NotificationDelivery",
    "NotificationCursor",
    "SlackIdentity",
    "SlackMessage",
    "MetricCounts",
    "MetricSums",
    "PeriodSums",
    "SUM_FIELDS",
    "VALUE_FIELDS",
    "TOOL_FIELDS",
    "SKETCH_FIELDS",
    "RunMetrics",
    "MetricsDay",
    "MetricsHour",
    "MetricsCounter",
    "MetricsCounterMark",
    "ClaimHeld",
    "SoftClaim",
    "known_queues",
    "routed_queues",
    "MAX_RUNS",
    "BulkVerb",
    "BulkStatus",
    "BulkItemStatus",
    "BulkAction",
    "BulkItemQuerySet",
    "BulkActionItem",
    "AuditRecord",
    "AuditRecordHead",
]

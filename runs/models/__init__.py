"""The durable data model: runs, steps, snapshots, the side-effect ledger, waits and the timeline.

Every status column has a check constraint and a transition table; a transition is a conditional
UPDATE (compare-and-set on the current status) that writes its timeline event in the same
transaction, so two concurrent callers can never both win and no state change goes unrecorded.

One module per aggregate, each importing only the ones it builds on (values ← base ← timeline
← run ← step ← ledger, waits): `values` (canonical JSON, digests, the chain hash), `base`
(errors, status fields, enumerations, unsaved rows), `timeline` (the hash-chained events and the
chain heads), `run`, `step` (with the waits a step is parked on), `ledger` (snapshots, side
effects, what the consistency check found), `waits` (workers, inbound events). Everything else
imports from `runs.models`.
"""

from runs.api.models import ApiClient, ApiScope
from runs.models.base import (
    LEASE_UNEXPIRED,
    ChoicesField,
    ConcurrentUpdate,
    FailureClass,
    ImmutableModel,
    ImmutableQuerySet,
    ImmutableRecord,
    InvalidTransition,
    Lease,
    Receipt,
    RecoveryCause,
    Risk,
    RouteAction,
    SqlValue,
    StepKind,
    TransitionError,
    _choices_check,
    db_json,
    new_row,
)
from runs.models.ledger import (
    SNAPSHOT_FIELDS,
    ConsistencyCursor,
    ExternalMismatch,
    MismatchKind,
    SideEffect,
    SideEffectStatus,
    Snapshot,
)
from runs.models.run import (
    Run,
    RunStatus,
)
from runs.models.step import (
    Step,
    StepStatus,
    Wait,
    WaitKind,
    WaitStatus,
)
from runs.models.timeline import (
    ChainHeads,
    TimelineEvent,
    chain_heads,
)
from runs.models.values import (
    ALIKE_LEAVES,
    READ_PARAMS_MAX_CHARS,
    READ_PREVIEW_CHARS,
    SHOWN_CHARS,
    canonical_json,
    chain_hash,
    digest,
    from_canonical_json,
    json_loads,
    json_string,
    orjson_encodes_alike,
    plain_chain_hash,
    read_record,
    shown,
    text_digest,
    to_json_value,
)
from runs.models.waits import (
    InboundEvent,
    Worker,
)

__all__ = [
    "ApiClient",
    "ApiScope",
    "chain_hash",
    "plain_chain_hash",
    "json_string",
    "canonical_json",
    "orjson_encodes_alike",
    "ALIKE_LEAVES",
    "to_json_value",
    "from_canonical_json",
    "json_loads",
    "digest",
    "text_digest",
    "READ_PARAMS_MAX_CHARS",
    "READ_PREVIEW_CHARS",
    "read_record",
    "SHOWN_CHARS",
    "shown",
    "TransitionError",
    "InvalidTransition",
    "ConcurrentUpdate",
    "ImmutableRecord",
    "Lease",
    "_choices_check",
    "ChoicesField",
    "ImmutableQuerySet",
    "ImmutableModel",
    "FailureClass",
    "RecoveryCause",
    "Risk",
    "RouteAction",
    "StepKind",
    "new_row",
    "LEASE_UNEXPIRED",
    "SqlValue",
    "db_json",
    "Receipt",
    "TimelineEvent",
    "ChainHeads",
    "chain_heads",
    "RunStatus",
    "Run",
    "StepStatus",
    "Step",
    "SNAPSHOT_FIELDS",
    "Snapshot",
    "SideEffectStatus",
    "SideEffect",
    "MismatchKind",
    "ExternalMismatch",
    "ConsistencyCursor",
    "WaitKind",
    "WaitStatus",
    "Wait",
    "Worker",
    "InboundEvent",
]

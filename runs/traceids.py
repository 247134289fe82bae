"""A run's trace: the OpenTelemetry ids every span of one run shares, derived from the run's id.

Every span of a run (its steps, their tool calls and model requests, the people's decisions, the
run's own span) is in one trace, whichever process made it: web, any worker, a worker started
again after a crash. The ids are computed from the run's UUID rather than drawn at random and
stored, so nothing is written for them and the console names the trace of any run:

- the trace id is the first 16 bytes of sha256("taskpilots.trace:" + the run's 16 bytes);
- the run's own span (the root of the trace, exported when the run ends) has the next 8 bytes.

Not the run's UUID itself, although a trace id is 128 bits too: a version 4 UUID has fixed bits
(the version and variant), and the OpenTelemetry SDK's ratio sampler compares the low 64 bits
of the trace id with its bound; the variant bits there would make a sampling ratio under 0.5
sample no run at all. A digest is uniform, so the configured sampler keeps the share of runs it
is asked for, and decides the same for a run in every process (taskpilots/otel/spans.py).

Nothing here imports OpenTelemetry: the console computes a run's trace id with tracing off in
its own process too (it shows it when TASKPILOTS_OTEL=1).
"""

from __future__ import annotations

import hashlib
import uuid

_PREFIX = b"taskpilots.trace:"


def _digest(run_id) -> bytes:
    value = run_id if isinstance(run_id, uuid.UUID) else uuid.UUID(str(run_id))
    return hashlib.sha256(_PREFIX + value.bytes).digest()


def ids(run_id) -> tuple[int, int]:
    """(trace id, the run span's id) of the run, as the integers OpenTelemetry takes; never 0
    (an invalid id)."""
    digest = _digest(run_id)
    trace_id = int.from_bytes(digest[:16], "big") or 1
    span_id = int.from_bytes(digest[16:24], "big") or 1
    return trace_id, span_id


def trace_id_hex(run_id) -> str:
    """The run's trace id as trace viewers write it: 32 lower-case hex digits."""
    return f"{ids(run_id)[0]:032x}"

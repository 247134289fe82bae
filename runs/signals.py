"""Signals the core sends for what other apps keep beside it (runs never imports them)."""

from __future__ import annotations

from django.dispatch import Signal

# Sent (with `now`) before prune_payloads drops the payloads of old finished runs: whatever
# reads those payloads stores what it needs first (approvals.metrics rolls up their figures).
payloads_pruning = Signal()

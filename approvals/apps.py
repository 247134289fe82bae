from __future__ import annotations

from django.apps import AppConfig


class ApprovalsConfig(AppConfig):
    name = "approvals"
    verbose_name = "Approvals and escalation"

    def ready(self) -> None:
        # The engine reaches people only through runs.people: this is where they answer.
        from approvals import local_metadata
        from approvals.people import People
        from runs import people, signals

        people.register(People())
        # Admins' decisions over tools' own metadata (People.local_metadata) follow the
        # connection: the cache learns of changes when the process connects.
        local_metadata.install()
        signals.payloads_pruning.connect(_before_pruning, dispatch_uid="metrics-rollup")


def _before_pruning(sender, **kwargs) -> None:
    # The metrics (approvals.metrics.store.before_pruning) are imported when payloads are
    # pruned, not by every process that starts: a worker's start stays short (approvals.tasks).
    from approvals.metrics import store

    store.before_pruning(sender, **kwargs)

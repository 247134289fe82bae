from __future__ import annotations

from django.apps import AppConfig


class ApprovalsConfig(AppConfig):
    name = "approvals"
    verbose_name = "Approvals and escalation"

    def ready(self) -> None:
        # The engine reaches people only through runs.people: this is where they answer.
        from approvals import local_metadata, metrics
        from approvals.people import People
        from runs import people, signals

        people.register(People())
        # Admins' decisions over tools' own metadata, applied by runs.tools.get (cached).
        local_metadata.install()
        signals.payloads_pruning.connect(metrics.before_pruning, dispatch_uid="metrics-rollup")

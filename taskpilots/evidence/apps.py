from __future__ import annotations

from django.apps import AppConfig


class EvidenceConfig(AppConfig):
    """Evidence tooling: benchmarks, recovery drills, the load generator, real worker processes
    and scratch databases, reached through `manage.py bench|drill|load_fake_runs`. Never
    imported by the engine or the console."""

    name = "taskpilots.evidence"
    label = "evidence"
    verbose_name = "Evidence tooling"

    def ready(self) -> None:
        from taskpilots.evidence import faults

        faults.install_from_environment()

from __future__ import annotations

from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "runs"
    verbose_name = "Runs"

    def ready(self) -> None:
        # Workflows and tools register themselves on import.
        from runs import registry

        registry.autodiscover()

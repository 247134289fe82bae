from __future__ import annotations

from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "runs"
    verbose_name = "Runs"

    def ready(self) -> None:
        # Workflows and tools register themselves on import; the workflow registry also gives
        # the rehydration document its pending steps.
        from runs import registry, workflows  # noqa: F401

        registry.autodiscover()

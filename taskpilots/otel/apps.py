from __future__ import annotations

from django.apps import AppConfig
from django.core.exceptions import ImproperlyConfigured

from taskpilots.otel import OTEL_EXTRA


class OtelConfig(AppConfig):
    """OpenTelemetry traces, installed by settings only when TASKPILOTS_OTEL=1: sets up the SDK
    and the instrumentation, and registers the spans on the engine's hook points."""

    name = "taskpilots.otel"
    label = "otel"
    verbose_name = "OpenTelemetry traces"

    def ready(self) -> None:
        try:
            from taskpilots.otel import setup
        except ImportError as exc:
            missing = exc.name or str(exc)
            raise ImproperlyConfigured(
                f"TASKPILOTS_OTEL=1 needs the otel extra, and {missing} is not installed: "
                f"{OTEL_EXTRA} (or unset TASKPILOTS_OTEL to run without traces)"
            ) from exc
        setup.install()

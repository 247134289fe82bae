"""OpenTelemetry traces of runs: a trace per run, a span per step execution, tool call, model
request and human decision, exported by OTLP (docs/deploy.md, "Traces"). The `otel` extra.

Off unless `TASKPILOTS_OTEL=1`. On, settings install this package as an app; its `ready()` sets
up the SDK, the Django and Celery instrumentation (setup.py) and registers the spans on the
engine's hook points (spans.py, runs/hooks.py) in every process that loads Django: the web
server, the workers, beat and the commands. Off, the app is not installed, nothing of
OpenTelemetry is imported, and the engine's hook lists stay empty (a list check where they
are consulted).

This module imports nothing of OpenTelemetry: settings read the switch and check the
configuration here, before any package of the extra is needed.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

from taskpilots.env import env_bool

OTEL_EXTRA = "pip install 'taskpilots[otel]'"
# OTEL_TRACES_EXPORTER values we understand (the standard variable; "otlp" when unset).
EXPORTERS = ("otlp", "console", "none")
# Only OTLP over HTTP is installed by the extra (opentelemetry-exporter-otlp-proto-http).
PROTOCOLS = ("http/protobuf",)
# Requests not worth a trace unless asked for (OTEL_PYTHON_DJANGO_EXCLUDED_URLS replaces it):
# health checks, metrics scrapes, static files and the console's live polls (every 2 s).
DEFAULT_EXCLUDED_URLS = "healthz,metrics,static/,console/live/,console/runs/[^/]+/live/"


def _standard_true(name: str) -> bool:
    # The OpenTelemetry specification's booleans: "true" in any case is true, anything else not.
    return os.environ.get(name, "").strip().lower() == "true"


def enabled() -> bool:
    """Whether this process traces: `TASKPILOTS_OTEL=1`, unless the standard
    `OTEL_SDK_DISABLED=true` turns the SDK off. An OTLP endpoint alone does not turn it on: a
    platform may set OTEL_* variables for every process it starts, and traces cost a worker CPU
    time, so the switch is ours (docs/deploy.md)."""
    return env_bool("TASKPILOTS_OTEL", False) and not _standard_true("OTEL_SDK_DISABLED")


def check_environment() -> None:
    """Refuse, at start-up and with the variable's name, what tracing on could not honour."""
    exporter = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() or "otlp"
    if exporter not in EXPORTERS:
        raise ImproperlyConfigured(
            f"OTEL_TRACES_EXPORTER={exporter!r} is not supported: use otlp (the default), "
            "console or none"
        )
    for name in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        protocol = os.environ.get(name, "").strip()
        if protocol and protocol not in PROTOCOLS:
            raise ImproperlyConfigured(
                f"{name}={protocol!r} is not supported: TaskPilots exports OTLP over HTTP; set "
                f"{name}=http/protobuf and point the endpoint at the collector's HTTP port "
                "(4318 by default)"
            )
        if protocol:
            break


def trace_url() -> str:
    """`TASKPILOTS_TRACE_URL`: where the console links a run's trace, with `{trace_id}` (and
    `{run_id}`, if the viewer searches by it) replaced; empty for no link."""
    template = (os.environ.get("TASKPILOTS_TRACE_URL") or "").strip()
    if not template:
        return ""
    if urlsplit(template).scheme not in ("http", "https"):
        raise ImproperlyConfigured(
            f"TASKPILOTS_TRACE_URL={template!r} must be an http(s) address, e.g. "
            "https://tempo.example/trace/{trace_id}"
        )
    if "{trace_id}" not in template and "{run_id}" not in template:
        raise ImproperlyConfigured(
            f"TASKPILOTS_TRACE_URL={template!r} names no trace: put {{trace_id}} (or {{run_id}}) "
            "where the viewer's address takes it, e.g. https://tempo.example/trace/{trace_id}"
        )
    return template

"""Setting up OpenTelemetry in a process that traces (TASKPILOTS_OTEL=1, taskpilots/otel): the
tracer provider and its exporter, the Django and Celery instrumentation, the engine's spans.

The standard OTEL_* variables configure what they always do: the exporter's endpoint, headers,
timeout and compression (OTEL_EXPORTER_OTLP_*), the sampler (OTEL_TRACES_SAMPLER and its
argument), the resource (OTEL_SERVICE_NAME, default "taskpilots"; OTEL_RESOURCE_ATTRIBUTES), the
batch processor's queue and delays (OTEL_BSP_*), and the requests Django does not trace
(OTEL_PYTHON_DJANGO_EXCLUDED_URLS; by default health checks, metrics, static files and the
console's live polls).
"""

from __future__ import annotations

import os

from opentelemetry import trace
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.instrumentation.django import DjangoInstrumentor
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

from taskpilots.otel import DEFAULT_EXCLUDED_URLS, spans

DEFAULT_SERVICE_NAME = "taskpilots"

# This process's spans once install() ran (Django may call ready() once only, but a test that
# installs the app again must not instrument twice).
installed: spans.Spans | None = None


def make_provider(*processors: SpanProcessor) -> TracerProvider:
    """A provider whose ids are the runs' where a run's own span starts (spans.RunIds), with the
    resource and sampler the environment configures."""
    resource = Resource.create({})
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    provider = TracerProvider(resource=resource, id_generator=spans.RunIds())
    for processor in processors:
        provider.add_span_processor(processor)
    return provider


def exporting() -> list[SpanProcessor]:
    """OTEL_TRACES_EXPORTER: otlp (the default, over HTTP), console, or none (spans are made and
    dropped: the console still shows trace ids). Checked at start-up (check_environment)."""
    name = (os.environ.get("OTEL_TRACES_EXPORTER") or "otlp").strip().lower()
    if name == "none":
        return []
    if name == "console":
        return [BatchSpanProcessor(ConsoleSpanExporter())]
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return [BatchSpanProcessor(OTLPSpanExporter())]


def install() -> spans.Spans:
    """Trace this process: the provider (also the global one, for code that asks for it), the
    engine's spans, Django's requests and Celery's tasks. Called by the app's ready()."""
    global installed
    if installed is not None:
        return installed
    provider = make_provider(*exporting())
    trace.set_tracer_provider(provider)
    installed = spans.register(provider)
    excluded = (
        os.environ.get("OTEL_PYTHON_DJANGO_EXCLUDED_URLS")
        or os.environ.get("OTEL_PYTHON_EXCLUDED_URLS")
        or DEFAULT_EXCLUDED_URLS
    )
    DjangoInstrumentor().instrument(tracer_provider=provider, excluded_urls=excluded)
    CeleryInstrumentor().instrument(tracer_provider=provider)
    return installed

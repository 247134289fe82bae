"""The tracing switch and its configuration (taskpilots/otel/__init__.py): read at start-up,
refused with the variable's name when tracing could not honour it."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from taskpilots import otel


@pytest.fixture(autouse=True)
def no_otel_environment(monkeypatch):
    for name in (
        "TASKPILOTS_OTEL",
        "TASKPILOTS_TRACE_URL",
        "OTEL_SDK_DISABLED",
        "OTEL_TRACES_EXPORTER",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    ):
        monkeypatch.delenv(name, raising=False)


def test_off_unless_asked_for_and_an_endpoint_alone_does_not_turn_it_on(monkeypatch):
    assert otel.enabled() is False
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    assert otel.enabled() is False
    monkeypatch.setenv("TASKPILOTS_OTEL", "1")
    assert otel.enabled() is True
    monkeypatch.setenv("OTEL_SDK_DISABLED", "TRUE")
    assert otel.enabled() is False


def test_a_switch_that_is_not_a_boolean_is_refused(monkeypatch):
    monkeypatch.setenv("TASKPILOTS_OTEL", "otlp")
    with pytest.raises(ImproperlyConfigured, match="TASKPILOTS_OTEL"):
        otel.enabled()


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("OTEL_TRACES_EXPORTER", "zipkin", "use otlp"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc", "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf"),
        ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc", "4318"),
    ],
)
def test_what_tracing_cannot_honour_is_refused_with_the_variable(monkeypatch, name, value, says):
    otel.check_environment()
    monkeypatch.setenv(name, value)
    with pytest.raises(ImproperlyConfigured, match=name) as refused:
        otel.check_environment()
    assert says in str(refused.value)


def test_the_traces_protocol_wins_over_the_general_one(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")
    otel.check_environment()


def test_the_trace_url_names_the_trace_and_is_a_web_address(monkeypatch):
    assert otel.trace_url() == ""
    monkeypatch.setenv("TASKPILOTS_TRACE_URL", "https://tempo.example/trace/{trace_id}")
    assert otel.trace_url() == "https://tempo.example/trace/{trace_id}"
    monkeypatch.setenv("TASKPILOTS_TRACE_URL", "https://tempo.example/trace/")
    with pytest.raises(ImproperlyConfigured, match=r"put \{trace_id\}"):
        otel.trace_url()
    monkeypatch.setenv("TASKPILOTS_TRACE_URL", "javascript:alert({trace_id})")
    with pytest.raises(ImproperlyConfigured, match="http"):
        otel.trace_url()

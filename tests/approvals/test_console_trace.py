"""The run page names a run's trace when this deployment traces (TASKPILOTS_OTEL=1), and links
it to the trace viewer TASKPILOTS_TRACE_URL names (docs/deploy.md, "Traces")."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from runs import engine, traceids

pytestmark = pytest.mark.django_db


@pytest.fixture
def page(support_user):
    http = Client()
    http.force_login(support_user)
    run, _ = engine.start_run("test.flaky", {"fail_times": 0})
    url = reverse("console:run-detail", args=[run.pk])
    return run, lambda **headers: http.get(url, **headers).content.decode()


def test_tracing_off_the_page_names_no_trace(page, settings):
    settings.OTEL, settings.TRACE_URL = False, "https://tempo.example/trace/{trace_id}"
    run, get = page
    html = get()
    assert traceids.trace_id_hex(run.pk) not in html
    assert "<dt>Trace</dt>" not in html


def test_tracing_on_the_page_shows_the_trace_id(page, settings):
    settings.OTEL, settings.TRACE_URL = True, ""
    run, get = page
    trace_id = traceids.trace_id_hex(run.pk)
    html = get()
    assert f'<dt>Trace</dt><dd class="mono">{trace_id}</dd>' in html
    assert "tempo.example" not in html
    # In Chinese too.
    assert "<dt>链路追踪</dt>" in get(HTTP_ACCEPT_LANGUAGE="zh-Hans")


def test_with_a_trace_url_the_trace_id_links_to_the_viewer(page, settings):
    settings.OTEL = True
    settings.TRACE_URL = "https://grafana.example/explore?trace={trace_id}&run={run_id}"
    run, get = page
    trace_id = traceids.trace_id_hex(run.pk)
    link = f"https://grafana.example/explore?trace={trace_id}&amp;run={run.pk}"  # escaped
    assert f'<a href="{link}" rel="noopener noreferrer">{trace_id}</a>' in get()

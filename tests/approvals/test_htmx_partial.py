"""approvals.htmx.htmx_partial: the whole page unless an htmx request targets one of its parts."""

from __future__ import annotations

from django.test import RequestFactory
from django_htmx.middleware import HtmxDetails

from approvals.htmx import htmx_partial


def _request(**headers):
    request = RequestFactory().get("/console/", headers=headers)
    request.htmx = HtmxDetails(request)
    return request


def test_a_plain_request_gets_the_whole_template():
    assert htmx_partial(_request(), "page.html", "results") == "page.html"
    assert htmx_partial(_request(), "page.html", always="main") == "page.html"


def test_an_htmx_request_gets_the_partial_it_targets_and_only_those_named():
    hx = {"HX-Request": "true", "HX-Target": "results"}
    assert htmx_partial(_request(**hx), "page.html", "results", "other") == "page.html#results"
    assert htmx_partial(_request(**hx), "page.html", "other") == "page.html"
    assert htmx_partial(_request(**{"HX-Request": "true"}), "page.html", "results") == "page.html"


def test_always_answers_every_htmx_request_with_that_part():
    hx = {"HX-Request": "true", "HX-Target": "anything"}
    assert htmx_partial(_request(**hx), "page.html", always="main") == "page.html#main"

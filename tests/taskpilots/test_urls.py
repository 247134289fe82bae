"""The site's own addresses outside the console and the API."""

from __future__ import annotations


def test_the_browsers_favicon_request_finds_the_icon(client):
    # Browsers ask for /favicon.ico whatever a page's <link rel="icon"> says; it was a 404.
    response = client.get("/favicon.ico")
    assert response.status_code == 301 and response["Location"].endswith("favicon.svg")

"""Playwright driving Debian's Chromium against pytest-django's live server.

Never `playwright install`: the browser is the system's /usr/bin/chromium (`make test` installs
it with apt when it is missing).
"""

from __future__ import annotations

import os
import shutil

import pytest

# Playwright's sync API runs an event loop in this thread; the ORM calls the tests make between
# browser steps are still plain synchronous calls.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

PASSWORD = "correct horse battery"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


@pytest.fixture(scope="session")
def chromium():
    from playwright.sync_api import sync_playwright

    executable = shutil.which("chromium")
    if executable is None:
        pytest.fail("chromium is not installed (make test installs it with apt-get)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(chromium, live_server):
    context = chromium.new_context(
        base_url=live_server.url, locale="en-US", viewport={"width": 1440, "height": 1000}
    )
    context.set_default_timeout(10_000)
    page = context.new_page()
    page.console_errors = []
    page.on("console", lambda m: page.console_errors.append(m.text) if m.type == "error" else None)
    # A script that fails to parse or throws is a page error, not a console message: a conflict
    # marker once cut console.js and every feature after it was silently gone.
    page.on("pageerror", lambda exc: page.console_errors.append(f"page error: {exc}"))
    yield page
    context.close()


def log_in(page, username: str, password: str = PASSWORD) -> None:
    page.goto("/accounts/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click(".login button[type=submit]")
    page.wait_for_url("**/console/")

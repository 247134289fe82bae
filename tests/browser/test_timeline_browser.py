"""An auditor on a long run, in Chromium (issue 33 §1): the 768-event run's timeline page is
under 5,000 px at 1440 px, its first screen shows what went wrong and who decided what, a
chart marker takes the reader to its event, the collapsed retries unfold, nothing overflows
sideways at 390, 1024 and 1366 px, and the first byte comes in under 300 ms with 100k runs in
the table. No script or CSP error on the way.

With TASKPILOTS_SCREENSHOTS=1 it also saves docs/screenshots/timeline-reading-*.png.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.browser.conftest import log_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

OUT = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
TTFB = "(() => { const n = performance.getEntriesByType('navigation')[0]; return n.responseStart - n.requestStart; })()"  # noqa: E501
OVERFLOW = "document.documentElement.scrollWidth - document.documentElement.clientWidth"


def _bottom(page, selector: str) -> float:
    box = page.locator(selector).first.bounding_box()
    assert box is not None, selector
    return box["y"] + box["height"]


def test_an_auditor_reads_a_768_event_run(page, sandbox):
    from runs.models import TimelineEvent
    from tests.approvals.timeline_helpers import TOTAL_EVENTS, long_run, seed_runs
    from tests.factories import UserFactory

    support = UserFactory(username="mei.support", groups=["support"])
    run = long_run(support)
    assert run.event_seq == TOTAL_EVENTS
    seed_runs(100_000)
    UserFactory(username="ada.auditor", groups=["auditor"])
    log_in(page, "ada.auditor")
    url = f"/console/runs/{run.pk}/timeline/"

    # First byte: the best of three loads, with 100k runs in the table.
    timings = []
    for _ in range(3):
        page.goto(url)
        timings.append(page.evaluate(TTFB))
    assert min(timings) < 300, timings

    # The page is short enough to read, and its first screen answers the auditor's questions.
    height = page.evaluate("document.documentElement.scrollHeight")
    assert height < 5000, height
    assert page.locator(".tl-failures").is_visible()
    assert _bottom(page, ".tl-failures") < 1000
    assert _bottom(page, ".tl-decisions") < 1000
    assert "503" in page.locator(".tl-failures").inner_text()
    assert "mei.support" in page.locator(".tl-decisions").inner_text()
    assert "amount 150 → 120" in page.locator(".tl-decisions").inner_text()

    # A decision's marker on the chart takes the reader to its event's line (the last one drawn:
    # the decisions of one moment overlap, and the last is on top).
    marker = page.locator("svg.lanes a.marker-link:has(.marker--decision)").last
    anchor = marker.get_attribute("href").split("#", 1)[1]
    seq = int(anchor.removeprefix("event-"))
    assert TimelineEvent.objects.get(run=run, seq=seq).actor == "user:mei.support"
    marker.click()
    page.wait_for_url(f"**#{anchor}")
    line = page.locator(f"#{anchor}")
    box = line.bounding_box()
    assert box is not None and -2 <= box["y"] < 1000, box  # scrolled to (sub-pixel)
    # Its payload opens on demand.
    line.locator(".tl-body .json, .tl-body pre").first.wait_for()

    # The 109 identical retries are one line that unfolds.
    group = page.locator(".tl-line--group").first
    assert "attempts 2–110" in group.inner_text()
    group.locator("summary").click()
    group.locator(".tl-lines--nested > li").nth(100).wait_for()
    assert group.locator(".tl-lines--nested > li").count() == 109 * 5

    for width in (390, 1024, 1366):
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(url)
        assert page.evaluate(OVERFLOW) <= 0, width
    assert page.console_errors == []

    if os.environ.get("TASKPILOTS_SCREENSHOTS"):
        OUT.mkdir(parents=True, exist_ok=True)
        for width in (390, 1024, 1440):
            page.set_viewport_size({"width": width, "height": 1000})
            page.goto(url)
            page.screenshot(path=OUT / f"timeline-reading-{width}.png", full_page=width != 390)
        page.locator(".lang-switch button[value=zh-hans]").click()
        page.goto(url)
        page.screenshot(path=OUT / "timeline-reading-zh-hans.png", full_page=False)

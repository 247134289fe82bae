"""The console on a phone, a laptop and a desk screen, by keyboard, for low vision and under the
CSP: the inbox, a run waiting for approval and the audit list, measured in Chromium.

Issue 33 §5: the top bar was 780 px wide at 390 px, Approve sat at y = 2,853 px, the inbox hid
three columns at 1024 px without a sign, muted text was 4.40:1, and htmx swaps logged inline-style
CSP violations."""

from __future__ import annotations

import pytest
from axe_playwright_python.sync_playwright import Axe
from playwright.sync_api import expect

from approvals.models import HumanDecision
from runs.models import Run
from tests.approvals.console_helpers import approval_run, invalid_data_run
from tests.browser.conftest import PASSWORD, log_in
from tests.factories import UserFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WIDTHS = (390, 1024, 1366)
# How far the page scrolls sideways: 0 when nothing sticks out of the viewport.
OVERFLOW = "() => document.documentElement.scrollWidth - document.documentElement.clientWidth"
WRAP_SCROLLS = "(wrap) => wrap.scrollWidth > wrap.clientWidth + 1"
# The inbox's Owner cell and its sticky "Open →" cell in the first row.
OWNER_AND_OPEN = """() => {
  const heads = [...document.querySelectorAll("table.runs thead th")]
    .map((th) => th.textContent.trim());
  const row = document.querySelector("table.runs tbody tr");
  const box = (cell) => cell.getBoundingClientRect().toJSON();
  return [box(row.children[heads.indexOf("Owner")]), box(row.querySelector(".open-cell"))];
}"""
# Violations are reported as DOM events too (also those Chromium does not print to the console),
# passed to the test through a binding, so none is lost when the page navigates.
CSP_EVENTS = """document.addEventListener("securitypolicyviolation", (event) => {
  window.reportCspViolation(event.violatedDirective + " " + event.blockedURI);
});"""
AXE_RULES = {"runOnly": {"type": "rule", "values": [
    "color-contrast", "label", "select-name", "button-name", "link-name", "aria-input-field-name",
]}}  # fmt: skip


@pytest.fixture
def people(db):
    support = UserFactory(username="mei.support", groups=["support", "auditor"])
    return support


@pytest.fixture
def runs(sandbox):
    approval = approval_run(note="Charged twice for order 88412")
    invalid_data_run()
    for n in range(3):
        approval_run(payment=f"pay_{n}")
    return approval


def _pages(run: Run) -> dict[str, str]:
    return {
        "inbox": "/console/",
        "run": f"/console/runs/{run.pk}/",
        "audit": "/console/audit/?workflow=test.refund",
    }


def _context(chromium, live_server, width: int, height: int = 900, locale: str = "en-US"):
    context = chromium.new_context(
        base_url=live_server.url, locale=locale, viewport={"width": width, "height": height}
    )
    context.set_default_timeout(10_000)
    context.add_init_script(CSP_EVENTS)
    page = context.new_page()
    page.csp_messages = []
    page.expose_function("reportCspViolation", lambda text: page.csp_messages.append(text))
    page.on(
        "console",
        lambda m: page.csp_messages.append(m.text) if "Content Security Policy" in m.text else None,
    )
    return page


def _csp_violations(page) -> list[str]:
    return page.csp_messages


def test_no_page_scrolls_sideways_at_phone_laptop_and_desk_widths(
    chromium, live_server, people, runs
):
    for width in WIDTHS:
        page = _context(chromium, live_server, width)
        log_in(page, people.username, PASSWORD)
        for name, url in _pages(runs).items():
            page.goto(url)
            assert page.evaluate(OVERFLOW) == 0, f"{name} scrolls sideways at {width} px"
            # A list wider than its card says so; on a phone and a desk screen none is.
            for wrap in page.locator(".table-wrap").all():
                scrolls = wrap.evaluate(WRAP_SCROLLS)
                if width == 1024 and name != "audit":
                    assert not scrolls or "is-scrollable" in wrap.get_attribute("class"), name
                    assert not scrolls or page.locator(".scroll-hint").first.is_visible(), name
                else:
                    assert not scrolls, f"{name}'s table scrolls at {width} px"
            assert not _csp_violations(page), (name, _csp_violations(page))
        page.context.close()


def test_the_other_console_pages_fit_a_phone_and_a_laptop(chromium, live_server, admin_user):
    pages = ["/console/runs/", "/console/metrics/", "/console/rules/", "/console/rules/new/",
             "/console/rules/tools/", "/console/rules/channels/", "/console/tokens/",
             "/console/bulk/new/"]  # fmt: skip
    for width in (390, 1024):
        page = _context(chromium, live_server, width)
        log_in(page, admin_user.username, PASSWORD)
        for url in pages:
            page.goto(url)
            assert page.evaluate(OVERFLOW) == 0, f"{url} scrolls sideways at {width} px"
        page.context.close()


def test_on_a_phone_the_top_bar_fits_and_approve_is_on_the_first_screen(
    chromium, live_server, people, runs
):
    page = _context(chromium, live_server, 390, 844)
    log_in(page, people.username, PASSWORD)
    for name in ("Log out", "English"):
        box = page.get_by_role("button", name=name).bounding_box()
        assert box and box["x"] >= 0 and box["x"] + box["width"] <= 390, name
    # Each inbox row is a card: the reason badge is whole, not clipped.
    badge = page.locator("table.runs tbody tr .badge").first.bounding_box()
    assert badge["x"] >= 0 and badge["x"] + badge["width"] <= 390
    page.goto(_pages(runs)["run"])
    approve = page.get_by_role("button", name="Approve", exact=True).bounding_box()
    assert approve["y"] + approve["height"] <= 844, approve
    page.context.close()


def test_the_sticky_open_button_never_covers_the_owner_column(chromium, live_server, people, runs):
    for width in (1366, 1440):
        page = _context(chromium, live_server, width)
        log_in(page, people.username, PASSWORD)
        owner, opener = page.evaluate(OWNER_AND_OPEN)
        assert owner["right"] <= opener["left"] + 1, (width, owner, opener)
        page.context.close()


@pytest.mark.parametrize("locale", ["en-US", "zh-Hans"])
def test_axe_finds_no_contrast_or_label_violations(chromium, live_server, people, runs, locale):
    page = _context(chromium, live_server, 1366, locale=locale)
    log_in(page, people.username, PASSWORD)
    axe = Axe()
    for name, url in _pages(runs).items():
        page.goto(url)
        found = [
            (violation["id"], node["target"], node["any"][0]["message"] if node["any"] else "")
            for violation in axe.run(page, options=AXE_RULES).response["violations"]
            for node in violation["nodes"]
        ]
        assert not found, (name, locale, found)
    page.context.close()


def test_htmx_swaps_log_no_csp_violation(chromium, live_server, people, runs):
    page = _context(chromium, live_server, 1366)
    log_in(page, people.username, PASSWORD)
    page.select_option("#id_reason", "approval")
    page.wait_for_url("**reason=approval**")
    page.wait_for_timeout(5_500)  # one live refresh of the inbox too
    page.goto(_pages(runs)["run"])
    expect(page.locator("#live .presence")).to_be_visible()  # the live bar's first swap
    page.wait_for_timeout(3_500)  # and its next poll
    page.get_by_role("tab", name="Event log").click()
    expect(page.locator("table.events")).to_be_visible()
    page.get_by_role("tab", name="Steps").click()
    expect(page.locator("ol.timeline")).to_be_visible()
    page.goto("/console/metrics/")
    page.goto(f"/console/runs/{runs.pk}/timeline/")
    assert not _csp_violations(page), _csp_violations(page)


def test_approving_by_keyboard_takes_four_key_presses(chromium, live_server, people, runs):
    page = _context(chromium, live_server, 1366)
    log_in(page, people.username, PASSWORD)
    page.goto("/console/?reason=approval")
    presses = ["j", "o", "a", "Enter"]
    for key in presses[:2]:
        page.keyboard.press(key)
    page.wait_for_url("**/console/runs/**")
    for key in presses[2:]:
        page.keyboard.press(key)
    expect(page.locator("#flash")).to_contain_text("Approved")
    assert HumanDecision.objects.filter(verb="approve").count() == 1
    assert len(presses) <= 4


def test_shortcuts_are_ignored_while_typing_and_listed_under_question_mark(
    chromium, live_server, people, runs
):
    page = _context(chromium, live_server, 1366)
    log_in(page, people.username, PASSWORD)
    page.goto(_pages(runs)["run"])
    page.locator("textarea").first.focus()
    page.keyboard.type("a")
    assert not page.locator("#shortcut-confirm").is_visible()
    page.evaluate("document.activeElement.blur()")
    page.keyboard.press("?")
    help_ = page.locator("#shortcut-help")
    expect(help_).to_be_visible()
    for text in ("j", "k", "Approve", "Reject", "Claim"):
        expect(help_).to_contain_text(text)
    page.keyboard.press("Escape")
    page.keyboard.press("r")  # the rejection form, its reason focused: the reason confirms
    assert page.evaluate("document.activeElement.closest('form').dataset.action") == "reject"
    page.evaluate("document.activeElement.blur()")
    page.keyboard.press("c")
    expect(page.locator("#live .claim")).to_contain_text("You are handling this")


def test_the_skip_link_is_first_and_lands_on_the_content(chromium, live_server, people, runs):
    page = _context(chromium, live_server, 1366)
    log_in(page, people.username, PASSWORD)
    page.keyboard.press("Tab")
    focused = page.evaluate("document.activeElement.textContent.trim()")
    assert focused == "Skip to content"
    page.keyboard.press("Enter")
    assert page.evaluate("document.activeElement.id") == "content"


def test_the_csp_check_catches_an_inline_style(chromium, live_server, people):
    """The check above can fail: markup with a style attribute is refused and reported."""
    page = _context(chromium, live_server, 1366)
    log_in(page, people.username, PASSWORD)
    page.evaluate("""document.body.insertAdjacentHTML("beforeend", '<p style="color:red">x</p>')""")
    expect(page.locator("p").last).to_have_text("x")
    page.wait_for_timeout(200)
    assert any("style-src" in text for text in _csp_violations(page)), _csp_violations(page)

"""The main path in a real browser: a support agent opens a paused run from the inbox, approves
it, watches it go on, and agent-supplied markup stays inert text."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from approvals.models import HumanDecision
from runs import engine
from runs.models import Run
from tests.approvals.console_helpers import start
from tests.browser.conftest import log_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

XSS = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">'


def test_support_approves_a_paused_run_and_sees_it_continue(page, sandbox, support_user):
    run = start("test.refund", {"amount": 150, "payment": "pay_1", "note": XSS})
    assert run.status == "needs_human"
    log_in(page, support_user.username)

    row = page.locator("table.runs tbody tr").first
    expect(row).to_contain_text("test.refund")
    expect(row).to_contain_text("Approval")
    row.get_by_role("link", name="Open").click()
    page.wait_for_url(f"**/console/runs/{run.pk}/")
    expect(page.locator(".run-head")).to_contain_text("Needs a person")
    expect(page.locator(".suggestion")).to_contain_text("payments.refund")

    page.get_by_role("button", name="Approve", exact=True).click()
    expect(page.locator("#flash")).to_contain_text("Approved")
    decision = HumanDecision.objects.get(run=run)
    assert decision.verb == "approve" and decision.user == support_user

    # A worker would pick the run up now; here the engine runs in-process and the page, which
    # polls while the run moves, shows where it went.
    assert Run.objects.get(pk=run.pk).status == "running"
    engine.run_until_quiet(run.pk)
    expect(page.locator(".run-head .status")).to_contain_text("Waiting", timeout=8_000)
    expect(page.locator(".tl--done")).to_have_count(3)
    expect(page.locator(".receipt--committed")).to_have_count(1)
    assert page.evaluate("window.__pwned") is None
    assert not [e for e in page.console_errors if "Content Security Policy" in e]


def test_injected_markup_stays_inert_text(page, sandbox, support_user):
    run = start(
        "test.refund",
        {"amount": 150, "payment": f'pay_1"><a href="javascript:alert(1)" hx-get="/x">{XSS}'},
    )
    log_in(page, support_user.username)
    page.goto(f"/console/runs/{run.pk}/")
    params = page.locator(".pending pre.json").first
    expect(params).to_contain_text("<script>window.__pwned=1</script>")
    expect(params).to_contain_text("<img src=x onerror=")
    assert page.locator("img[src=x]").count() == 0
    assert page.locator("a[href^='javascript:']").count() == 0
    assert page.locator("main script").count() == 0
    assert page.evaluate("window.__pwned") is None


# The characters of an element in the order they are drawn, left to right.
VISUAL_ORDER = """(element) => {
  const drawn = [];
  const walker = document.createTreeWalker(element, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    for (let i = 0; i < node.length; i++) {
      const range = document.createRange();
      range.setStart(node, i);
      range.setEnd(node, i + 1);
      const box = range.getBoundingClientRect();
      if (box.width > 0) drawn.push([box.left, node.data[i]]);
    }
  }
  return drawn.sort((a, b) => a[0] - b[0]).map((pair) => pair[1]).join("");
}"""


def test_a_right_to_left_override_cannot_disguise_a_business_key(page, sandbox, support_user):
    # Rendered naively, this key reads "bk-exe.jpg-1LTRXDAB": the override reverses the rest.
    key = "bk-\u202eBADXRTL1-gpj.exe"
    run = start("test.refund", {"amount": 150, "payment": "pay_1", "note": "zero\u200bwidth"},
                business_key=key)  # fmt: skip
    log_in(page, support_user.username)
    page.goto(f"/console/runs/{run.pk}/")
    shown = page.locator(".facts div", has=page.locator("dt", has_text="Business key"))
    assert shown.locator("dd").evaluate(VISUAL_ORDER) == "bk-[U+202E]BADXRTL1-gpj.exe"
    # The zero-width space in the input is drawn as a visible marker.
    marker = page.locator(".run-side .invisible-char", has_text="U+200B")
    expect(marker).to_be_visible()
    assert marker.bounding_box()["width"] > 10
    expect(marker).to_have_attribute("title", "ZERO WIDTH SPACE")
    # And in the run list, with the same key.
    page.goto("/console/runs/?q=bk-")
    cell = page.locator("table.runs tbody tr").first.locator("td").nth(4)
    assert cell.evaluate(VISUAL_ORDER) == "bk-[U+202E]BADXRTL1-gpj.exe"
    assert not [e for e in page.console_errors if "Content Security Policy" in e]


def test_times_are_in_the_browsers_zone_with_the_zone_shown(chromium, live_server, sandbox,
                                                            support_user):  # fmt: skip
    # The login form carries the browser's zone; every time on the page is then in it, in one
    # format. A browser in another zone (same session) posts its zone once and the page follows.
    from datetime import UTC, datetime, timedelta

    run = start("test.refund", {"amount": 150, "payment": "pay_1"})
    shanghai = chromium.new_context(base_url=live_server.url, locale="en-US",
                                    timezone_id="Asia/Shanghai")  # fmt: skip
    page = shanghai.new_page()
    log_in(page, support_user.username)
    expect(page.locator(".topbar .zone")).to_have_text("Asia/Shanghai (UTC+8)")
    page.goto(f"/console/runs/{run.pk}/")
    times = page.locator("main time")
    assert times.count() >= 3
    for index in range(times.count()):
        element = times.nth(index)
        instant = datetime.fromisoformat(element.get_attribute("datetime").replace("Z", "+00:00"))
        expected = (instant.astimezone(UTC) + timedelta(hours=8)).strftime("%Y-%m-%d %H:%M:%S")
        assert element.inner_text() == f"{expected} UTC+8"

    sao_paulo = chromium.new_context(base_url=live_server.url, locale="en-US",
                                     timezone_id="America/Sao_Paulo",
                                     storage_state=shanghai.storage_state())  # fmt: skip
    shanghai.close()
    other = sao_paulo.new_page()
    other.goto(f"/console/runs/{run.pk}/")
    expect(other.locator(".topbar .zone")).to_have_text("America/Sao_Paulo (UTC-3)")
    expect(other.locator(".facts time").first).to_contain_text("UTC-3")
    sao_paulo.close()


def test_the_console_says_what_happens_next(page, sandbox, support_user):
    # Confirming on a taken-over run does not move it on: the message says so, and releasing
    # it does. A rejection with nothing done undoes nothing, and the step says why it failed.
    from approvals import actions
    from tests.approvals.console_helpers import unknown_outcome_run

    unknown = unknown_outcome_run(sandbox)
    actions.take_over(unknown.pk, support_user)
    refund = start("test.refund", {"amount": 150, "payment": "pay_5"})
    log_in(page, support_user.username)

    page.goto(f"/console/runs/{unknown.pk}/")
    page.fill("form[data-action=confirm_happened] input[name=proof]", "crm_77")
    page.click("form[data-action=confirm_happened] button[type=submit]")
    expect(page.locator("#flash")).to_have_text(
        "Recorded as done, with your reference as proof. The run stays taken over by you: "
        "TaskPilots does nothing more with it until you release it."
    )
    expect(page.locator(".run-head .status")).to_contain_text("Taken over")
    expect(page.locator(".suggestion")).to_contain_text("release it and TaskPilots goes on")
    page.check("form[data-action=release] input[name=needed_engineer][value=no]")
    page.click("form[data-action=release] button[type=submit]")
    expect(page.locator("#flash")).to_have_text("Released. The run goes on.")

    page.goto(f"/console/runs/{refund.pk}/")
    page.click("details.action--danger summary >> text=Reject")
    expect(page.locator("form[data-action=reject]").locator("..")).to_contain_text(
        "Nothing has been done to other systems yet."
    )
    page.fill("form[data-action=reject] textarea[name=comment]", "duplicate request")
    page.click("form[data-action=reject] button[type=submit]")
    expect(page.locator("#flash")).to_have_text(
        "Rejected. The run is cancelled. Nothing had been done to other systems, so there is "
        "nothing to undo."
    )
    failed = page.locator(".tl--failed")
    expect(failed.locator(".tl-status")).to_have_text("Failed")
    expect(failed.locator(".tl-reason")).to_contain_text("Rejected by sam-support at ")
    expect(failed.locator(".tl-reason")).to_contain_text("“duplicate request”")
    expect(page.locator(".suggestion")).to_contain_text(
        "Nothing left to do: sam-support rejected it at "
    )
    expect(page.locator("#actions .idle")).to_have_text(
        "Nothing left to do: the run was cancelled."
    )


OPEN_IS_VISIBLE = """(link) => {
  const wrap = link.closest(".table-wrap").getBoundingClientRect();
  const box = link.getBoundingClientRect();
  const hit = document.elementFromPoint(box.left + box.width / 2, box.top + box.height / 2);
  return {inside: box.left >= wrap.left && box.right <= wrap.right - 4,
          onTop: hit !== null && link.contains(hit)};
}"""


def test_the_inbox_open_button_is_never_clipped(page, sandbox, support_user):
    from datetime import timedelta

    from django.utils import timezone

    from tests.approvals.console_helpers import invalid_data_run, unknown_outcome_run

    late = start("test.refund", {"amount": 150, "payment": "pay_1"})
    Run.objects.filter(pk=late.pk).update(attention_due_at=timezone.now() - timedelta(hours=30))
    unknown_outcome_run(sandbox)
    invalid_data_run()
    log_in(page, support_user.username)
    for language in ("en", "zh-hans"):
        if language == "zh-hans":
            page.click(".lang-switch button[value=zh-hans]")
        for width in (1440, 1280, 1024, 900):
            page.set_viewport_size({"width": width, "height": 900})
            page.goto("/console/")
            links = page.locator("#inbox-live tbody tr td:last-child a")
            assert links.count() == 3
            for index in range(3):
                seen = links.nth(index).evaluate(OPEN_IS_VISIBLE)
                assert seen == {"inside": True, "onTop": True}, (language, width, index)
    links.first.click()
    page.wait_for_url(f"**/console/runs/{late.pk}/")


def test_a_refund_names_its_currency(page, sandbox, support_user):
    run = start("refund.approval", {"payment_id": "pay_8", "amount": 1250, "currency": "EUR"})
    bare = start("test.refund", {"amount": 150, "payment": "pay_9"})  # its call has no currency
    log_in(page, support_user.username)
    page.goto(f"/console/runs/{run.pk}/")
    expect(page.locator(".pending .amount")).to_have_text("1,250.00 EUR")
    expect(page.locator(".why")).to_contain_text("Refund of 1250.00 EUR is above the 100 threshold")
    expect(page.locator("label[for=id_param__amount]")).to_have_text("amount (EUR)")
    page.goto(f"/console/runs/{bare.pk}/")
    expect(page.locator(".pending .amount")).to_have_text(
        "150.00 (no currency in the call: the payment system applies its default)"
    )

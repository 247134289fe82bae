"""The live console in a real browser, with two people (two browser contexts): they see each
other on the same run, a claim by one shows on the other's run page and inbox without a
reload, and a page left open learns that the other acted before its buttons are pressed."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from approvals.models import EscalationRule
from runs import engine
from runs.models import Run
from tests.approvals.console_helpers import approval_run, start
from tests.browser.conftest import log_in
from tests.factories import UserFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def second_page(chromium, live_server):
    context = chromium.new_context(
        base_url=live_server.url, locale="en-US", viewport={"width": 1440, "height": 1000}
    )
    context.set_default_timeout(10_000)
    yield context.new_page()
    context.close()


def test_two_people_see_each_other_claim_and_go_stale(page, second_page, sandbox):
    for name in ("ann", "bob"):
        UserFactory(username=name, groups=["support"])
    run = approval_run()
    assert run.status == Run.Status.NEEDS_HUMAN
    ann, bob = page, second_page
    log_in(ann, "ann")
    log_in(bob, "bob")
    url = f"/console/runs/{run.pk}/"
    ann.goto(url)
    expect(ann.locator("#live .presence")).to_contain_text("Nobody else is viewing this run.")
    bob.goto(url)
    # Each sees the other, never themselves, without reloading.
    expect(bob.locator("#live .presence")).to_contain_text("Also viewing: ann (since")
    expect(ann.locator("#live .presence")).to_contain_text("Also viewing: bob (since")
    expect(ann.locator("#live .presence")).not_to_contain_text("ann")

    # Bob's inbox is open in another tab when ann claims the run.
    inbox = bob.context.new_page()
    inbox.goto("/console/")
    expect(inbox.locator("#inbox-live")).not_to_contain_text("is handling this")
    ann.get_by_role("button", name="I'll handle it").click()
    expect(ann.locator("#live .claim")).to_contain_text("You are handling this, 5 min left.")
    expect(bob.locator("#live .claim")).to_contain_text("ann is handling this, 5 min left")
    expect(bob.get_by_role("button", name="I'll handle it")).to_have_count(0)
    expect(inbox.locator("#inbox-live")).to_contain_text(
        "ann is handling this, 5 min left", timeout=12_000
    )
    inbox.close()

    # Bob acts anyway: a warning first, then the action on his confirmation.
    bob.get_by_text("Take over…").click()
    bob.get_by_role("button", name="Take it over").click()
    expect(bob.locator("#flash")).to_contain_text("ann is handling this run")
    assert Run.objects.get(pk=run.pk).status == Run.Status.NEEDS_HUMAN
    # The form comes back open, carrying the confirmation.
    expect(bob.locator("form[data-action=take_over] input[name=despite_claim]")).to_have_count(1)
    bob.get_by_role("button", name="Take it over").click()
    expect(bob.locator("#flash")).to_contain_text("You have taken this run over")
    assert Run.objects.get(pk=run.pk).status == Run.Status.TAKEN_OVER

    # Ann's page, untouched since, learns it before she presses anything.
    banner = ann.locator("#live .stale-banner")
    expect(banner).to_contain_text("This run changed since you opened it: bob took over at")
    expect(banner).to_contain_text("Reload")
    expect(ann.get_by_role("button", name="Approve", exact=True)).to_be_disabled()
    ann.reload()
    expect(ann.locator("#live .stale-banner")).to_have_count(0)
    assert not page.console_errors


def test_probes_and_ones_own_action_raise_no_banner(page, sandbox):
    """Issue 33 §4: an outage's probes (every few seconds) and one's own action made the page
    say the run had changed and disabled its actions. Now: no banner, the actions stay usable,
    and after one's own approval the page simply shows where the run went."""
    UserFactory(username="ann", groups=["support"])
    EscalationRule.objects.create(
        position=20, name="Wait out an outage", failure_class="outage", action="wait",
        wait_window_seconds=900, probe_interval_seconds=30, queue="ops",
    )  # fmt: skip
    sandbox.inject("mail", "outage", seconds=600)
    waiting = start("test.reply", {"message": "hi", "email": "a@example.com", "ticket": "T-1"})
    log_in(page, "ann")
    page.goto(f"/console/runs/{waiting.pk}/")
    before = Run.objects.get(pk=waiting.pk).lock_version
    for seconds in (40, 80):
        engine.sweep(now=timezone.now() + timedelta(seconds=seconds))
        engine.run_until_quiet(waiting.pk)
    assert Run.objects.get(pk=waiting.pk).lock_version > before
    page.wait_for_timeout(4_000)  # past the bar's next poll (every 3 s)
    expect(page.locator("#live .stale-banner")).to_have_count(0)
    page.get_by_text("Cancel the run…").click()
    page.locator("form[data-action=cancel] textarea").fill("not needed any more")
    page.get_by_role("button", name="Yes, cancel the run").click()
    expect(page.locator(".run-head .status")).to_contain_text("Cancelled")
    sandbox.clear_faults()

    run = approval_run()
    page.goto(f"/console/runs/{run.pk}/")
    page.get_by_role("button", name="Approve", exact=True).click()
    expect(page.locator("#flash")).to_contain_text("Approved")
    engine.run_until_quiet(run.pk)
    page.wait_for_timeout(4_000)
    expect(page.locator("#live .stale-banner")).to_have_count(0)
    expect(page.locator(".run-head .status")).not_to_contain_text("Needs a person")
    assert not page.console_errors

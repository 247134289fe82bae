"""The live console (approvals/live.py): conditional polls that cost one query when nothing
changed, who else is viewing a run, soft claims, and the stale-page banner."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from approvals import actions, live
from approvals.models import ApprovalRequest, ClaimHeld, SoftClaim
from runs import engine
from runs.models import InvalidTransition, Run
from tests.approvals.console_helpers import (  # noqa: F401  (fast_passwords is autouse)
    approval_run,
    fast_passwords,
    fresh,
    start,
    visible_text,
)
from tests.factories import RunFactory, UserFactory

pytestmark = pytest.mark.django_db

HX = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "inbox-live"}
BAR = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "live"}
MAIN = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "run-main"}
# What every logged-in request reads before the view: its session, its user, the user's groups.
AUTH_TABLES = ("django_session", "auth_user", "auth_group")


class Clock:
    def __init__(self, now: float = 1_800_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = Clock()
    monkeypatch.setattr(live, "clock", fake)
    return fake


def waiting_run(**fields) -> Run:
    return RunFactory(status=Run.Status.NEEDS_HUMAN, attention_reason="check it", **fields)


def poll_inbox(client, etag=None, query=""):
    headers = {**HX, **({"HTTP_IF_NONE_MATCH": etag} if etag else {})}
    return client.get(reverse("console:inbox-live") + query, **headers)


def bar_url(run, version=None, opened=None):
    url = reverse("console:run-live", args=[run.pk])
    version = run.lock_version if version is None else version
    return url + f"?v={version}" + (f"&t={opened}" if opened else "")


def own_queries(ctx) -> list[str]:
    return [q["sql"] for q in ctx.captured_queries if not any(t in q["sql"] for t in AUTH_TABLES)]


# -- conditional polling --------------------------------------------------------------------


def test_an_unchanged_inbox_poll_is_a_304_after_one_query(client, support_user):
    for _ in range(3):
        waiting_run()
    client.force_login(support_user)
    first = poll_inbox(client)
    assert first.status_code == 200 and first["ETag"]
    assert first["Cache-Control"] == "private, no-cache"  # stored, so the browser revalidates
    assert 'id="inbox-live"' in first.content.decode()
    with CaptureQueriesContext(connection) as ctx:
        again = poll_inbox(client, first["ETag"])
    assert again.status_code == 304 and again.content == b""
    assert again["ETag"] == first["ETag"]
    mine = own_queries(ctx)
    assert len(mine) == 1, mine  # the stamp, and nothing of the inbox query
    assert "count(*)" in mine[0] and "approvals_softclaim" in mine[0]
    assert len(ctx.captured_queries) <= 4  # with the session, user and groups


def test_the_inbox_stamp_changes_with_arrivals_changes_claims_and_departures(client, support_user):
    run = waiting_run()
    client.force_login(support_user)
    seen = [poll_inbox(client)["ETag"]]

    def changed() -> bool:
        response = poll_inbox(client, seen[-1])
        seen.append(response["ETag"])
        return response.status_code == 200

    assert not changed()
    other = waiting_run()  # a run arrives
    assert changed()
    run.take_over(support_user)  # one changes in place
    assert changed()
    SoftClaim.claim(other, support_user, minutes=5)
    assert changed()
    # An SLA breach moves no version, but the row's updated_at.
    Run.objects.get(pk=other.pk).breach_sla(queue="tier2", due_at=None, data={})
    assert changed()
    Run.objects.filter(pk=other.pk).update(status=Run.Status.RUNNING)  # one leaves
    assert changed()
    assert not changed()


def test_the_inbox_re_renders_once_a_minute_even_when_nothing_changed(client, support_user, clock):
    waiting_run()
    client.force_login(support_user)
    etag = poll_inbox(client)["ETag"]
    clock.now += 61  # ages and SLA countdowns moved
    assert poll_inbox(client, etag).status_code == 200


def test_the_etag_is_per_viewer_and_per_filter(client, support_user, admin_user):
    waiting_run()
    client.force_login(support_user)
    etag = poll_inbox(client)["ETag"]
    assert poll_inbox(client, etag, "?owner=mine").status_code == 200
    client.force_login(admin_user)
    assert poll_inbox(client, etag).status_code == 200


def test_an_unchanged_run_poll_is_a_304_without_rendering(client, support_user, clock):
    run = waiting_run()
    client.force_login(support_user)
    first = client.get(bar_url(run), **BAR)
    assert first.status_code == 200
    clock.now += 1  # within the presence refresh: no cache write either
    with CaptureQueriesContext(connection) as ctx:
        again = client.get(bar_url(run), HTTP_IF_NONE_MATCH=first["ETag"], **BAR)
    assert again.status_code == 304
    mine = own_queries(ctx)
    # The DB cache's presence read and the run's stamp (with the Redis cache: the stamp alone).
    assert len(mine) <= 2, mine
    assert not any(sql.lstrip().upper().startswith(("INSERT", "UPDATE")) for sql in mine)


def test_polls_need_a_console_role(client, outsider):
    run = waiting_run()
    client.force_login(outsider)
    assert poll_inbox(client).status_code == 403
    assert client.get(bar_url(run), **BAR).status_code == 403
    client.logout()
    assert client.get(bar_url(run)).status_code == 302


# -- presence -------------------------------------------------------------------------------


def test_viewers_see_each_other_not_themselves(client, support_user, admin_user, clock):
    run = waiting_run()
    client.force_login(support_user)
    alone = client.get(bar_url(run), **BAR)
    assert "Nobody else is viewing this run." in alone.content.decode()
    client.force_login(admin_user)
    text = visible_text(client.get(bar_url(run), **BAR))
    assert "Also viewing: sam-support (since" in text and "alex-admin" not in text
    clock.now += 2
    client.force_login(support_user)
    changed = client.get(bar_url(run), HTTP_IF_NONE_MATCH=alone["ETag"], **BAR)
    assert changed.status_code == 200  # the other viewer's arrival changes the ETag
    assert "Also viewing: alex-admin" in visible_text(changed)


def test_presence_expires_and_is_refreshed_sparingly(support_user, admin_user, clock):
    run = waiting_run()
    live.touch_presence(run.pk, admin_user)
    writes = []
    original = live.cache.set
    live.cache.set = lambda *a, **k: (writes.append(a[0]), original(*a, **k))
    try:
        for _ in range(5):  # 5 polls within 10 s: the viewer's entry is written once
            assert [v.username for v in live.touch_presence(run.pk, support_user)] == ["alex-admin"]
            clock.now += 2
        assert len(writes) == 1
        clock.now += live.PRESENCE_TTL  # alex closed the tab 30 s ago
        assert live.touch_presence(run.pk, support_user) == []
    finally:
        live.cache.set = original


def test_user_names_are_escaped_in_presence_and_claims(client, support_user, clock):
    run = waiting_run()
    mallory = UserFactory(username="<b>mal</b>", groups=["support"])
    client.force_login(mallory)
    client.get(bar_url(run), **BAR)
    SoftClaim.claim(run, mallory, minutes=5)
    client.force_login(support_user)
    body = client.get(bar_url(run), **BAR).content.decode()
    assert "<b>mal</b>" not in body and "&lt;b&gt;mal&lt;/b&gt;" in body
    inbox = poll_inbox(client).content.decode()
    assert "<b>mal</b>" not in inbox and "&lt;b&gt;mal&lt;/b&gt;</bdi> is handling" in inbox


# -- soft claims ----------------------------------------------------------------------------


def claim_post(client, run, verb):
    return client.post(reverse("console:run-claim", args=[run.pk, verb]), **BAR)


def test_claim_extend_release_and_expiry(client, support_user, admin_user):
    run = waiting_run()
    version = run.lock_version
    client.force_login(support_user)
    response = claim_post(client, run, "claim")
    assert response.status_code == 200
    assert "You are handling this, 5 min left." in visible_text(response)
    claim = SoftClaim.objects.get(run=run)
    assert claim.user == support_user and claim.is_active()
    assert Run.objects.get(pk=run.pk).lock_version == version  # not a state change of the run

    SoftClaim.objects.filter(pk=claim.pk).update(expires_at=timezone.now() + timedelta(minutes=1))
    assert claim_post(client, run, "extend").status_code == 200
    extended = SoftClaim.objects.get(pk=claim.pk)
    assert extended.expires_at > timezone.now() + timedelta(minutes=4)
    assert extended.claimed_at == claim.claimed_at  # extended, not a new claim

    client.force_login(admin_user)
    taken = claim_post(client, run, "claim")
    assert taken.status_code == 409
    assert "sam-support is already handling this run" in visible_text(taken)
    client.force_login(support_user)
    assert claim_post(client, run, "release").status_code == 200
    assert live.active_claim(run.pk) is None

    SoftClaim.claim(run, admin_user, minutes=5)
    SoftClaim.objects.filter(run=run).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert live.active_claim(run.pk) is None  # expired: anyone may claim it again
    assert SoftClaim.claim(run, support_user, minutes=5).user == support_user


def test_two_claims_at_once_get_one_claim(support_user, admin_user):
    run = waiting_run()
    SoftClaim.claim(run, support_user, minutes=5)
    with pytest.raises(ClaimHeld) as held:
        SoftClaim.claim(run, admin_user, minutes=5)
    assert held.value.claim.user == support_user


def test_an_admin_may_end_someone_elses_claim_but_support_may_not(client, support_user, admin_user):
    run = waiting_run()
    other = UserFactory(username="ola-support", groups=["support"])
    SoftClaim.claim(run, other, minutes=5)
    client.force_login(support_user)
    assert claim_post(client, run, "release").status_code == 409
    assert live.active_claim(run.pk) is not None
    client.force_login(admin_user)
    assert claim_post(client, run, "release").status_code == 200
    assert live.active_claim(run.pk) is None


def test_only_people_who_may_act_can_claim(client, auditor_user):
    run = waiting_run()
    client.force_login(auditor_user)
    assert claim_post(client, run, "claim").status_code == 403
    assert not SoftClaim.objects.exists()
    assert "I&#x27;ll handle it" not in client.get(bar_url(run), **BAR).content.decode()


def test_a_finished_run_cannot_be_claimed(client, support_user):
    run = RunFactory(status=Run.Status.SUCCEEDED)
    with pytest.raises(InvalidTransition):
        SoftClaim.claim(run, support_user, minutes=5)
    client.force_login(support_user)
    assert claim_post(client, run, "claim").status_code == 409
    assert claim_post(client, run, "steal").status_code == 404


def test_the_inbox_shows_claims_and_filters_unclaimed(client, support_user):
    claimed, free = waiting_run(queue="claimed-q"), waiting_run(queue="free-q")
    SoftClaim.claim(claimed, support_user, minutes=5)
    client.force_login(support_user)
    text = visible_text(client.get("/console/"))
    assert "sam-support is handling this, 5 min left" in text
    unclaimed = visible_text(client.get("/console/?owner=unclaimed"))
    assert "free-q" in unclaimed and "claimed-q" not in unclaimed
    assert free.pk


def test_acting_on_someone_elses_claim_warns_first(client, sandbox, support_user):
    run = approval_run()
    holder = UserFactory(username="ola-support", groups=["support"])
    SoftClaim.claim(run, holder, minutes=5)
    client.force_login(support_user)
    url = reverse("console:run-action", args=[run.pk, "take_over"])
    data = {"expected_version": run.lock_version, "comment": ""}
    warned = client.post(url, data, HTTP_HX_REQUEST="true", HTTP_HX_TARGET="run-main")
    assert warned.status_code == 422
    text = visible_text(warned)
    assert "ola-support is handling this run" in text and "act anyway" in text
    assert 'name="despite_claim" value="1"' in warned.content.decode()
    assert Run.objects.get(pk=run.pk).status == Run.Status.NEEDS_HUMAN  # nothing done
    done = client.post(url, {**data, "despite_claim": "1"}, HTTP_HX_REQUEST="true")
    assert done.status_code == 200
    assert Run.objects.get(pk=run.pk).status == Run.Status.TAKEN_OVER
    # The holder acts without a warning.
    other = approval_run(payment="pay_2")
    SoftClaim.claim(other, support_user, minutes=5)
    url = reverse("console:run-action", args=[other.pk, "take_over"])
    mine = client.post(url, {"expected_version": other.lock_version, "comment": ""})
    assert mine.status_code == 302


# -- the stale page -------------------------------------------------------------------------


def test_a_stale_page_learns_who_changed_the_run(client, sandbox, support_user, admin_user):
    run = approval_run()
    client.force_login(support_user)
    opened = int(timezone.now().timestamp()) - 1
    fresh = client.get(bar_url(run, opened=opened), **BAR)
    assert "data-live-stale" not in fresh.content.decode()
    actions.take_over(run.pk, admin_user, comment="", expected_version=run.lock_version)
    stale = client.get(bar_url(run, opened=opened), HTTP_IF_NONE_MATCH=fresh["ETag"], **BAR)
    assert stale.status_code == 200 and "data-live-stale" in stale.content.decode()
    text = visible_text(stale)
    assert "This run changed since you opened it: alex-admin took over at" in text
    assert "its status is now “Taken over”" in text and "Reload" in text
    # The run page carries the version it shows to the bar, so a fresh page is not stale.
    page = client.get(reverse("console:run-detail", args=[run.pk])).content.decode()
    version = Run.objects.get(pk=run.pk).lock_version
    assert f'id="live-version" name="v" value="{version}"' in page
    assert 'hx-include="#live-version, #live-opened, #live-state"' in page
    assert (
        "data-live-stale" not in client.get(bar_url(run, version=version), **BAR).content.decode()
    )


def test_a_live_run_refresh_is_a_304_until_the_run_moves(client, support_user):
    run = RunFactory(status=Run.Status.RUNNING)
    client.force_login(support_user)
    url = reverse("console:run-main-live", args=[run.pk]) + "?tab=steps"
    headers = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "run-main"}
    first = client.get(url, **headers)
    assert first.status_code == 200 and 'id="run-main"' in first.content.decode()
    assert "<html" not in first.content.decode()
    with CaptureQueriesContext(connection) as ctx:
        same = client.get(url, HTTP_IF_NONE_MATCH=first["ETag"], **headers)
    assert same.status_code == 304 and len(own_queries(ctx)) == 1
    Run.objects.get(pk=run.pk).wait("timer")
    assert client.get(url, HTTP_IF_NONE_MATCH=first["ETag"], **headers).status_code == 200


def _shown_state(page: str) -> str:
    return re.search(r'id="live-state" name="s" value="([0-9a-f]+)"', page).group(1)


def test_an_outages_probes_leave_the_page_as_it_was(client, sandbox, support_user):
    """Issue 33 §4: every probe of a waiting run moved its version, so the page said it had
    changed and disabled its actions (a Cancel then timed out). Probes change nothing a person
    acts on: no banner, and an action taken from the page applies."""
    sandbox.inject("mail", "outage", seconds=600)
    run = start("test.reply", {"message": "hi", "email": "a@example.com", "ticket": "T-1"})
    assert fresh(run).status == "waiting"
    client.force_login(support_user)
    page = client.get(reverse("console:run-detail", args=[run.pk])).content.decode()
    version, state = fresh(run).lock_version, _shown_state(page)
    for seconds in (40, 80):  # two probes, each still down
        engine.sweep(now=timezone.now() + timedelta(seconds=seconds))
        engine.run_until_quiet(run.pk)
    assert fresh(run).lock_version > version and fresh(run).status == "waiting"
    bar = client.get(bar_url(run, version=version) + f"&s={state}", **BAR).content.decode()
    assert "data-live-stale" not in bar and "data-live-refresh" not in bar
    url = reverse("console:run-action", args=[run.pk, "cancel"])
    body = {"expected_version": version, "expected_state": state, "comment": "not needed"}
    assert (
        client.post(url, body, HTTP_HX_REQUEST="true", HTTP_HX_TARGET="run-main").status_code == 200
    )
    assert fresh(run).status == "cancelled"
    sandbox.clear_faults()


def test_a_page_whose_state_moved_is_refused_an_old_action(client, sandbox, support_user):
    """The tolerance is for moves nobody acts on: once the state moved, the old page's action
    is refused as before (409), whatever state it claims."""
    run = approval_run()
    client.force_login(support_user)
    page = client.get(reverse("console:run-detail", args=[run.pk])).content.decode()
    version, state = fresh(run).lock_version, _shown_state(page)
    actions.take_over(run.pk, support_user, comment="", expected_version=version)
    url = reverse("console:run-action", args=[run.pk, "cancel"])
    body = {"expected_version": version, "expected_state": state, "comment": "x"}
    assert (
        client.post(url, body, HTTP_HX_REQUEST="true", HTTP_HX_TARGET="run-main").status_code == 409
    )
    assert fresh(run).status == "taken_over"


def test_ones_own_action_refreshes_the_page_without_a_banner(client, sandbox, support_user):
    run = approval_run()
    client.force_login(support_user)
    opened = int(timezone.now().timestamp()) - 1
    page = client.get(reverse("console:run-detail", args=[run.pk])).content.decode()
    version, state = fresh(run).lock_version, _shown_state(page)
    request = ApprovalRequest.objects.get(run=run, status="pending")
    actions.decide_approval(request.pk, support_user, "approved", expected_version=version)
    engine.run_until_quiet(run.pk)
    bar = client.get(bar_url(run, version=version, opened=opened) + f"&s={state}", **BAR)
    text = bar.content.decode()
    assert "data-live-stale" not in text and "data-live-refresh" in text

"""The live console: cheap change stamps for polling, who else is viewing a run, soft claims.

Polling, not server-sent events: the console's pages already poll with htmx, and a sync
gunicorn worker held open per console would not hold 50 of them. What makes 50 consoles cheap
is that an unchanged poll costs one small query and no rendering:

- Each poll answers with an ETag made of a *stamp*: for the inbox, one statement over the runs
  waiting for a person (served by the partial index run_inbox_idx; no index on updated_at,
  which would cost the engine its HOT updates) and the soft claims' max(changed_at); for a run
  page, the run's row and its claim, by primary key. The browser's cache sends it back as
  If-None-Match and gets 304 without the page being built.
- The ETag also holds the minute (ages and SLA countdowns move), the viewer (their roles,
  language and time zone shape the page) and, on a run page, who else is viewing it.

Presence lives in the cache (Redis, or the DatabaseCache table on a fresh machine): one key per
run holding its viewers, written at most once per viewer every PRESENCE_REFRESH seconds, read
by every poll of the run page. Entries older than PRESENCE_TTL are gone: a closed tab drops out
within half a minute. Two viewers writing at the same moment may lose one entry until that
viewer's next refresh: presence is a hint, not a record.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from django.conf import settings
from django.core.cache import cache
from django.db import connection
from django.http import HttpRequest, HttpResponse
from django.utils import timezone, translation
from django.utils.safestring import SafeString

from approvals.models import ApprovalRequest, HumanDecision, SoftClaim
from runs.models import Run, SideEffect, Step

PRESENCE_TTL = 30  # seconds a viewer counts as present after their last poll
PRESENCE_REFRESH = 10  # a viewer's entry is rewritten at most this often
INBOX_POLL_SECONDS = 5
RUN_POLL_SECONDS = 3


def claim_minutes() -> int:
    """How long “I'll handle it” holds (TASKPILOTS_SOFT_CLAIM_MINUTES, default 5)."""
    return int(getattr(settings, "TASKPILOTS_SOFT_CLAIM_MINUTES", 5))


def clock() -> float:
    """Wall-clock seconds (presence is shared between processes); tests replace it."""
    return time.time()


# --------------------------------------------------------------------------------------------
# Stamps and conditional answers

_INBOX_STAMP = (
    "SELECT count(*), coalesce(sum(r.lock_version), 0), max(r.updated_at),"
    " (SELECT max(changed_at) FROM {claims})"
    " FROM {runs} r WHERE r.status IN ({human})"
)
_RUN_STAMP = (
    "SELECT r.lock_version, r.status, r.updated_at, c.changed_at"
    " FROM {runs} r LEFT JOIN {claims} c ON c.run_id = r.id WHERE r.id = %s"
)


def _sql(template: str) -> str:
    human = ", ".join(f"'{status}'" for status in sorted(Run.HUMAN))
    return template.format(runs=Run._meta.db_table, claims=SoftClaim._meta.db_table, human=human)


def inbox_stamp() -> tuple:
    """What changes when the inbox would: a run arriving or leaving (count, the newcomer's
    updated_at), one changing in place (a transition bumps lock_version; an SLA breach moves
    updated_at), a claim taken, extended or released. One statement."""
    with connection.cursor() as cursor:
        cursor.execute(_sql(_INBOX_STAMP))
        return tuple(cursor.fetchone())


def run_stamp(run_id) -> tuple | None:
    """The run's version, status and last update, and its claim's last change (None: no run)."""
    with connection.cursor() as cursor:
        cursor.execute(_sql(_RUN_STAMP), [run_id])
        row = cursor.fetchone()
    return tuple(row) if row else None


_ACTIONABLE = (
    "SELECT r.status, r.owner_id, r.queue,"
    " (SELECT s.id || ':' || s.status FROM {steps} s WHERE s.run_id = r.id"
    "  AND s.status IN ({unfinished}) ORDER BY s.position LIMIT 1),"
    " (SELECT a.id || ':' || coalesce(a.first_approved_by_id, 0) || ':' || a.approvals_required"
    "  FROM {approvals} a WHERE a.run_id = r.id AND a.status = 'pending' ORDER BY a.id LIMIT 1),"
    " (SELECT count(*) FROM {effects} e WHERE e.run_id = r.id AND e.status = 'committed')"
    " FROM {runs} r WHERE r.id = %s"
)


def actionable_state(run_id) -> str | None:
    """A digest of what a person acts on in a run: its status, owner and queue, the step it
    stopped at (and that step's status), the open approval (and its first approver) and the
    side effects a cancel would undo. An outage's probes move the run's version every few
    seconds but leave this as it was: a page showing it is not stale (the live bar), and an
    action taken from it still applies (approvals.views.run_action). One statement."""
    unfinished = ", ".join(f"'{status}'" for status in sorted(Step.UNFINISHED))
    sql = _ACTIONABLE.format(
        runs=Run._meta.db_table,
        steps=Step._meta.db_table,
        approvals=ApprovalRequest._meta.db_table,
        effects=SideEffect._meta.db_table,
        unfinished=unfinished,
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [run_id])
        row = cursor.fetchone()
    if row is None:
        return None
    return hashlib.sha256(repr(tuple(row)).encode()).hexdigest()[:16]


def decided_by_another(run: Run, opened_at: datetime | None, user) -> HumanDecision | None:
    """The latest decision another person took on the run since the page was opened."""
    last = (
        HumanDecision.objects.filter(run=run)
        .exclude(user=user)
        .select_related("user")
        .order_by("-id")
        .first()
    )
    if last is not None and (opened_at is None or last.created_at >= opened_at):
        return last
    return None


def etag_for(request: HttpRequest, *parts) -> str:
    """A strong ETag over `parts` and what shapes the page for this viewer."""
    viewer = (
        request.user.pk,
        translation.get_language(),
        timezone.get_current_timezone_name(),
        request.get_full_path(),
        int(clock() // 60),
    )
    digest = hashlib.sha256(repr((viewer, parts)).encode()).hexdigest()[:32]
    return f'"{digest}"'


def not_modified(request: HttpRequest, etag: str) -> bool:
    header = request.headers.get("If-None-Match", "")
    tags = {tag.strip().removeprefix("W/") for tag in header.split(",")}
    return etag in tags


def answer_not_modified(etag: str) -> HttpResponse:
    response = HttpResponse(status=304)
    return revalidate(response, etag)


def revalidate(response: HttpResponse, etag: str) -> HttpResponse:
    """Let the browser keep the answer but ask again every time (If-None-Match): never_cache's
    no-store would stop it sending the ETag back."""
    response["ETag"] = etag
    response["Cache-Control"] = "private, no-cache"
    response["Vary"] = "Cookie, HX-Request, HX-Target, Accept-Language"
    if "Expires" in response:
        del response["Expires"]
    return response


# --------------------------------------------------------------------------------------------
# Presence


@dataclass(frozen=True)
class Viewer:
    username: str
    since: datetime


def _presence_key(run_id) -> str:
    return f"live:presence:{run_id}"


def touch_presence(run_id, user) -> list[Viewer]:
    """Say `user` is viewing the run now; return the others viewing it, earliest first.

    One cache read; a write only when the viewer is new or their entry is PRESENCE_REFRESH old.
    """
    key, now, me = _presence_key(run_id), clock(), str(user.pk)
    viewers = cache.get(key) or {}
    fresh = {k: v for k, v in viewers.items() if now - v[2] < PRESENCE_TTL}
    mine = fresh.get(me)
    if mine is None or now - mine[2] >= PRESENCE_REFRESH or len(fresh) != len(viewers):
        fresh[me] = (user.get_username(), mine[1] if mine else now, now)
        cache.set(key, fresh, timeout=PRESENCE_TTL * 2)
    others = [v for k, v in fresh.items() if k != me]
    return [
        Viewer(name, datetime.fromtimestamp(since, tz=UTC))
        for name, since, _seen in sorted(others, key=lambda v: (v[1], v[0]))
    ]


def leave_presence(run_id, user) -> None:
    viewers = cache.get(_presence_key(run_id)) or {}
    if viewers.pop(str(user.pk), None) is not None:
        cache.set(_presence_key(run_id), viewers, timeout=PRESENCE_TTL * 2)


# --------------------------------------------------------------------------------------------
# Claims and changes, as the pages say them


def active_claim(run_id) -> SoftClaim | None:
    claim = SoftClaim.objects.filter(run_id=run_id).select_related("user").first()
    return claim if claim and claim.is_active() else None


def claims_by_run(run_ids) -> dict:
    """The active claims on these runs (one query): for the inbox rows."""
    rows = SoftClaim.objects.filter(run_id__in=list(run_ids), expires_at__gt=timezone.now())
    return {claim.run_id: claim for claim in rows.select_related("user")}


def attach_claims(runs) -> None:
    """Put each run's active claim on it as `run.live_claim` (None when nobody holds it)."""
    runs = list(runs)
    claims = claims_by_run(run.pk for run in runs)
    for run in runs:
        run.live_claim = claims.get(run.pk)


def claim_held_by_other(run: Run, user) -> SoftClaim | None:
    claim = active_claim(run.pk)
    return claim if claim and claim.user_id != user.pk else None


def claim_warning(claim: SoftClaim) -> SafeString:
    return _sentence("claim-warning", user=claim.user.get_username(), minutes=claim.minutes_left())


def claim_warning_held(claim: SoftClaim) -> SafeString:
    return _sentence("claim-held", user=claim.user.get_username(), minutes=claim.minutes_left())


def what_changed(run: Run, decision: HumanDecision) -> SafeString:
    """The stale-page banner: which other person did what when, and where the run is now."""
    return _sentence(
        "what-changed",
        user=decision.user.get_username(),
        verb=decision.verb,
        time=decision.created_at,
        status=run.status,
    )


def _sentence(name: str, **values) -> SafeString:
    """The partial `name` of templates/console/sentences/live.html."""
    from approvals.console import sentence

    return sentence(f"live.html#{name}", **values)

"""Every dashboard figure against a hand-built fixture whose answers are worked out below."""

from __future__ import annotations

import json
import math
import re
from datetime import timedelta

import pytest
from django.utils import timezone

from approvals.metrics import sketch
from approvals.metrics.dashboard import compute
from approvals.metrics.window import BadWindow, parse_window
from approvals.models import ApprovalRequest, HumanDecision
from runs.models import Run, StepKind, TimelineEvent, Wait, digest, to_json_value
from taskpilots.evidence.loadgen import load_fake_runs
from tests.factories import (
    ApprovalRequestFactory,
    HumanDecisionFactory,
    RunFactory,
    SideEffectFactory,
    SnapshotFactory,
    StepFactory,
    TakeoverFactory,
    UserFactory,
    WaitFactory,
)

pytestmark = pytest.mark.django_db


def event(run: Run, verb: str, data: dict, at) -> None:
    """Append to the run's hash chain at a chosen time (TimelineEvent.append uses now())."""
    head = Run.objects.filter(pk=run.pk).values_list("event_seq", "event_hash").get()
    seq, prev = head[0] + 1, head[1]
    data = to_json_value(data)
    data_digest = digest(data)
    TimelineEvent(
        run=run, seq=seq, at=at, actor="system", verb=verb, data=data, data_digest=data_digest,
        prev_hash=prev, hash=TimelineEvent.compute_hash(seq, at, "system", verb, data_digest, prev),
    ).save()  # fmt: skip
    Run.objects.filter(pk=run.pk).update(event_seq=seq, event_hash=TimelineEvent.objects.get(
        run=run, seq=seq).hash)  # fmt: skip


def failure(run, step, verb, failure_class, at):
    data = {"step": step.name, "iteration": 0}
    if verb != "step.unknown_outcome":
        data["routing"] = {"failure_class": failure_class, "rule": "r"}
    event(run, verb, data, at)


def side_effect(step, *, snapshot_at, committed_at=None, status="committed", missing=(), **kw):
    snapshot = SnapshotFactory(
        step=step, tool=step.tool, created_at=snapshot_at, missing_fields=list(missing),
        **({"idempotency_key": kw.pop("key")} if "key" in kw else {}),
    )  # fmt: skip
    return SideEffectFactory(
        snapshot=snapshot, status=status, committed_at=committed_at, tool=step.tool, **kw
    )


def ms(delta_ms):
    return timedelta(milliseconds=delta_ms)


@pytest.fixture
def world(db):
    """Twelve runs started two hours ago (R1–R12) and one 40 days ago (R0, outside the window).

    R1  clean: mail.send committed 500 ms after its snapshot.
    R2  mail.send failed twice (transient, t+10 s, t+20 s), retried by the engine, step done at
        t+60 s, run at t+100 s; snapshot with one missing field; latency 1 s.
    R3  crm.create outcome unknown at t+100 s; a person confirmed it happened at t+300 s (step
        done); run ended t+400 s; latency 210 s.
    R4  payments.refund escalated (outage) at t+200 s; taken over twice (released in between,
        then a retry decision); failed at t+1000 s; an event wait expired.
    R5  waiting for an approval (needs a person now).
    R6  approval decided in 30 s (approval wait 30 s); event wait resolved in 10 s.
    R7  mail.send judged not committed, resent, and a reconcile then found the first attempt
        committed: a wrong retry. Latency 30 s.
    R8  payments.refund committed under two keys (a duplicate; also a wrong retry); latencies
        100 ms and 200 ms.
    R9  mail.send resent with the same key (dedupe) and committed by the tool: a right retry;
        its snapshot was written *after* the commit (not covered).
    R10 running for an hour with no step.  R11 running, its step's lease expired 20 min ago and
        its side effect intended 30 min ago (snapshot with two missing fields).  R12 waiting
        with no pending wait.
    """
    now = timezone.now()
    t = now - timedelta(hours=2)
    s = lambda seconds: t + timedelta(seconds=seconds)  # noqa: E731
    user = UserFactory(username="metrics-person")
    done = {"status": "succeeded"}

    def run(**kw):
        return RunFactory(created_at=t, updated_at=t, **kw)

    def step(r, name, tool="", kind=StepKind.SIDE_EFFECT, **kw):
        return StepFactory(run=r, name=name, tool=tool, kind=kind, **kw)

    long_ago = now - timedelta(days=40)
    r0 = RunFactory(created_at=long_ago, finished_at=long_ago, status="succeeded")
    side_effect(step(r0, "send", "mail.send", attempts=1, **done),
                snapshot_at=r0.created_at, committed_at=r0.created_at)  # fmt: skip

    r1 = run(status="succeeded", finished_at=s(10))
    side_effect(step(r1, "send", "mail.send", attempts=1, **done),
                snapshot_at=s(1), committed_at=s(1) + ms(500))  # fmt: skip

    r2 = run(status="succeeded", finished_at=s(100), failure_count=2)
    send = step(r2, "send", "mail.send", attempts=3, finished_at=s(60), **done)
    failure(r2, send, "step.retry_scheduled", "transient", s(10))
    failure(r2, send, "step.retry_scheduled", "transient", s(20))
    side_effect(send, snapshot_at=s(50), committed_at=s(51), missing=["session_context_ref"])

    r3 = run(status="succeeded", finished_at=s(400), failure_count=1)
    create = step(r3, "create", "crm.create", attempts=1, finished_at=s(300), **done)
    failure(r3, create, "step.unknown_outcome", "unknown_outcome", s(100))
    side_effect(create, snapshot_at=s(90), committed_at=s(300), confirmed_by="user:x")
    HumanDecisionFactory(run=r3, step=create, user=user, verb="confirm_happened",
                         created_at=s(300))  # fmt: skip

    r4 = run(status="failed", finished_at=s(1000), failure_count=1, escalation_level=1)
    refund = step(r4, "refund", "payments.refund", attempts=1, status="failed")
    failure(r4, refund, "step.escalated", "outage", s(200))
    TakeoverFactory(run=r4, user=user, started_at=s(400), ended_at=s(500))
    TakeoverFactory(run=r4, user=user, started_at=s(550))
    for verb, at in (("take_over", 400), ("release", 500), ("take_over", 550), ("retry", 600)):
        HumanDecisionFactory(run=r4, user=user, verb=verb, created_at=s(at))
    WaitFactory(step=step(r4, "settle", kind=StepKind.WAIT_EVENT), status="expired",
                created_at=s(150), resolved_at=s(750))  # fmt: skip

    r5 = run(status="needs_human")
    ApprovalRequestFactory(step=step(r5, "approve", kind=StepKind.APPROVAL, status="needs_human"),
                           created_at=s(5))  # fmt: skip
    WaitFactory(step=r5.steps.get(), kind=Wait.Kind.APPROVAL, created_at=s(5))

    r6 = run(status="succeeded", finished_at=s(50))
    approve = step(r6, "approve", kind=StepKind.APPROVAL, **done)
    approval = ApprovalRequestFactory(step=approve, status="decided", decision="approved",
                                      created_at=s(5), decided_at=s(35))  # fmt: skip
    HumanDecisionFactory(run=r6, step=approve, approval=approval, user=user, verb="approve")
    WaitFactory(step=approve, kind=Wait.Kind.APPROVAL, status="resolved", created_at=s(5),
                resolved_at=s(35))  # fmt: skip
    WaitFactory(step=step(r6, "await", kind=StepKind.WAIT_EVENT, **done), status="resolved",
                created_at=s(36), resolved_at=s(46))  # fmt: skip

    r7 = run(status="succeeded", finished_at=s(80))
    notify = step(r7, "notify", "mail.send", attempts=2, **done)
    effect = side_effect(notify, snapshot_at=s(10), committed_at=s(40), confirmed_by="reconcile")
    event(r7, "side_effect.not_committed", {"key": effect.idempotency_key}, s(20))
    event(r7, "side_effect.committed",
          {"key": effect.idempotency_key, "confirmed_by": "reconcile"}, s(40))  # fmt: skip

    r8 = run(status="succeeded", finished_at=s(90))
    charge = step(r8, "charge", "payments.refund", attempts=2, **done)
    side_effect(charge, snapshot_at=s(10), committed_at=s(10) + ms(100), key="k8")
    side_effect(charge, snapshot_at=s(20), committed_at=s(20) + ms(200), key="k8~r2")

    r9 = run(status="succeeded", finished_at=s(90))
    notify9 = step(r9, "notify", "mail.send", attempts=2, **done)
    effect = side_effect(notify9, snapshot_at=s(45), committed_at=s(40))
    event(r9, "side_effect.resend_with_same_key", {"key": effect.idempotency_key}, s(30))

    RunFactory(created_at=t, status="running", updated_at=now - timedelta(hours=1))  # R10
    r11 = run(status="running")
    r11.updated_at = now
    r11.save()
    running = step(r11, "post", "mail.send", attempts=1, status="running",
                   lease_owner="w1", lease_expires_at=now - timedelta(minutes=20))  # fmt: skip
    side_effect(running, snapshot_at=now - timedelta(minutes=30), status="intended",
                updated_at=now - timedelta(minutes=30),
                attempted_at=now - timedelta(minutes=30),
                missing=["session_context_ref", "prior_results_summary"])  # fmt: skip
    run(status="waiting")  # R12
    return now


def dashboard(now, key="24h"):
    return compute(parse_window({"window": key}, now=now), now=now)


def figures(now, key="24h"):
    return {f.key: f for f in dashboard(now, key).figures}


def test_every_figure_matches_the_hand_computed_answer(world):
    f = figures(world)
    expect = {
        # 7 of the 8 ended runs (R1–R4, R6–R9) succeeded; R0 is outside the window.
        "execution_success_rate": (7 / 8, (7, 8)),
        # Ended runs with a failure: R2, R3, R4. Only R2 recovered with nobody's help.
        "auto_recovery_rate": (1 / 3, (1, 3)),
        # Steps with a failure: R2 send, R3 create, R4 refund; R3 needed a person's decision.
        "local_recovery_rate": (1 / 3, (1, 3)),
        # A person stepped in on R3 (confirmation) and R4 (takeovers); R6's approval does not
        # count. 12 runs in the window.
        "human_takeover_rate": (2 / 12, (2, 12)),
        "takeovers_per_100_runs": (200 / 12, (2, 12)),
        "second_intervention_rate": (1.0, (1, 1)),
        # Committed side-effect steps: R1, R2, R3, R7, R8, R9; R8 committed under two keys.
        "duplicate_side_effect_rate": (1 / 6, (1, 6)),
        # Resent: R7 (not committed), R8 (new key), R9 (dedupe resend); R7 and R8 had landed.
        "wrong_retry_rate": (2 / 3, (2, 3)),
        # Committed side effects: R1, R2, R3, R7, R8 ×2, R9; R9's snapshot came after.
        "snapshot_coverage": (6 / 7, (6, 7)),
        # 8 snapshots × 9 fields; R2 misses one field, R11 two.
        "missing_field_rate": (3 / 72, (3, 72)),
        # Ended waits: R4 expired, R6's two resolved.
        "waits_timed_out": (1 / 3, (1, 3)),
        # mail.send 1+3+2+2+1 = 9 attempts, 2 failed; crm.create 1 of 1; refund 1 of 1+2.
        "tool_failure_rate": (4 / 13, (4, 13)),
    }
    for key, (value, counts) in expect.items():
        assert f[key].value == pytest.approx(value), key
        assert f[key].counts == counts, key
    # Durations are read from sketches (approvals/metrics/sketch.py): within 1 % of the exact
    # median, mean and p95, and exactly what sketch.quantile() and sketch.mean() say.
    durations = {
        # R2's step: failed at t+10 s, done t+60 s → 50 s; R3's: t+100 s → t+300 s = 200 s.
        "time_to_recover_median": ([50, 200], 125, {"mean": 125}),
        # First failure → run ended: R2 90 s, R3 300 s, R4 800 s.
        "time_to_close_median": ([90, 300, 800], 300, {"mean": (90 + 300 + 800) / 3}),
        # Resolved waits: 30 s (approval) and 10 s (event).
        "pause_to_resume_median": ([30, 10], 20, {}),
        "approval_handling_median": ([30], 30, {"mean": 30}),
        # Covered latencies (ms): 100, 200, 500, 1000, 30000, 210000.
        "snapshot_latency_p50": (
            [100, 200, 500, 1000, 30000, 210000],
            750,
            {"p95": 30000 + 0.75 * 180000},
        ),
    }
    for key, (values, median, extra) in durations.items():
        assert f[key].value == pytest.approx(sketch.quantile(values, 0.5)), key
        assert f[key].value == pytest.approx(median, rel=sketch.ACCURACY), key
        for stat, exact in extra.items():
            ours = sketch.mean(values) if stat == "mean" else sketch.quantile(values, 0.95)
            assert f[key].extra[stat] == pytest.approx(ours, rel=1e-3), (key, stat)
            assert f[key].extra[stat] == pytest.approx(exact, rel=sketch.ACCURACY), (key, stat)


def test_tool_failures_are_broken_down_by_tool_and_class(world):
    fig = figures(world)["tool_failure_rate"]
    by_tool = {row["tool"]: row for row in fig.extra["by_tool"]}
    assert by_tool["mail.send"]["calls"] == 9
    assert by_tool["mail.send"]["by_class"] == {"transient": {"failures": 2, "rate": 0.2222}}
    assert by_tool["crm.create"]["by_class"] == {"unknown_outcome": {"failures": 1, "rate": 1.0}}
    assert by_tool["payments.refund"]["by_class"] == {"outage": {"failures": 1, "rate": 0.3333}}
    assert fig.extra["by_class"] == {
        "outage": {"failures": 1, "rate": 0.0769},
        "transient": {"failures": 2, "rate": 0.1538},
        "unknown_outcome": {"failures": 1, "rate": 0.0769},
    }
    # Sorted worst first.
    assert [row["tool"] for row in fig.extra["by_tool"]][0] == "crm.create"


def test_state_inconsistencies_and_people_needed_now(world):
    board = dashboard(world)
    assert board.inconsistencies == {
        "running_without_step": 1,  # R10
        "expired_leases": 1,  # R11's step
        "intended_too_long": 1,  # R11's side effect
        "waiting_without_wait": 1,  # R12
        "external_mismatches": 0,  # none recorded (tests/runs/test_consistency.py)
    }
    assert board.needing_human == 1  # R5


def test_the_window_chooses_the_cohort_and_the_trend_buckets(world):
    board = dashboard(world, "30d")
    success = {f.key: f for f in board.figures}["execution_success_rate"]
    assert success.counts == (7, 8)  # R0 (40 days ago) is still outside
    assert board.window.bucket == "day" and len(board.buckets) == 31
    assert [v for v in success.series if v is not None] == [pytest.approx(7 / 8)]
    hourly = dashboard(world, "24h")
    assert hourly.window.bucket == "hour" and len(hourly.buckets) == 25
    custom = parse_window({"window": "custom", "start": "2020-01-01", "end": "2020-01-31"})
    empty = {f.key: f for f in compute(custom).figures}
    assert empty["execution_success_rate"].value is None
    assert empty["execution_success_rate"].counts == (0, 0)


@pytest.mark.parametrize(
    "params",
    [
        {"window": "1y"},
        {"window": "custom", "start": "2026-02-01"},
        {"window": "custom", "start": "2026-02-01", "end": "2026-01-01"},
        {"window": "custom", "start": "2020-01-01", "end": "2026-01-01"},
    ],
)
def test_bad_windows_are_refused(params):
    with pytest.raises(BadWindow):
        parse_window(params)


# --------------------------------------------------------------------------------------------
# The page and the JSON endpoint


@pytest.mark.parametrize("persona", ["support_user", "auditor_user", "admin_user"])
def test_every_console_role_sees_the_dashboard(client, request, world, persona):
    client.force_login(request.getfixturevalue(persona))
    response = client.get("/console/metrics/?window=24h")
    assert response.status_code == 200
    body = response.content.decode()
    assert "87.5 %" in body  # execution success rate
    assert 'class="help-pop" role="tooltip"' in body
    assert 'title="Runs started in the window that ended succeeded' in body
    assert '<svg class="spark' in body and "<script" not in body.split("</head>")[1]
    assert "crm.create" in body


def test_the_dashboard_refuses_outsiders_anonymous_users_and_posts(client, outsider, auditor_user):
    assert client.get("/console/metrics/").status_code == 302  # to the login page
    assert client.get("/console/metrics.json").status_code == 302
    client.force_login(outsider)
    assert client.get("/console/metrics/").status_code == 403
    assert client.get("/console/metrics.json").status_code == 403
    client.force_login(auditor_user)
    assert client.post("/console/metrics/").status_code == 405
    assert client.post("/console/metrics.json").status_code == 405


def test_a_bad_window_is_a_400_on_the_page_and_in_json(client, auditor_user):
    client.force_login(auditor_user)
    page = client.get("/console/metrics/?window=custom&start=2026-01-09&end=2026-01-01")
    assert page.status_code == 400
    assert "The end date is before the start date." in page.content.decode()
    response = client.get("/console/metrics.json?window=forever")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "bad_window"


def test_the_json_endpoint_serves_the_same_numbers(client, auditor_user, world):
    client.force_login(auditor_user)
    response = client.get("/console/metrics.json?window=24h")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    data = response.json()
    assert data["window"]["key"] == "24h" and data["window"]["bucket"] == "hour"
    figs = data["figures"]
    assert set(figs) == {f.key for f in dashboard(world).figures}
    assert figs["execution_success_rate"]["value"] == 0.875
    assert figs["execution_success_rate"]["counts"] == [7, 8]
    assert figs["wrong_retry_rate"]["definition"].startswith("Of the side-effect steps")
    assert len(figs["auto_recovery_rate"]["series"]) == 25
    assert data["state_inconsistencies"]["total"] == 4
    assert data["runs_needing_human"] == 1


def test_the_page_costs_the_same_queries_for_small_and_large_data(
    client, auditor_user, world, django_assert_max_num_queries, query_count
):
    client.force_login(auditor_user)
    client.get("/console/metrics/")  # warm the session and caches
    with django_assert_max_num_queries(16), query_count() as small:
        assert client.get("/console/metrics/?window=30d").status_code == 200
    load_fake_runs(300, days=20, batch_size=300)
    with django_assert_max_num_queries(16), query_count() as large:
        response = client.get("/console/metrics/?window=30d")
    assert response.status_code == 200
    assert len(small) == len(large)
    assert "no data" not in response.content.decode().lower()


# --------------------------------------------------------------------------------------------
# /metrics (Prometheus text format 0.0.4)

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_SAMPLE = re.compile(
    rf'^(?P<name>{_NAME})(?:\{{(?P<labels>(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*",?)*)\}})?'
    r" (?P<value>[-+]?(?:\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|NaN|[+-]Inf))$"
)
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\.)*)"')


def parse_prometheus(text: str) -> dict[str, dict]:
    """A strict reader of the text format: HELP/TYPE before samples, one family each."""
    assert text.endswith("\n")
    families: dict[str, dict] = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name = line.split(" ", 3)[2]
            assert name not in families, f"{name} declared twice"
            families[name] = {"help": line.split(" ", 3)[3], "type": None, "samples": []}
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in {"counter", "gauge", "histogram", "summary", "untyped"}
            assert not families[name]["samples"], "TYPE must precede the samples"
            families[name]["type"] = kind
        else:
            match = _SAMPLE.match(line)
            assert match, f"not a sample line: {line!r}"
            labels = dict(_LABEL.findall(match["labels"] or ""))
            value = float(match["value"])
            assert not math.isnan(value)
            families[match["name"]]["samples"].append((labels, value))
    return families


def _samples(families, name):
    return {tuple(sorted(labels.items())): value for labels, value in families[name]["samples"]}


def test_prometheus_needs_a_token_or_an_admin(client, monkeypatch, support_user, admin_user):
    monkeypatch.delenv("TASKPILOTS_METRICS_TOKEN", raising=False)
    response = client.get("/metrics")
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    # No token configured: a bearer header proves nothing.
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer ").status_code == 401
    client.force_login(support_user)
    assert client.get("/metrics").status_code == 401
    client.force_login(admin_user)
    assert client.get("/metrics").status_code == 200
    assert client.post("/metrics").status_code == 405


def test_prometheus_accepts_the_configured_bearer_token(client, monkeypatch):
    monkeypatch.setenv("TASKPILOTS_METRICS_TOKEN", "s3cret-scrape-token")
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Basic s3cret-scrape-token").status_code == 401
    response = client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-scrape-token")
    assert response.status_code == 200
    assert response["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"


def test_prometheus_exposes_counters_and_gauges(client, monkeypatch, world):
    monkeypatch.setenv("TASKPILOTS_METRICS_TOKEN", "t")
    families = parse_prometheus(
        client.get("/metrics", HTTP_AUTHORIZATION="Bearer t").content.decode()
    )
    assert families["taskpilots_runs_total"]["type"] == "counter"
    runs = _samples(families, "taskpilots_runs_total")
    # R0–R3 and R6–R9 succeeded (8), R4 failed; open runs are a gauge, not this counter.
    assert runs[(("status", "succeeded"), ("workflow", "test.flow"))] == 8
    assert runs[(("status", "failed"), ("workflow", "test.flow"))] == 1
    live = _samples(families, "taskpilots_runs")
    assert live[(("status", "running"), ("workflow", "test.flow"))] == 2
    effects = _samples(families, "taskpilots_side_effects_total")
    assert effects[(("status", "committed"), ("tool", "mail.send"))] == 5  # R0 R1 R2 R7 R9
    assert effects[(("status", "committed"), ("tool", "payments.refund"))] == 2
    assert _samples(families, "taskpilots_side_effects_open") == {
        (("status", "intended"), ("tool", "mail.send")): 1
    }
    assert _samples(families, "taskpilots_step_failures_total") == {
        (("class", "transient"), ("tool", "mail.send")): 2,
        (("class", "unknown_outcome"), ("tool", "crm.create")): 1,
        (("class", "outage"), ("tool", "payments.refund")): 1,
    }
    assert families["taskpilots_runs_needing_human"]["samples"] == [({}, 1.0)]
    assert families["taskpilots_state_inconsistencies"]["type"] == "gauge"
    assert sum(_samples(families, "taskpilots_state_inconsistencies").values()) == 4


def test_prometheus_costs_the_same_queries_for_small_and_large_data(
    client, admin_user, world, query_count
):
    # The failure counter is added up from stored rows, not from every failure event ever.
    client.force_login(admin_user)
    client.get("/metrics")  # warm the session
    with query_count() as small:
        assert client.get("/metrics").status_code == 200
    load_fake_runs(300, days=20, batch_size=300)
    with query_count() as large:
        assert client.get("/metrics").status_code == 200
    assert len(small) == len(large)


def test_prometheus_label_values_are_escaped(db, client, admin_user):
    RunFactory(workflow='odd"flow\\with\nnewline', status="succeeded", finished_at=timezone.now())
    client.force_login(admin_user)
    families = parse_prometheus(client.get("/metrics").content.decode())
    labels = [labels for labels, _ in families["taskpilots_runs_total"]["samples"]]
    assert labels == [{"workflow": 'odd\\"flow\\\\with\\nnewline', "status": "succeeded"}]


def test_loadgen_writes_valid_chains_the_dashboard_can_read(db):
    load_fake_runs(40, days=2, batch_size=40, seed=3)
    from runs.audit import verify_chain

    for run in Run.objects.all()[:10]:
        assert verify_chain(run.events.order_by("seq")) == (True, "ok")
    assert ApprovalRequest.objects.exists() and HumanDecision.objects.exists()
    board = json.loads(json.dumps(compute(parse_window({"window": "7d"})).as_json()))
    assert board["figures"]["execution_success_rate"]["counts"][1] > 0

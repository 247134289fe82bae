"""A long run as an auditor meets it (issue 33 §1): a refund approved with edits by a person,
then 110 identical 503s from mail.send while a reply was retried, padded to 768 events with
the engine's ordinary step events. The retries are appended to the run's real chain in the
shapes the engine writes them (copied from a run of test.reply against the sandbox's 503), so
the chain verifies and the test needs no 110 round trips to the sandbox."""

from __future__ import annotations

from django.db import connection

from approvals import actions
from approvals.models import ApprovalRequest
from runs import engine
from runs.models import Run, TimelineEvent
from tests.approvals.console_helpers import approval_run

RETRIES = 110
TOTAL_EVENTS = 768
KEY = "tp-long-send_reply"
ERROR = "POST /mail/send answered 503: service unavailable (injected)"


def _attempt(run_id, attempt: int) -> None:
    step = {"step": "send_reply", "iteration": 0}
    TimelineEvent.append(
        run_id,
        "step.started",
        {
            **step,
            "to": "running",
            "from": "retry_scheduled",
            "kind": "side_effect",
            "attempt": attempt,
        },
    )
    TimelineEvent.append(
        run_id,
        "snapshot.written",
        {
            **step,
            "key": KEY,
            "tool": "mail.send",
            "target": "mailbox:ann@example.com",
            "checksum": f"{attempt:064x}",
        },
    )
    TimelineEvent.append(
        run_id,
        "side_effect.intended",
        {
            "to": "intended",
            "key": KEY,
            "from": "not_committed",
            "step": "send_reply",
            "tool": "mail.send",
            "attempt": attempt,
        },
    )
    TimelineEvent.append(
        run_id,
        "side_effect.not_committed",
        {"to": "not_committed", "key": KEY, "from": "intended", "tool": "mail.send"},
    )
    TimelineEvent.append(
        run_id,
        "step.retry_scheduled",
        {
            **step,
            "to": "retry_scheduled",
            "from": "running",
            "error": ERROR,
            "attempt": attempt,
            "retry_in_s": 60,
        },
    )


def long_run(approver, total: int = TOTAL_EVENTS) -> Run:
    """A 768-event run: taken over, approved with edits (amount 150 → 120) and released by
    `approver`, then 110 failed
    attempts of mail.send, then ordinary step events up to `total`."""
    run = approval_run()
    actions.take_over(run.pk, approver)
    approval = ApprovalRequest.objects.get(run=run)
    actions.decide_approval(
        approval.pk,
        approver,
        "approved_with_edits",
        edited_params={"payment_id": "pay_1", "amount": 120},
        comment="Partial refund, as agreed by phone",
    )
    actions.release(run.pk, approver, needed_engineer=False)
    run = engine.run_until_quiet(run.pk)
    for attempt in range(1, RETRIES + 1):
        _attempt(run.pk, attempt)
    TimelineEvent.append(
        run.pk,
        "step.escalated",
        {
            "step": "send_reply",
            "iteration": 0,
            "error": ERROR,
            "to": "needs_human",
            "from": "retry_scheduled",
        },
    )
    n = 0
    while Run.objects.get(pk=run.pk).event_seq < total:
        n += 1
        name = {"step": f"enrich_{n % 6}", "iteration": 0}
        TimelineEvent.append(
            run.pk,
            "step.started",
            {**name, "to": "running", "from": "", "kind": "compute", "attempt": 1},
        )
        if Run.objects.get(pk=run.pk).event_seq < total:
            TimelineEvent.append(
                run.pk,
                "step.succeeded",
                {**name, "to": "succeeded", "from": "running", "attempt": 1},
            )
    return Run.objects.get(pk=run.pk)


def seed_runs(count: int = 100_000, with_events: int = 20_000) -> None:
    """`count` finished runs in one statement (generate_series), ten events each for
    `with_events` of them (their chains are not real: only the page's queries are measured),
    then ANALYZE so the planner knows the tables are big."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO runs_run (id, workflow, workflow_version, status, stage, input,
                input_digest, principal, scopes, session_context_ref, failure_count,
                escalation_level, queue, attention_reason, created_at, updated_at, finished_at,
                lock_version, event_seq, event_hash)
            SELECT gen_random_uuid(), 'seed.flow', 1, 'succeeded', '', '{}'::jsonb, '', 'system',
                '[]'::jsonb, '', 0, 0, '', '', now() - make_interval(secs => i),
                now() - make_interval(secs => i), now() - make_interval(secs => i), 0, 0, ''
            FROM generate_series(1, %s) AS i
            """,
            [count],
        )
        cursor.execute(
            """
            INSERT INTO runs_timelineevent (run_id, seq, at, actor, verb, data, data_digest,
                pruned, prev_hash, hash)
            SELECT r.id, s, r.created_at, 'system', 'step.started', '{"step": "seed"}'::jsonb,
                '', false, '', ''
            FROM (SELECT id, created_at FROM runs_run WHERE workflow = 'seed.flow' LIMIT %s) r,
                generate_series(1, 10) AS s
            """,
            [with_events],
        )
        cursor.execute("ANALYZE runs_run")
        cursor.execute("ANALYZE runs_timelineevent")

"""What a drill reports: its figures, computed afterwards from the database and the sandbox
ledger (approvals.metrics's own definitions), never from counters the drill keeps itself."""

from __future__ import annotations

from collections import Counter
from datetime import datetime

from approvals.metrics import dashboard
from runs import engine
from runs.models import ExternalMismatch, Run, SideEffect, Snapshot, Step, TimelineEvent
from runs.verbs import Verb
from taskpilots.evidence import stalls
from taskpilots.sandbox.client import SandboxClient


def _parse_at(value: str) -> datetime:
    return datetime.fromisoformat(value)


# The figures a drill reports, by the dashboard's own definitions (approvals.metrics): the drill
# computes none of them itself.
FIGURE_KEYS = (
    "execution_success_rate",
    "auto_recovery_rate",
    "local_recovery_rate",
    "human_takeover_rate",
    "time_to_close_median",
    "duplicate_side_effect_rate",
    "wrong_retry_rate",
    "snapshot_coverage",
    "missing_field_rate",
    "snapshot_latency_p50",
)


def _figures(run_ids) -> dict:
    seed = dashboard.seed_figures(run_ids)
    return {key: seed[key]["value"] for key in FIGURE_KEYS} | {
        # How each figure reads, for the table: its label, unit and counts (the JSON keeps the
        # plain values above, as the dashboard's JSON has them).
        "figure_details": {
            key: {name: seed[key][name] for name in ("label", "unit", "counts")}
            for key in FIGURE_KEYS
        },
        "auto_recovered": seed["auto_recovery_rate"]["counts"][0],
        "runs_with_faults": seed["auto_recovery_rate"]["counts"][1],
        # Per resume (approval, wake-up, release, reclaimed lease): the duplicates after it.
        "duplicates_after_resume": seed["duplicates_after_resume"]["extra"],
    }


def _ledger_check(run_ids, sandbox: SandboxClient) -> dict:
    """What the outside world saw (the sandbox ledger), against our own records: side effects
    committed twice for one step, and any committed without a snapshot written before it."""
    ledger = []
    for run_id in run_ids:
        ledger.extend(sandbox.ledger(run=str(run_id)))
    writes = Counter((e["run"], e["step"], e["system"], e["action"]) for e in ledger)
    duplicated = [
        {"run": run, "step": step, "system": system, "action": action, "committed": n}
        for (run, step, system, action), n in writes.items()
        if n > 1
    ]
    first_snapshot: dict[str, datetime] = {}
    for key, taken in Snapshot.objects.filter(run_id__in=run_ids).values_list(
        "idempotency_key", "created_at"
    ):
        first_snapshot[key] = min(first_snapshot.get(key, taken), taken)
    unsnapshotted = [
        e["idempotency_key"]
        for e in ledger
        if not (
            e["idempotency_key"] in first_snapshot
            and first_snapshot[e["idempotency_key"]] <= _parse_at(e["at"])
        )
    ]
    mismatches = _records_against_the_world(run_ids, ledger)
    return {
        "duplicate_side_effects": len(duplicated),
        "duplicates": duplicated,
        "side_effects_committed": len(ledger),
        "committed_without_snapshot": len(unsnapshotted),
        "ledger_mismatches": len(mismatches),
        "mismatches": mismatches,
    }


def _records_against_the_world(run_ids, ledger: list[dict]) -> list[dict]:
    """Ledger rows whose recorded outcome the target system contradicts: recorded committed
    with a receipt the system never issued (or with nothing there at all), or recorded not
    committed although the system has it. A stale worker recording over the new owner's work
    shows up here."""
    world: dict[str, list[dict]] = {}
    for entry in ledger:
        world.setdefault(entry["idempotency_key"], []).append(entry)
    found = []
    for effect in SideEffect.objects.filter(run_id__in=run_ids).values(
        "run_id", "idempotency_key", "tool", "status", "external_id", "confirmed_by"
    ):
        there = world.get(effect["idempotency_key"], [])
        issued = {e["external_id"] for e in there}
        status = effect["status"]
        problem = ""
        if status in (SideEffect.Status.COMMITTED, SideEffect.Status.COMPENSATED):
            if not there:
                problem = "recorded committed; the system has no record of the key"
            elif effect["external_id"] and effect["external_id"] not in issued:
                problem = f"recorded receipt {effect['external_id']}; the system issued {issued}"
        elif status == SideEffect.Status.NOT_COMMITTED and there:
            problem = "recorded not committed; the system has it"
        if problem:
            found.append({**effect, "run_id": str(effect["run_id"]), "problem": problem})
    return found


def _through_fallback_once(run_ids, sandbox: SandboxClient) -> int:
    """Runs whose step ended degraded with exactly one effect in the world, the fallback's."""
    degraded = Step.objects.filter(run_id__in=run_ids, status=Step.Status.DEGRADED)
    return sum(
        1
        for step in degraded.select_related("run")
        if [e["idempotency_key"] for e in sandbox.ledger(run=str(step.run_id))]
        == [f"{engine.idempotency_key_for(step)}:fallback:mail.send"]
    )


def compute_report(
    run_ids: list,
    sandbox: SandboxClient,
    batches: list = (),  # the drill's batches (taskpilots.evidence.drill.Batch)
    *,
    episodes: list[stalls.Episode] = (),
    stall_folder: stalls.StallFolder | None = None,
) -> dict:
    """Counts from the database, the outside world's view from the sandbox ledger, the seed
    figures from approvals.metrics (one definition for the dashboard and the drill), and what
    each stalled worker did after losing its claim (taskpilots/evidence/stalls.py)."""
    runs = {str(r.pk): r for r in Run.objects.filter(pk__in=run_ids)}
    status = Counter(r.status for r in runs.values())
    # Lost: neither finished nor parked for a person with a reason.
    lost = [
        r
        for r in runs.values()
        if not (r.is_terminal or (r.status in Run.HUMAN and r.attention_reason))
    ]
    per_kind = {}
    for batch in batches:
        ids = [str(r) for r in batch.run_ids]
        figures = _figures(ids)
        per_kind[batch.kind] = {
            "runs": len(ids),
            "succeeded": sum(1 for i in ids if runs[i].status == "succeeded"),
            "needs_human": sum(1 for i in ids if runs[i].status in Run.HUMAN),
            "faults_hit": figures["runs_with_faults"],
            "auto_recovered": figures["auto_recovered"],
        }
        if batch.kind == "degrade_write":
            per_kind[batch.kind]["through_fallback_once"] = _through_fallback_once(ids, sandbox)
    return {
        "runs": len(runs),
        "succeeded": status["succeeded"],
        "needs_human": status["needs_human"] + status["taken_over"],
        "failed": status["failed"],
        "cancelled": status["cancelled"],
        "compensated": status["compensated"],
        "lost_runs": len(lost),
        **_ledger_check(runs, sandbox),
        **_figures(list(runs)),
        **stalls.analyse(list(episodes), stall_folder, sandbox),
        # changed_result: answers found by key a person confirmed; external_mismatch: found.
        "results_changed": _events(runs, Verb.SIDE_EFFECT_RESULT_CHANGED),
        "external_mismatches": ExternalMismatch.objects.filter(run_id__in=list(runs)).count(),
        "per_kind": per_kind,
    }


def _events(run_ids, verb: str) -> int:
    return TimelineEvent.objects.filter(run_id__in=list(run_ids), verb=verb).count()

from __future__ import annotations

import dataclasses
import json
import math

from django.core.management.base import BaseCommand, CommandError

from taskpilots import peers
from taskpilots.evidence import scratch
from taskpilots.evidence.drill import Drill, DrillConfig, parse_faults, progress_to_stderr
from taskpilots.evidence.drill_report import FIGURE_KEYS

# Counts, the outside world's view (sandbox ledger), then the seed figures (approvals.metrics),
# then what stalled workers did (the zombie and partition drills).
KEYS = (
    "runs",
    "succeeded",
    "needs_human",
    "failed",
    "lost_runs",
    "duplicate_side_effects",
    "committed_without_snapshot",
    "ledger_mismatches",
    "results_changed",  # changed_result: a person confirmed each
    "external_mismatches",  # external_mismatch: found by the consistency check
    "runs_with_faults",
    "auto_recovered",
    *FIGURE_KEYS,
    "stalls_injected",
    "claims_not_taken_back",
    "hung_workers",
    "stale_calls",
    "stale_writes",
    "elapsed_s",
)
# What the table's less obvious lines mean (the figures carry their own labels).
LEGEND = (
    "needs_human: runs still waiting for a person when the drill ended (its stand-in person "
    "answers approvals, confirms unknown outcomes and retries after outages as they come, so "
    "usually 0).",
    "human_takeover_rate: runs in which that stand-in stepped in at some point (confirmed an "
    "outcome, retried, fixed data…): a person's work, even though nothing is left waiting.",
    "wrong_retry_rate: of the side effects sent again, the share whose earlier attempt had in "
    "fact landed (a duplicate avoided only by the idempotency key).",
)


def reading(value, detail: dict | None) -> str:
    """A figure as a person reads it: a ratio as a percentage with its counts, a duration with
    its unit, and the figure's label; anything else as it is."""
    if detail is None or value is None:
        return "—" if detail is not None else str(value)
    unit, counts = detail.get("unit"), detail.get("counts")
    if unit == "ratio":
        shown = f"{value * 100:.1f} %"
        if counts:
            shown += f" ({counts[0]:,} of {counts[1]:,})"
    elif unit == "ms":
        shown = f"{value:,.1f} ms"
    elif unit == "seconds":
        shown = f"{value:,.1f} s"
    else:
        shown = f"{value:,}"
    return f"{shown:<24} {detail.get('label', '')}"


# Any of these above 0 fails the drill.
BROKEN = {
    "lost_runs": "lost runs",
    "duplicate_side_effects": "duplicate side effects",
    "ledger_mismatches": "ledger rows the target system contradicts",
    "claims_not_taken_back": "claims of stalled workers not taken back",
    "hung_workers": "workers that hang after a stall",
    "stale_calls": "calls by workers that had lost their claim",
    "stale_writes": "records by workers that had lost their claim",
}

# The peer drill (--peers) fails on any of these: a crash that did not happen where it was armed,
# a run that finished with no effect or with two, a receipt the effect does not bear out.
PEER_BROKEN = {
    "crashes_missed": "crashes that did not happen where they were armed",
    "lost": "runs that finished without their effect, or never settled",
    "duplicate_effects": "effects made twice on the receiving side",
    "wrong_receipts": "receipts the effect does not bear out",
}


def _fields(case: dict, kind) -> dict:
    names = {f.name for f in dataclasses.fields(kind)}
    return {k: v for k, v in case.items() if k in names}


class Command(BaseCommand):
    help = (
        "Run the recovery drills of the source articles against the simulated external systems "
        "with real workers, and report the seed metrics from the database and the sandbox ledger."
    )

    def add_arguments(self, parser):
        parser.add_argument("--runs", type=int, default=18, help="how many runs in all")
        parser.add_argument("--faults", default="all", help="comma-separated drill kinds, or all")
        parser.add_argument("--seed", type=int, default=1)
        parser.add_argument("--workers", type=int, default=2)
        parser.add_argument(
            "--concurrency",
            type=int,
            default=1,
            help="threads per worker (1: a fault hits one run at a time; a long soak wants more, "
            "as production runs)",
        )
        parser.add_argument("--json", action="store_true", help="print one JSON object")
        parser.add_argument(
            "--worker-env",
            action="append",
            default=[],
            metavar="NAME=VALUE",
            help="environment for the drill's workers (repeatable), over the drill's own "
            "(TASKPILOTS_LEASE_SECONDS=2, TASKPILOTS_TOOL_TIMEOUT_SECONDS=1, …)",
        )
        parser.add_argument(
            "--chaos",
            action="store_true",
            help="soak: SIGKILL workers, restart the broker and PostgreSQL, drop the sandbox",
        )
        parser.add_argument(
            "--peers",
            action="store_true",
            help="instead of the drill kinds: the kill matrix against real third-party MCP "
            "servers (the filesystem and git servers; a worker SIGKILLed before the send, "
            "during the call, after the answer), --runs crashes rounded up to whole matrices; "
            "reports local_recovery_rate per peer",
        )
        parser.add_argument(
            "--peer-config",
            default="reference",
            help="with --peers: runs/agents/reference.py as it is (reference), without its "
            "verifications (unverified), or only the servers' own annotations (annotations)",
        )
        parser.add_argument(
            "--here",
            action="store_true",
            help="run in the configured database (its drill runs, rules and user stay there) "
            "instead of a scratch database that is dropped afterwards",
        )
        parser.add_argument(
            "--keep",
            action="store_true",
            help="keep the scratch database afterwards (it is kept anyway when the drill fails)",
        )

    def handle(self, *args, **options):
        if options["runs"] < 1:
            raise CommandError("--runs must be at least 1")
        if options["concurrency"] < 1:
            raise CommandError("--concurrency must be at least 1")
        try:
            faults = parse_faults(options["faults"])
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        worker_env = self._worker_env(options)
        if options["peers"]:
            # Imported here: it needs the `agents` extra (MCP), which the other drills do not.
            from taskpilots.evidence import peer_drill

            try:
                peer_drill.configs(options["peer_config"])
            except ValueError as exc:
                raise CommandError(str(exc)) from None
        if not options["here"]:
            self._in_scratch_database(options)
            return
        if options["peers"]:
            self._peers(options)
            return
        config = DrillConfig(
            runs=options["runs"],
            faults=faults,
            seed=options["seed"],
            workers=max(options["workers"], 4 if options["chaos"] else 1),
            concurrency=options["concurrency"],
            progress=progress_to_stderr,
            chaos=options["chaos"],
            batch_timeout=300.0 if options["chaos"] else 90.0,
            worker_env=worker_env,
        )
        with Drill(config) as drill:
            report = drill.run()
        if options["json"]:
            self.stdout.write(json.dumps(report, sort_keys=True))
        else:
            self._print_table(report)
        broken = [f"{report[key]} {what}" for key, what in BROKEN.items() if report[key]]
        if broken:
            raise CommandError(
                f"{', '.join(broken)}: recovery is broken; see the runs in the console."
            )

    def _worker_env(self, options) -> dict[str, str]:
        worker_env = {}
        for item in options["worker_env"]:
            name, equals, value = item.partition("=")
            if not equals or not name:
                raise CommandError(f"--worker-env {item!r}: expected NAME=VALUE")
            worker_env[name] = value
        return worker_env

    def _print_table(self, report: dict) -> None:
        width = max(len(k) for k in KEYS)
        details = report.get("figure_details", {})
        for key in KEYS:
            self.stdout.write(f"{key:<{width}}  {reading(report[key], details.get(key))}")
        self.stdout.write("")
        for line in LEGEND:
            self.stdout.write(line)
        self.stdout.write("")
        columns = ("runs", "succeeded", "needs_human", "faults_hit", "auto_recovered")
        self.stdout.write(f"{'kind':<20}" + "".join(f"{c:>15}" for c in columns))
        for kind, row in report["per_kind"].items():
            self.stdout.write(f"{kind:<20}" + "".join(f"{row[c]:>15}" for c in columns))
        if "degrade_write" in report["per_kind"]:
            once = report["per_kind"]["degrade_write"]["through_fallback_once"]
            self.stdout.write(f"degrade_write: {once} runs done by the fallback, one effect each")
        if report["episodes"]:
            self.stdout.write("")
            self.stdout.write("stalls (zombie: what was stopped; partition: how the hole ended)")
            for e in report["episodes"]:
                what = f"{e['kind']} {e['moment']} {e['variant']} {e['wake']}"
                taken = e["taken_back_after_s"]
                self.stdout.write(
                    f"  {what:<48} taken back {taken if taken is not None else '—':>5} s  "
                    f"mails {e['mail_sent']}  {e['verdict'] or e['note']}"
                )

    def _peers(self, options) -> None:
        from taskpilots.evidence import peer_drill

        matrix = len(peer_drill.PEERS) * len(peer_drill.MOMENTS)
        try:
            report = peer_drill.run_drill(
                rounds=math.ceil(options["runs"] / matrix),
                mode=options["peer_config"],
                progress=progress_to_stderr,
                worker_env=self._worker_env(options),
            )
        except peers.PeerMissing as exc:
            raise CommandError(str(exc)) from None
        if options["json"]:
            self.stdout.write(json.dumps(report, sort_keys=True))
        else:
            self._print_peers(report)
        broken = [f"{report[key]} {what}" for key, what in PEER_BROKEN.items() if report[key]]
        if broken:
            raise CommandError(f"{', '.join(broken)}: recovery is broken; see the cases above.")

    def _print_peers(self, report: dict) -> None:
        from taskpilots.evidence import peer_drill

        self.stdout.write(f"peer configuration: {report['mode']}")
        columns = (
            "crashes",
            "finished_without_person",
            "local_recovery_rate",
            "writes_reached_server",
            "extra_writes",
            "resent",
        )
        self.stdout.write(f"{'peer':<12}" + "".join(f"{c:>24}" for c in columns))
        for peer, row in report["peers"].items():
            self.stdout.write(f"{peer:<12}" + "".join(f"{str(row[c]):>24}" for c in columns))
        self.stdout.write("")
        for case in report["cases"]:
            self.stdout.write(
                peer_drill.PeerMatrix.line(peer_drill.Case(**_fields(case, peer_drill.Case)))
            )
        self.stdout.write(f"elapsed_s  {report['elapsed_s']}")

    def _in_scratch_database(self, options) -> None:
        """The drill again, with --here, in a scratch database that is dropped afterwards, so the
        install it was run on keeps its rules, users, workflows and sandbox as they were."""
        argv = [
            f"--{name}={options[name]}"
            for name in ("runs", "faults", "seed", "workers", "concurrency")
        ]
        argv += [f"--worker-env={item}" for item in options["worker_env"]]
        argv += [f"--{flag}" for flag in ("json", "chaos", "peers") if options[flag]]
        argv += [f"--peer-config={options['peer_config']}"]
        failed = False
        with scratch.scratch_database(
            "drill", progress_to_stderr, keep=lambda: options["keep"] or failed
        ) as url:
            failed = scratch.run_here("drill", argv, url) != 0
        if failed:
            raise CommandError("the drill failed; its runs are in the scratch database above")

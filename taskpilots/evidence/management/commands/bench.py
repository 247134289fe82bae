from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from taskpilots.evidence import bench


class Command(BaseCommand):
    help = (
        "Benchmarks (docs/benchmarks.md): engine (throughput vs plain PostgreSQL commits and vs "
        "DBOS), snapshot (a side-effect step vs the bare call), recovery (kill/approval/event to "
        "next step). Runs in a scratch database next to the configured one; ends with a JSON line."
    )

    def add_arguments(self, parser):
        parser.add_argument("which", choices=["engine", "snapshot", "recovery"])
        parser.add_argument("--runs", type=int, default=500)
        parser.add_argument("--workers", type=int, default=2)
        parser.add_argument("--samples", type=int, default=200)
        parser.add_argument("--no-dbos", action="store_true")
        parser.add_argument(
            "--here",
            action="store_true",
            help="use the configured database instead of a scratch one",
        )

    def handle(self, *args, which, runs, workers, samples, no_dbos, here, **options):
        if runs < 1 or workers < 1 or samples < 1:
            raise CommandError("--runs, --workers and --samples must be at least 1")
        if not here:
            argv = [
                which,
                "--runs",
                str(runs),
                "--workers",
                str(workers),
                "--samples",
                str(samples),
            ] + (["--no-dbos"] if no_dbos else [])
            raise SystemExit(bench.run_in_scratch_database(argv, bench.to_stderr))
        say = bench.to_stderr
        if which == "engine":
            result = bench.bench_engine(runs, workers, say, with_dbos=not no_dbos)
        elif which == "snapshot":
            result = bench.bench_snapshot(samples, say)
        else:
            result = bench.bench_recovery(max(3, samples // 10), say)
        self.stdout.write(json.dumps(result, sort_keys=True))

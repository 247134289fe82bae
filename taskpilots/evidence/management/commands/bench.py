from __future__ import annotations

import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from taskpilots.evidence import artifacts, bench


class Command(BaseCommand):
    help = (
        "Benchmarks (docs/benchmarks.md): engine (throughput vs plain PostgreSQL commits and vs "
        "DBOS), snapshot (a side-effect step vs the bare call), recovery (kill/approval/event to "
        "next step), io (waiting runs in flight on make run's workers vs DBOS), console (every "
        "console page through gunicorn at --runs fake runs: p50, p95, queries), inbox "
        "(--consoles open inboxes polling for --seconds: requests/s, p95, PostgreSQL work against "
        "idle), crash (workers SIGKILLed mid-call on TaskPilots and DBOS: runs lost, effects "
        "duplicated or left unknown, kill to resumed work). Runs in a scratch database next to "
        "the configured one; ends with a JSON line."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "which", choices=["engine", "snapshot", "recovery", "io", "console", "inbox", "crash"]
        )
        # crash: kills per system and target, and the seed of the kill schedule.
        parser.add_argument("--kills", type=int, default=20)
        parser.add_argument("--seed", type=int)
        # inbox: how many open inboxes poll, and for how long (and as long again idle).
        parser.add_argument("--consoles", type=int, default=50)
        # inbox: how long the inboxes poll (20 s); engine: how long each measurement lasts (30 s).
        parser.add_argument("--seconds", type=float)
        # engine: the calibration's runs (and each measurement's least, 300), the interleaved
        # pairs; the other benchmarks: their runs (500).
        parser.add_argument("--runs", type=int)
        parser.add_argument("--pairs", type=int, default=5)
        parser.add_argument("--workers", type=int, default=2)
        parser.add_argument("--samples", type=int, default=200)
        parser.add_argument("--no-dbos", action="store_true")
        # io: each call waits this long. engine and io: the pool options default to make run's
        # worker (taskpilots/workerconf.py), these try another configuration.
        parser.add_argument("--latency-ms", type=int, default=500)
        parser.add_argument("--pool", choices=["prefork", "threads", "gevent", "eventlet", "solo"])
        parser.add_argument("--concurrency", type=int)
        parser.add_argument(
            "--record",
            metavar="FILE",
            help="append the environment, the raw samples and the result to FILE (JSON Lines; "
            "docs/results/<name>.jsonl for the figures the docs quote)",
        )
        # recovery: with every CPU kept busy by bench.five runs beside the measurement.
        parser.add_argument("--busy", action="store_true")
        parser.add_argument(
            "--here",
            action="store_true",
            help="use the configured database instead of a scratch one",
        )

    def handle(self, *args, which, runs, workers, samples, no_dbos, here, record, **options):
        runs = runs or (300 if which == "engine" else 500)
        if runs < 1 or workers < 1 or samples < 1:
            raise CommandError("--runs, --workers and --samples must be at least 1")
        io = {k: options[k] for k in ("latency_ms", "pool", "concurrency")}
        if io["latency_ms"] < 0 or (io["concurrency"] is not None and io["concurrency"] < 1):
            raise CommandError("--latency-ms must be at least 0 and --concurrency at least 1")
        if which == "inbox":
            options["seconds"] = options["seconds"] or 20.0
            if options["consoles"] < 1 or options["seconds"] < 5:
                raise CommandError("--consoles must be at least 1 and --seconds at least 5")
        if options["kills"] < 1 or options["pairs"] < 1:
            raise CommandError("--kills and --pairs must be at least 1")
        if not here:
            argv = [which, "--runs", str(runs), "--workers", str(workers)]
            argv += ["--samples", str(samples)] + (["--no-dbos"] if no_dbos else [])
            argv += self._scratch_argv(io, record, options)
            if which == "console":
                from taskpilots.evidence.bench_console import run_in_scratch_database
            elif which == "inbox":
                from taskpilots.evidence.bench_live import run_in_scratch_database
            else:
                run_in_scratch_database = bench.run_in_scratch_database
            raise SystemExit(run_in_scratch_database(argv, bench.to_stderr))
        started_in = artifacts.environment() if record else None
        result = self._run(which, runs, workers, samples, not no_dbos, io, options)
        # The raw samples go to the record only; the last line stays one readable summary.
        samples_taken = result.pop("samples", [])
        if record:
            artifacts.write(record, which, result, samples_taken, started_in)
        self.stdout.write(json.dumps(result, sort_keys=True))

    @staticmethod
    def _scratch_argv(io: dict, record: str | None, options: dict) -> list[str]:
        """The options the run in the scratch database gets again."""
        argv = []
        for name, value in io.items():
            if value is not None:
                argv += [f"--{name.replace('_', '-')}", str(value)]
        argv += ["--consoles", str(options["consoles"]), "--pairs", str(options["pairs"])]
        if options["seconds"] is not None:
            argv += ["--seconds", str(options["seconds"])]
        argv += ["--kills", str(options["kills"])]
        if options["seed"] is not None:
            argv += ["--seed", str(options["seed"])]
        if record:
            argv += ["--record", str(Path(record).resolve())]
        if options["busy"]:
            argv += ["--busy"]
        return argv

    @staticmethod
    def _run(which, runs, workers, samples, with_dbos, io, options) -> dict:
        say = bench.to_stderr
        if which == "engine":
            from taskpilots.evidence.bench_engine import bench_engine

            seconds = 30.0 if options["seconds"] is None else options["seconds"]
            return bench_engine(
                runs,
                workers,
                say,
                with_dbos=with_dbos,
                pool=io["pool"],
                concurrency=io["concurrency"],
                pairs=options["pairs"],
                seconds=seconds,
            )
        if which == "io":
            from taskpilots.evidence.bench_io import bench_io

            return bench_io(runs, say=say, with_dbos=with_dbos, **io)
        if which == "console":
            from taskpilots.evidence.bench_console import bench_console

            return bench_console(runs, say, workers=workers)
        if which == "inbox":
            from taskpilots.evidence.bench_live import bench_inbox

            return bench_inbox(runs, options["consoles"], options["seconds"], say, workers=workers)
        if which == "crash":
            from taskpilots.evidence.bench_crash import DEFAULT_SEED, bench_crash

            seed = DEFAULT_SEED if options["seed"] is None else options["seed"]
            return bench_crash(options["kills"], say, seed=seed, latency_ms=io["latency_ms"])
        if which == "snapshot":
            return bench.bench_snapshot(samples, say)
        from taskpilots.evidence.bench_recovery import bench_recovery

        return bench_recovery(max(3, samples // 10), say, busy=options["busy"])

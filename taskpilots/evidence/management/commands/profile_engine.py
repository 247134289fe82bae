from __future__ import annotations

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from taskpilots.evidence import bench, profile


class Command(BaseCommand):
    help = profile.__doc__.split("\n\n")[0] + " See taskpilots/evidence/profile.py."

    def add_arguments(self, parser):
        parser.add_argument(
            "--tool",
            choices=["cpu", "cprofile", "callgrind", "instructions", "perf", "postgres", "workers"],
            default="cpu",
        )
        parser.add_argument("--runs", type=int, default=300)
        parser.add_argument("--repeat", type=int, default=5, help="rounds, each with and without")
        parser.add_argument(
            "--workflow", choices=["bench.five", "bench.verified"], default="bench.five"
        )
        parser.add_argument("--payload-kb", default="1,16", help="LOW,HIGH; 0,0 for none")
        parser.add_argument("--out", default=str(Path("var") / "profiles"))
        parser.add_argument(
            "--record", help="the JSON Lines file to append to (--out/profile.jsonl)"
        )
        parser.add_argument("--here", action="store_true", help="in the configured database")

    def handle(self, *args, tool, runs, repeat, workflow, payload_kb, out, here, record, **options):
        try:
            low, high = (int(v) for v in payload_kb.split(","))
        except ValueError:
            raise CommandError("--payload-kb is LOW,HIGH in KB, e.g. 1,16 (0,0 for none)") from None
        if runs < 1 or repeat < 1 or low < 0 or high < low:
            raise CommandError(
                "--runs and --repeat must be at least 1 and --payload-kb LOW,HIGH with LOW <= HIGH"
            )
        out_dir = Path(out).resolve()
        record = Path(record).resolve() if record else out_dir / "profile.jsonl"
        if not here:  # in a scratch database, as bench does
            argv = ["--tool", tool, "--runs", str(runs), "--repeat", str(repeat)]
            argv += ["--workflow", workflow]
            argv += ["--payload-kb", payload_kb, "--out", str(out_dir), "--record", str(record)]
            raise SystemExit(self._in_scratch(argv))
        try:
            figures = profile.profile(tool, workflow, runs, (low, high), out_dir, record, repeat)
        except RuntimeError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(profile.main_json(figures))

    def _in_scratch(self, argv: list[str]) -> int:
        from taskpilots.evidence import scratch

        with scratch.scratch_database("profile", bench.to_stderr) as url:
            return scratch.run_here("profile_engine", argv, url)

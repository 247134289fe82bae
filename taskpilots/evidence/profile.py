"""Where a step's CPU goes, reproducibly: the profiles docs/benchmarks.md may quote.

    python manage.py profile_engine [--tool cpu|cprofile|callgrind|perf] [--runs 300]
                                    [--workflow bench.five] [--payload-kb 1,16] [--out DIR]

Runs `--runs` runs of the workflow through `engine.advance` in this one process (a worker's path
without Celery, so the figures are the engine's own), after as many again to warm the caches and
plans, in a scratch database, and reports CPU per run of starting and of advancing them:

- `cpu` (the default): CPU seconds of this process per run, start and advance apart;
- `cprofile`: the same under cProfile, the 30 functions with most own time, and the stats file;
- `callgrind`: the measured loop again under `valgrind --tool=callgrind` (instruction counts,
  deterministic across runs of the same commit; read with callgrind_annotate or kcachegrind);
- `perf`: the measured loop under `perf record -g` (a sampled profile including PostgreSQL's
  side when run as root: `perf report`).

The profiles go to `--out` (var/profiles by default); each measurement appends its figures with
its environment (artifacts.py) to `--record` (`--out`/profile.jsonl by default;
docs/results/profile.jsonl for the table docs/benchmarks.md quotes), so a figure quoted in the docs
names the commit and the machine it came from.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

from taskpilots.evidence import artifacts


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(workflow: str, runs: int, payload_kb: tuple[int, int], profiler=None) -> dict:
    """Start and advance `runs` runs here (after `runs` warm-up runs): CPU ms per run of each."""
    from django.conf import settings

    from runs import engine
    from taskpilots.evidence import bench_flows  # noqa: F401  (the bench workflows)
    from taskpilots.evidence.bench_payloads import document

    settings.TASKPILOTS["DISPATCH"] = "none"
    tag = uuid.uuid4().hex[:6]
    low, high = payload_kb

    # The documents are made before the clock starts: making one costs more than storing it.
    docs = {n: document(n, low, high) for n in range(2 * runs)} if high else {}

    def start(n: int):
        data = {"n": n, "doc": docs[n]} if high else {"n": n}
        return engine.start_run(workflow, data, business_key=f"prof-{tag}-{n}")[0].pk

    for pk in [start(n) for n in range(runs)]:
        engine.advance(pk, budget=60)
    inputs = range(runs, 2 * runs)
    if profiler is not None:
        profiler.enable()
    began, wall = _cpu_s(), time.perf_counter()
    ids = [start(n) for n in inputs]
    started = _cpu_s()
    for pk in ids:
        engine.advance(pk, budget=60)
    advanced = _cpu_s()
    wall = time.perf_counter() - wall
    if profiler is not None:
        profiler.disable()
    return {
        "workflow": workflow,
        "runs": runs,
        "payload_kb": list(payload_kb),
        "start_cpu_ms_per_run": round((started - began) * 1000 / runs, 3),
        "advance_cpu_ms_per_run": round((advanced - started) * 1000 / runs, 3),
        "wall_ms_per_run": round(wall * 1000 / runs, 3),
    }


def profile(
    tool: str, workflow: str, runs: int, payload_kb: tuple[int, int], out: Path, record: Path
) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    started_in = artifacts.environment()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    if tool in ("callgrind", "perf"):
        return _under(tool, workflow, runs, payload_kb, out, stamp)
    if tool == "cprofile":
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        figures = measure(workflow, runs, payload_kb, profiler)
        path = out / f"engine-{stamp}.prof"
        profiler.dump_stats(path)
        pstats.Stats(str(path), stream=sys.stderr).sort_stats("tottime").print_stats(30)
        figures["file"] = str(path)
    else:
        figures = measure(workflow, runs, payload_kb)
    figures["tool"] = tool
    artifacts.write(record, "profile", figures, [], started_in)
    return figures


def _under(tool: str, workflow: str, runs: int, payload_kb, out: Path, stamp: str) -> dict:
    """This command again (`--tool cpu`) under valgrind or perf."""
    program = {"callgrind": "valgrind", "perf": "perf"}[tool]
    if shutil.which(program) is None:
        raise RuntimeError(f"{program} is not installed (apt-get install {program.split()[0]})")
    path = out / f"engine-{stamp}.{tool}"
    wrapper = (
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={path}"]
        if tool == "callgrind"
        else ["perf", "record", "-g", "-o", str(path), "--"]
    )
    command = [
        *wrapper,
        sys.executable,
        "manage.py",
        "profile_engine",
        "--tool",
        "cpu",
        "--workflow",
        workflow,
        "--runs",
        str(runs),
        "--payload-kb",
        ",".join(map(str, payload_kb)),
        "--out",
        str(out),
        "--record",
        str(out / "profile.jsonl"),
        "--here",
    ]
    subprocess.run(command, cwd=artifacts.ROOT, env=os.environ.copy(), check=True)
    return {"tool": tool, "file": str(path), "workflow": workflow, "runs": runs}


def main_json(figures: dict) -> str:
    return json.dumps(figures, sort_keys=True)


def render_profile(records: list[dict]) -> str:
    """docs/benchmarks.md's table of CPU per run, from docs/results/profile.jsonl: every `cpu`
    result recorded there, in order, under the environment of the last."""
    from taskpilots.evidence.bench_engine import describe_environment

    pairs = []
    env = None
    for record in records:
        if record["kind"] == "environment":
            env = record
        elif record["kind"] == "result" and record.get("tool") == "cpu":
            pairs.append((env, record))
    lines = [
        describe_environment(pairs[-1][0]),
        "",
        "| workflow | payloads | start, CPU ms per run | advance (5 steps), CPU ms per run |",
        "|---|---|---|---|",
    ]
    for _, result in pairs:
        low, high = result["payload_kb"]
        payload = "none" if not high else f"{low}–{high} KB"
        lines.append(
            f"| `{result['workflow']}` | {payload} | {result['start_cpu_ms_per_run']:.2f} | "
            f"{result['advance_cpu_ms_per_run']:.2f} |"
        )
    return "\n".join(lines) + "\n"

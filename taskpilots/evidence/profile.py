"""Where a step's CPU goes, reproducibly: the profiles docs/benchmarks.md may quote.

    python manage.py profile_engine [--tool cpu|cprofile|callgrind|instructions|perf|postgres|
                                            workers]
                                    [--runs 300] [--workflow bench.five] [--payload-kb 1,16]
                                    [--out DIR]

Runs `--runs` runs of the workflow through `engine.advance` in this one process (a worker's path
without Celery, so the figures are the engine's own), after as many again to warm the caches and
plans, in a scratch database, and reports CPU per run of starting and of advancing them:

- `cpu` (the default): CPU seconds per run of this process and of the PostgreSQL backends that
  served it (from /proc, where the server is on this machine), start and advance apart;
- `cprofile`: the same under cProfile timed by CPU (not wall) time, the 30 functions with most
  own time, and the stats file;
- `callgrind`: the measured loop again under `valgrind --tool=callgrind` (instruction counts,
  deterministic across runs of the same commit; read with callgrind_annotate or kcachegrind);
- `instructions`: the loop's instructions per run by callgrind (the loop at `--runs` and at
  twice as many, subtracted): the figure that does not drift with the host's speed;
- `perf`: the measured loop under `perf record -g` (a sampled profile including PostgreSQL's
  side when run as root: `perf report`);
- `postgres`: the measured loop while `perf record -a -g` samples the machine, PostgreSQL's
  backends' samples split by what they were doing (taskpilots/evidence/profile_postgres.py);
- `workers`: not this process but two Celery workers under `bench engine`'s load, one of them
  sampled by py-spy, its samples split into Celery's share and the engine's
  (taskpilots/evidence/profile_workers.py; `--runs` is the measurement's size, 3,000 or more).

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
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

from taskpilots.evidence import artifacts


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _postgres_cpu_s() -> float | None:
    """CPU seconds of PostgreSQL's processes serving this database's connections (this process's
    pool: the engine's statements), None where they cannot be read (workers.backend_cpu_s)."""
    from django.db import connection

    from taskpilots.evidence.workers import backend_cpu_s

    return backend_cpu_s(connection.settings_dict["NAME"], own=True)


def _block(workflow: str, numbers: range, payload_kb: tuple[int, int], profiler=None):
    """Start, then advance, one run per number: CPU ms per run of each, this process's and its
    PostgreSQL backends' (None where those cannot be read); documents made first."""
    from runs import engine
    from taskpilots.evidence.bench_payloads import document

    low, high = payload_kb
    tag = uuid.uuid4().hex[:6]
    inputs = [{"n": n, "doc": document(n, low, high)} if high else {"n": n} for n in numbers]
    if profiler is not None:
        profiler.enable()
    # PostgreSQL's side is read between the timed stretches (a read scans /proc): this
    # process's CPU for it counts in neither.
    server_began = _postgres_cpu_s()
    began = _cpu_s()
    ids = [
        engine.start_run(workflow, data, business_key=f"prof-{tag}-{data['n']}")[0].pk
        for data in inputs
    ]
    started = _cpu_s()
    server_started = _postgres_cpu_s()
    resumed = _cpu_s()
    for pk in ids:
        engine.advance(pk, budget=60)
    advanced = _cpu_s()
    server_advanced = _postgres_cpu_s()
    if profiler is not None:
        profiler.disable()
    count = len(numbers)

    def per_run(before, after):
        return None if before is None or after is None else (after - before) * 1000 / count

    return (
        per_run(began, started),
        per_run(resumed, advanced),
        per_run(server_began, server_started),
        per_run(server_started, server_advanced),
    )


def _spread(values: list[float]) -> dict:
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


def measure(
    workflow: str, runs: int, payload_kb: tuple[int, int], repeat: int = 5, profiler=None
) -> dict:
    """`repeat` rounds of `runs` runs with the payloads and `runs` without, alternating (the
    order reversed every other round), after one warm-up round: CPU ms per run of starting and
    of advancing them, median and range over the rounds."""
    from django.conf import settings

    from taskpilots.evidence import bench_flows  # noqa: F401  (the bench workflows)

    settings.TASKPILOTS["DISPATCH"] = "none"
    kinds = (
        {"with_payload": payload_kb, "without_payload": (0, 0)}
        if payload_kb[1]
        else {"without_payload": (0, 0)}
    )
    taken: dict[str, list[tuple]] = {kind: [] for kind in kinds}
    numbers = iter(range(10**9))
    for round_ in range(repeat + 1):
        order = list(kinds) if round_ % 2 == 0 else list(reversed(kinds))
        for kind in order:
            first = next(numbers) * runs
            block = range(first, first + runs)
            figures = _block(workflow, block, kinds[kind], profiler if round_ else None)
            if round_:  # the first round warms the caches and plans
                taken[kind].append(figures)
    result = {"workflow": workflow, "runs": runs, "repeat": repeat, "payload_kb": list(payload_kb)}
    names = (
        "start_cpu_ms_per_run",
        "advance_cpu_ms_per_run",
        "start_postgres_cpu_ms_per_run",
        "advance_postgres_cpu_ms_per_run",
    )
    for kind, rounds in taken.items():
        result[kind] = {
            name: _spread(list(values))
            for name, values in zip(names, zip(*rounds, strict=True), strict=True)
            if None not in values
        }
    return result


def profile(
    tool: str,
    workflow: str,
    runs: int,
    payload_kb: tuple[int, int],
    out: Path,
    record: Path,
    repeat: int = 5,
) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    started_in = artifacts.environment()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    if tool in ("callgrind", "perf"):
        return _under(tool, workflow, runs, payload_kb, out, stamp, repeat)
    if tool == "instructions":
        figures = instructions(workflow, runs, payload_kb, out, stamp)
        artifacts.write(record, "profile", figures, [], started_in)
        return figures
    if tool == "postgres":
        from taskpilots.evidence.profile_postgres import profile_postgres

        figures = profile_postgres(workflow, runs, payload_kb, repeat, out)
    elif tool == "workers":
        from taskpilots.evidence.profile_workers import profile_workers

        figures = profile_workers(workflow, runs, payload_kb, out)
    elif tool == "cprofile":
        import cProfile
        import pstats

        # Timed by this process's CPU clock, not the wall's: time spent waiting for PostgreSQL
        # is not the engine's cost (a wall-clock profile is mostly psycopg's wait).
        profiler = cProfile.Profile(time.process_time)
        figures = measure(workflow, runs, payload_kb, repeat, profiler)
        path = out / f"engine-{stamp}.prof"
        profiler.dump_stats(path)
        pstats.Stats(str(path), stream=sys.stderr).sort_stats("tottime").print_stats(30)
        figures["file"] = str(path)
    else:
        figures = measure(workflow, runs, payload_kb, repeat)
    figures["tool"] = tool
    artifacts.write(record, "profile", figures, [], started_in)
    return figures


def instructions(workflow: str, runs: int, payload_kb, out: Path, stamp: str) -> dict:
    """The in-process loop's instructions per run, by callgrind: the loop (`--tool cpu`, one
    measured round after the warm-up) at `runs` and at twice as many, the difference divided by
    the runs it adds — the process's start, Django's setup and the scratch database's
    connections cancel out. Deterministic for a commit on one Python build, so two commits
    compare on any host, however its speed drifts (CPU seconds do not)."""
    totals = {}
    for size in (runs, 2 * runs):
        print(f"callgrind: the loop at {size} runs (about 50 times slower)…", file=sys.stderr)
        result = _under("callgrind", workflow, size, payload_kb, out, f"{stamp}-{size}", 1)
        totals[size] = callgrind_total(Path(result["file"]))
    # A round's blocks: with and without payloads (or only without), each `size` runs, and the
    # warm-up round before the measured one.
    blocks = (2 if payload_kb[1] else 1) * 2
    added = blocks * runs
    return {
        "tool": "instructions",
        "workflow": workflow,
        "runs": runs,
        "payload_kb": list(payload_kb),
        "instructions": totals,
        "instructions_per_run": round((totals[2 * runs] - totals[runs]) / added),
    }


def callgrind_total(path: Path) -> int:
    """The instructions a callgrind output file counts in all (its `totals:` line)."""
    for line in path.read_text().splitlines():
        if line.startswith(("totals:", "summary:")):
            return int(line.split()[1])
    raise ValueError(f"{path} has no totals line")


def _under(
    tool: str, workflow: str, runs: int, payload_kb, out: Path, stamp: str, repeat: int
) -> dict:
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
        "--repeat",
        str(repeat),
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
    """docs/benchmarks.md's table of CPU per run, from docs/results/profile.jsonl: the last `cpu`
    result of each workflow recorded there (earlier ones stay in the file), each row naming the
    commit it was measured at, under the environment of the last."""
    from taskpilots.evidence.bench_engine_report import describe_environment

    pairs, env = [], None
    for record in records:
        if record["kind"] == "environment":
            env = record
        elif record["kind"] == "result" and record.get("tool") == "cpu" and "repeat" in record:
            pairs.append((env, record))
    if not pairs:
        return "_No profile recorded yet._\n"
    last = {result["workflow"]: result for _, result in pairs}
    pairs = [(env, result) for env, result in pairs if last[result["workflow"]] is result]

    def cell(figures: dict, name: str) -> str:
        figure = figures.get(name)
        if figure is None:  # recorded before PostgreSQL's side was measured, or not readable
            return "—"
        return f"{figure['median']:.2f} ({figure['min']:.2f}–{figure['max']:.2f})"

    lines = [
        describe_environment(pairs[-1][0]),
        "",
        "| commit | workflow | payloads | start, CPU ms per run | advance (its 5 steps), CPU ms "
        "per run | advance, PostgreSQL's CPU ms per run | rounds × runs |",
        "|---|---|---|---|---|---|---|",
    ]
    for env, result in pairs:
        low, high = result["payload_kb"]
        commit = f"`{env['commit'][:7]}`" if env and env.get("commit") else "—"
        for kind, label in (("with_payload", f"{low}–{high} KB"), ("without_payload", "none")):
            if kind in result:
                figures = result[kind]
                lines.append(
                    f"| {commit} | `{result['workflow']}` | {label} | "
                    f"{cell(figures, 'start_cpu_ms_per_run')} | "
                    f"{cell(figures, 'advance_cpu_ms_per_run')} | "
                    f"{cell(figures, 'advance_postgres_cpu_ms_per_run')} | "
                    f"{result['repeat']} × {result['runs']} |"
                )
    return "\n".join(lines) + "\n"

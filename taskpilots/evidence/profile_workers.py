"""Where a Celery worker's CPU goes under `bench engine`'s load.

    python manage.py profile_engine --tool workers [--runs 3000] [--record FILE]

The engine's own cost per run is `profile_engine --tool cpu`'s (one process, no Celery); a worker
under `bench engine` spends more per run than that. This measures where: two workers started as
`bench engine` starts them, a measurement of `--runs` runs of the workflow, and py-spy sampling
one of the workers meanwhile, 100 times a second, only the thread holding the GIL (so a sample
is that process's Python running, not a thread waiting for PostgreSQL). Each sample goes to one
share:

- `consumer`: Celery's event loop on the main thread (AMQP frames read and written, each
  message made into a request and handed to the thread pool, its acknowledgement);
- `task call`: a pool thread around the engine (Celery's tracer, the pool's handoff);
- `engine`: `runs.engine.advance` and what it calls, split into `json` (encoding and decoding),
  `psycopg` (statements sent and rows read, on the client) and `rest`;
- `other`: anything else (threads of psycopg's pool, the interpreter's own).

Sampling is an estimate, so the main thread's part of the worker's CPU is also read exactly, per
thread from /proc (`consumer_cpu_share`, user and system time: the consumer's system calls
included). py-spy samples without stopping the process (`--nonblocking`): stopped at every
sample, the worker's main thread showed in a third of the samples where /proc gave it under a
tenth of the CPU; not stopped, the two agree.

py-spy (`pip install py-spy`) must be installed and allowed to read the worker's memory (root,
or ptrace permitted). The raw samples are kept beside the record (`--out`).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

# (share, a frame that puts a sample in it), the first match wins: a stack is read leaf first.
ENGINE_PARTS = (
    ("json", ("json/encoder.py", "json/decoder.py", "json/__init__.py", "orjson")),
    ("psycopg", ("psycopg/", "psycopg_pool/")),
)
ENGINE = "advance (runs/engine/execute.py"
CONSUMER = "asynloop (celery/worker/loops.py"
POOL_THREAD = "_worker (concurrent/futures/thread.py"


def share_of(stack: str) -> str:
    """The share a py-spy raw stack (root first, frames joined by `;`) belongs to."""
    if ENGINE in stack:
        below = stack[stack.index(ENGINE) :]
        for part, markers in ENGINE_PARTS:
            if any(marker in below for marker in markers):
                return f"engine: {part}"
        return "engine: rest"
    if CONSUMER in stack:
        return "consumer"
    if POOL_THREAD in stack:
        return "task call"
    return "other"


def shares(raw: str) -> dict:
    """Each share's part of the samples (and their count) from py-spy's `--format raw` text."""
    counts: Counter = Counter()
    for line in raw.splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        if stack and count.isdigit() and int(count):
            counts[share_of(stack)] += int(count)
    total = sum(counts.values())
    split = {name: round(n / total, 3) for name, n in sorted(counts.items())} if total else {}
    return {"samples": total, "shares": split}


def threads_cpu_s(pid: int) -> dict[int, float]:
    """CPU seconds (user and system) of each thread of the process, from /proc."""
    ticks = os.sysconf("SC_CLK_TCK")
    spent = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        spent[int(tid)] = (int(fields[11]) + int(fields[12])) / ticks
    return spent


def main_thread_share(pid: int, before: dict[int, float], after: dict[int, float]) -> float:
    """The main thread's part of the process's CPU between the two readings: exact where the
    sampled shares are estimates (the main thread is Celery's consumer and nothing else)."""
    total = sum(after.values()) - sum(before.get(tid, 0.0) for tid in after)
    main = after.get(pid, 0.0) - before.get(pid, 0.0)
    return round(main / total, 3) if total > 0 else 0.0


def py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(found).exists():
        raise RuntimeError("py-spy is not installed: pip install py-spy")
    return found


def profile_workers(workflow: str, runs: int, payload_kb: tuple[int, int], out: Path) -> dict:
    """Start the workers, warm them up, and measure `runs` runs with py-spy on the first."""
    from django.conf import settings

    from taskpilots.evidence import bench_flows  # noqa: F401  (the workflows, here too)
    from taskpilots.evidence.bench import BENCH_MODULES, _worker_pool, broker_name
    from taskpilots.evidence.bench_engine import TaskPilotsSide
    from taskpilots.workerconf import CONCURRENCY, worker_config

    program = py_spy()
    config = worker_config(None, min(CONCURRENCY, settings.DB_POOL_SIZE or 8))
    env = {"TASKPILOTS_WORKFLOW_MODULES": BENCH_MODULES, "TASKPILOTS_INLINE_BUDGET_SECONDS": "30"}
    path = out / f"workers-{time.strftime('%Y%m%d-%H%M%S')}.txt"
    with _worker_pool("celery", {**env, **config.env}) as processes:
        groups = [processes.start(options=config.options()).process.pid for _ in range(2)]
        ours = TaskPilotsSide(processes, groups, payload_kb)
        ours.measure(workflow, min(runs, 300))  # warm up: connections, plans, caches
        sampler = subprocess.Popen(
            [program, "record", "-p", str(groups[0]), "--gil", "-r", "100", "-f", "raw"]
            + ["-o", str(path), "--nonblocking"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        time.sleep(1)  # py-spy attached
        try:
            before = threads_cpu_s(groups[0])
            measured = ours.measure(workflow, runs)
            consumer_cpu = main_thread_share(groups[0], before, threads_cpu_s(groups[0]))
        finally:
            sampler.send_signal(signal.SIGINT)  # py-spy writes what it has on Ctrl-C
            _, errors = sampler.communicate(timeout=60)
    if not path.exists():
        raise RuntimeError(f"py-spy wrote no samples: {errors.decode(errors='replace')[-500:]}")
    figures = shares(path.read_text())
    return {
        "workflow": workflow,
        "runs": runs,
        "payload_kb": list(payload_kb),
        "broker": broker_name(),
        "worker_pool": config.pool,
        "worker_concurrency": config.concurrency,
        "steps_per_s": measured["steps_per_s"],
        "cpu_ms_per_step": measured["cpu_ms_per_step"],
        "file": str(path),
        "consumer_cpu_share": consumer_cpu,
        **figures,
    }


def render_workers(records: list[dict]) -> str:
    """docs/benchmarks.md's table of a worker's samples by share, from
    docs/results/workers.jsonl: its last result under the environment before it."""
    from taskpilots.evidence.bench_engine_report import describe_environment

    env, result = None, None
    for record in records:
        if record["kind"] == "environment":
            env = record
        elif record["kind"] == "result" and record.get("tool") == "workers":
            result = (env, record)
    if result is None:
        return "_No worker profile recorded yet._\n"
    env, figures = result
    cpu = figures["cpu_ms_per_step"]
    lines = [
        describe_environment(env),
        "",
        f"`{figures['workflow']}`, {figures['runs']:,} runs, payloads "
        f"{figures['payload_kb'][0]}–{figures['payload_kb'][1]} KB, 2 workers × "
        f"{figures['worker_concurrency']} threads ({figures['broker']}): "
        f"{figures['steps_per_s']:,.0f} steps/s, the workers' CPU {cpu['workers']:.2f} ms per "
        f"step. Celery's consumer (the worker's main thread) spent "
        f"{figures['consumer_cpu_share']:.0%} of that worker's CPU (per thread, from /proc); "
        f"{figures['samples']:,} samples of it by py-spy:",
        "",
        "| share of the worker's samples | |",
        "|---|---|",
    ]
    for name, part in figures["shares"].items():
        lines.append(f"| {name} | {part:.0%} |")
    return "\n".join(lines) + "\n"

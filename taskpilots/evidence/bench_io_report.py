"""`bench io`'s block of docs/benchmarks.md (manage.py bench_report), rendered from the
records in docs/results/io.jsonl that taskpilots/evidence/bench_io.py wrote."""

from __future__ import annotations

# The sides a `bench io` sample names.
TASKPILOTS, DBOS, DBOS_ONE = "taskpilots", "dbos", "dbos_one_process"


def render_io(records: list[dict]) -> str:
    """The last recorded `bench io` (its environment, samples and result) as Markdown."""
    starts = [n for n, r in enumerate(records) if r.get("kind") == "environment"]
    if not starts:
        return "_No `bench io` recorded yet._\n"
    last = records[starts[-1] :]
    env = last[0]
    result = next((r for r in last if r.get("kind") == "result"), None)
    samples = [r for r in last if r.get("kind") == "sample"]
    if result is None:
        return "_The last `bench io` recorded did not finish._\n"
    pg = env.get("postgres") or {}
    load = env.get("load_avg") or []
    lines = [
        f"Recorded {env.get('at')} at commit `{(env.get('commit') or '?')[:10]}`"
        f"{' (uncommitted changes)' if env.get('dirty') else ''}: {env.get('cpus')} × "
        f"{env.get('cpu_model')}, {env.get('memory_gib')} GiB, load average "
        f"{' / '.join(f'{x:.1f}' for x in load)} (1/5/15 min) as it started, "
        f"PostgreSQL {pg.get('server_version', '?').split(' ')[0]} (synchronous_commit "
        f"{pg.get('synchronous_commit', '?')}, max_connections {pg.get('max_connections', '?')}), "
        f"broker {env.get('broker')}. {result['runs']} runs of two {result['latency_ms']} ms "
        f"calls per measurement (ideal makespan {result['ideal_makespan_s']} s), "
        f"{result['pairs']} pairs in the order {result['order']}.",
        "",
        "| configuration | processes × threads | PostgreSQL pool | makespan, median (range) "
        "| DBOS ÷ TaskPilots, median (range) | client CPU / run | PostgreSQL CPU / run "
        "| peak in flight | peak connections | peak RSS | duplicates / lost |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += _io_rows(result) + _io_pairs(samples) + ["", _io_totals(result) + "."]
    return "\n".join(lines) + "\n"


def _io_rows(result: dict) -> list[str]:
    """One table row per configuration."""
    lines: list[str] = []
    processes, threads, pool = result["processes"], result["concurrency"], result["db_pool_size"]
    rows = [
        (
            "TaskPilots (`make run`'s workers)",
            "",
            f"{processes} × {threads}",
            f"{processes} × {pool}",
        ),
    ]
    if result.get("dbos_makespan_s") is not None or result.get("vs_dbos") is not None:
        rows += [
            (
                "DBOS, same resources",
                "dbos_",
                f"{result['dbos_processes']} × {result['dbos_threads']}",
                f"{result['dbos_processes']} × {result['dbos_sys_db_pool_size']}",
            ),
            (
                "DBOS, one process (its defaults)",
                "dbos_one_process_",
                "1 × unbounded",
                f"1 × {result['dbos_one_process_sys_db_pool_size']}",
            ),
        ]
    for label, prefix, shape, connections in rows:
        side = prefix.rstrip("_") or TASKPILOTS
        ratio = "—"
        if prefix:
            ratio = f"{_num(result.get(f'vs_{side}'))} ({_range(result.get(f'vs_{side}_range'))})"
        rss = result.get(f"{prefix}rss_mb") if prefix else result.get("worker_rss_mb")
        lost = result.get(f"{prefix}lost") if prefix else result.get("runs_lost")
        lines.append(
            f"| {label} | {shape} | {connections} | {_num(result.get(f'{prefix}makespan_s'))} s "
            f"({_range(result.get(f'{prefix}makespan_range_s'))}) | {ratio} "
            f"| {_num(result.get(f'{prefix}cpu_ms_per_run'))} ms "
            f"| {_num(result.get(f'{prefix}db_cpu_ms_per_run'))} ms "
            f"| {result.get(f'{prefix}peak_in_flight')} "
            f"| {result.get(f'{prefix}db_connections_peak')} | {_num(rss)} MB "
            f"| {result.get(f'{prefix}duplicates')} / {lost} |"
        )
    return lines


def _io_pairs(samples: list[dict]) -> list[str]:
    """Each measurement, pair by pair, in the order measured."""
    lines: list[str] = []
    if samples:
        lines += [
            "",
            "Each measurement (makespan, s; client + PostgreSQL CPU per run, ms; load average "
            "over 1 min):",
            "",
            "| pair | order | TaskPilots | DBOS, same resources | DBOS, one process |",
            "|---|---|---|---|---|",
        ]
        for pair in sorted({s["pair"] for s in samples}):
            these = sorted((s for s in samples if s["pair"] == pair), key=lambda s: s["position"])
            cells = {s["side"]: s for s in these}

            order = " → ".join(
                {TASKPILOTS: "TP", DBOS: "DBOS", DBOS_ONE: "DBOS×1"}[s["side"]] for s in these
            )
            lines.append(
                f"| {pair + 1} | {order} | {_cell(cells.get(TASKPILOTS))} "
                f"| {_cell(cells.get(DBOS))} | {_cell(cells.get(DBOS_ONE))} |"
            )
    return lines


def _io_totals(result: dict) -> str:
    totals = (
        f"Every measurement together: TaskPilots {result['runs_succeeded']} runs succeeded, "
        f"{result['runs_failed']} failed, {result['runs_lost']} lost, {result['calls']} calls, "
        f"{result['duplicates']} duplicates, ledger and tool disagreeing on "
        f"{result['landed_without_receipt'] + result['receipt_without_landing']} keys"
    )
    if result.get("dbos_calls") is not None:
        totals += (
            f"; DBOS (same resources) {result['dbos_calls']} calls, {result['dbos_duplicates']} "
            f"duplicates, {result['dbos_failed']} failed, {result['dbos_lost']} lost; DBOS (one "
            f"process) {result['dbos_one_process_calls']} calls, "
            f"{result['dbos_one_process_duplicates']} duplicates, "
            f"{result['dbos_one_process_failed']} failed, {result['dbos_one_process_lost']} lost"
        )
    return totals


def _cell(sample: dict | None) -> str:
    if sample is None:
        return "—"
    return (
        f"{_num(sample['makespan_s'])} ({_num(sample['cpu_ms_per_run'])} + "
        f"{_num(sample['db_cpu_ms_per_run'])}; load {_num(sample.get('load_avg'))})"
    )


def _num(value) -> str:
    if value is None:
        return "—"
    return f"{value:.2f}" if isinstance(value, float) and abs(value) < 100 else f"{value:.0f}"


def _range(values) -> str:
    return "—" if not values else f"{_num(values[0])}–{_num(values[1])}"

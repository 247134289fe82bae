"""`bench engine`'s block of docs/benchmarks.md (manage.py bench_report), rendered from the
records in docs/results/engine.jsonl that taskpilots/evidence/bench_engine.py wrote."""

from __future__ import annotations


def last_record(records: list[dict], benchmark: str) -> tuple[dict, list[dict], dict]:
    """The last recorded result of `benchmark`, with its environment and raw samples."""
    start = max(
        i
        for i, r in enumerate(records)
        if r["kind"] == "environment" and r["benchmark"] == benchmark
    )
    group = [r for r in records[start:] if r["benchmark"] == benchmark]
    result = next(r for r in group if r["kind"] == "result")
    return group[0], [r for r in group if r["kind"] == "sample"], result


def describe_environment(env: dict) -> str:
    pg = env.get("postgres") or {}
    load = ", ".join(f"{v:.1f}" for v in env.get("load_avg") or [])
    return (
        f"Recorded {env.get('at')} at commit `{(env.get('commit') or '?')[:10]}`"
        f"{' (uncommitted changes)' if env.get('dirty') else ''} on {env.get('cpu_model')} "
        f"({env.get('cpus')} CPUs, {env.get('memory_gib')} GiB; load average {load} as it "
        f"started{_load_at_end(env)}), PostgreSQL {pg.get('server_version', '?')} "
        f"(synchronous_commit={pg.get('synchronous_commit', '?')}, "
        f"wal_sync_method={pg.get('wal_sync_method', '?')}), broker {env.get('broker')}."
    )


def _load_at_end(env: dict) -> str:
    end = env.get("load_avg_at_end")
    return f", {', '.join(f'{v:.1f}' for v in end)} as it ended" if end else ""


def _range(summary: dict) -> str:
    return (
        f"**{summary['steps_per_s_median']:,.0f}** "
        f"({summary['steps_per_s_min']:,.0f}–{summary['steps_per_s_max']:,.0f})"
    )


def _ratio(ratio: dict | None) -> str:
    if not ratio:
        return "—"
    return f"**{ratio['median']:.2f}×** ({ratio['min']:.2f}–{ratio['max']:.2f})"


def _records(kinds: dict | None) -> str:
    if not kinds:
        return "—"
    toast = (
        f"; TOAST {kinds['toast_chunks']:g} chunks, {kinds['toast_index_entries']:g} index entries"
        if "toast_chunks" in kinds  # records before 2026-12-07 counted them with the rest
        else ""
    )
    return (
        f"{kinds['heap_inserts']:g} row inserts, {kinds['heap_updates']:g} updates "
        f"(+{kinds['hot_updates']:g} HOT), {kinds['index_inserts']:g} index entries, "
        f"{kinds['row_locks']:g} row locks{toast}; full-page images "
        f"{kinds['full_page_image_bytes']:,} B"
    )


def _cpu(split: dict) -> str:
    parts = ", ".join(f"{k} {v:.2f}" for k, v in split.items() if k != "total" and v is not None)
    return f"{split['total']:.2f} ({parts})"


def _engine_table(env: dict, result: dict) -> list[str]:
    ours = result["taskpilots"]
    sides = [("TaskPilots", ours, None)]
    for variant, label in (
        ("docs", "DBOS as its docs teach"),
        ("steps", "DBOS, every line a step"),
    ):
        if result.get(f"dbos_{variant}"):
            sides.append((label, result[f"dbos_{variant}"], result.get(f"vs_dbos_{variant}")))
    conc = [f"{result['workers']} workers × {result['worker_concurrency']} threads"] + [
        f"{s['processes']} processes × {s['threads']} at once" for _, s, _ in sides[1:]
    ]
    rows = [
        ("steps/s, median (range)", [_range(s) for _, s, _ in sides]),
        ("TaskPilots ÷ this, paired", ["—"] + [_ratio(r) for _, _, r in sides[1:]]),
        ("concurrency", conc),
        ("durable commits per run", [f"{s['commits_per_run']:.2f}" for _, s, _ in sides]),
        ("statements per run", [f"{s.get('statements_per_run', 0):g}" for _, s, _ in sides]),
        ("WAL bytes per run", [f"{s['wal_bytes_per_run']:,.0f}" for _, s, _ in sides]),
        ("WAL records per run", [_records(s.get("wal_records_per_run")) for _, s, _ in sides]),
        ("CPU ms per step (where)", [_cpu(s["cpu_ms_per_step"]) for _, s, _ in sides]),
    ]
    lines = [
        describe_environment(env),
        "",
        f"{result['pairs']} interleaved pairs of about {result['seconds_each']:.0f} s each, "
        f"payloads {result['payload_kb'][0]}–{result['payload_kb'][1]} KB; clock: "
        f"{result['clock']}.",
        "",
        "| | " + " | ".join(label for label, _, _ in sides) + " |",
        "|---" * (len(sides) + 1) + "|",
    ]
    lines += [f"| {name} | " + " | ".join(cells) + " |" for name, cells in rows]
    return lines


def _engine_pairs(samples: list[dict]) -> list[str]:
    lines: list[str] = []
    lines += ["", "Each pair, steps/s in the order measured:", ""]
    pairs = sorted({s["phase"] for s in samples if s["phase"].startswith("pair")})
    lines += ["| pair | order | TaskPilots | DBOS docs | DBOS steps |", "|---|---|---|---|---|"]
    for phase in sorted(pairs, key=lambda p: int(p.split()[1])):
        group = [s for s in samples if s["phase"] == phase]
        order = " → ".join(
            "TaskPilots" if s["system"] == "taskpilots" else s["variant"] for s in group
        )
        by = {("taskpilots" if s["system"] == "taskpilots" else s["variant"]): s for s in group}
        cells = [
            f"{by[k]['steps_per_s']:,.0f}" if k in by else "—"
            for k in ("taskpilots", "docs", "steps")
        ]
        lines.append(f"| {phase.split()[1]} | {order} | " + " | ".join(cells) + " |")
    return lines


def _engine_notes(result: dict) -> list[str]:
    lines: list[str] = []
    tried = result.get("concurrency_tried") or {}
    if tried:
        lines += [
            "",
            "Every DBOS concurrency tried (calibration, steps/s): "
            + "; ".join(
                f"{variant}: "
                + ", ".join(
                    f"{threads} at once {rate:,.0f}"
                    for threads, rate in sorted(rates.items(), key=lambda kv: int(kv[0]))
                )
                for variant, rates in tried.items()
            )
            + ".",
        ]
    slow = result.get("slow_path") or {}
    if slow.get("taskpilots"):
        ours_slow, theirs = slow["taskpilots"], slow.get("dbos")
        text = (
            f"The slow path (`bench.verified`, measured once each): TaskPilots "
            f"{ours_slow['steps_per_s_median']:,.0f} steps/s, "
            f"{ours_slow['statements_per_run']:g} statements and "
            f"{ours_slow['commits_per_run']:.2f} durable commits a run"
        )
        if theirs:
            text += (
                f"; DBOS {theirs['steps_per_s_median']:,.0f} steps/s, "
                f"{theirs['commits_per_run']:.2f} commits a run (ratio {slow['vs_dbos']:.2f}×)"
            )
        lines += ["", text + "."]
    baseline = ", ".join(
        f"{float(rate):,.0f}/s at {conns} connections"
        for conns, rate in sorted(
            result["baseline_commits_per_s"].items(), key=lambda kv: int(kv[0])
        )
    )
    fsync = result.get("pg_test_fsync_ops_per_s")
    lines += [
        "",
        f"Baseline, single-row INSERT commits: {baseline}"
        + (f"; `pg_test_fsync`, one 8 KB write with fdatasync: {fsync:,.0f}/s" if fsync else "")
        + (
            f". TaskPilots's durable commits per second were "
            f"{result['commit_share_of_baseline']:.0%} of the baseline at its connection count."
            if result.get("commit_share_of_baseline") is not None
            else "."
        ),
    ]
    return lines


def render_engine(records: list[dict]) -> str:
    env, samples, result = last_record(records, "engine")
    lines = _engine_table(env, result) + _engine_pairs(samples) + _engine_notes(result)
    return "\n".join(lines) + "\n"

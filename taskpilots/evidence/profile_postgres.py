"""Where PostgreSQL's CPU goes while the engine advances runs: `profile_engine --tool postgres`.

    python manage.py profile_engine --tool postgres [--runs 300] [--repeat 3]
                                    [--record docs/results/postgres.jsonl]

The measured loop of `--tool cpu` (taskpilots/evidence/profile.py: runs started and advanced in
this one process, with and without payloads) runs while `perf record -a -g` samples every CPU.
The samples of the database's backends (in the scratch database, this process's connections,
held in its pool when the loop ends) are then split into parts by what is on their stacks: each
sample goes to the first part in PARTS whose functions appear anywhere on it (so a foreign-key
check's row lock counts as the check, a compression inside an INSERT as compression), the rest
to `other`. Samples of other
PostgreSQL processes (the WAL writer, the checkpointer, other databases' backends) are counted
apart. The warm-up round is sampled too (a fifth of the samples at `--repeat 4`).

It needs `perf` and the right to sample the whole machine (root, or kernel.perf_event_paranoid
at most 0), PostgreSQL's function names (a distribution's server has them; frames without one are
skipped), and an otherwise idle machine. The shares, the most sampled functions and the raw
perf.data's path are appended to `--record`; docs/benchmarks.md's table comes from
docs/results/postgres.jsonl (`render_postgres`).
"""

from __future__ import annotations

import collections
import shutil
import signal
import subprocess
import time
from pathlib import Path

# (key, what it is, the functions that mark it), in the order a sample is matched.
PARTS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (
        "foreign_keys",
        "foreign-key checks at commit (a row lock on the parent each)",
        ("AfterTriggerFireDeferred", "RI_FKey_check_ins", "RI_FKey_check_upd"),
    ),
    ("guards", "the statements' guards (tp_assert, PL/pgSQL)", ("plpgsql_exec_function",)),
    (
        "compression",
        "compressing and decompressing values (lz4, pglz)",
        (
            "toast_compress_datum",
            "pglz_compress",
            "pglz_decompress",
            "LZ4_compress_fast_extState",
            "LZ4_compress_default",
            "LZ4_decompress_safe",
            "detoast_attr",
        ),
    ),
    ("index_inserts", "index entries of rows written", ("ExecInsertIndexTuples",)),
    (
        "row_writes",
        "rows written (heap insert, update, lock)",
        ("heap_insert", "heap_update", "heap_multi_insert", "heap_lock_tuple"),
    ),
    ("json_input", "parsing JSON parameters (jsonb_in)", ("jsonb_in", "json_in", "pg_parse_json")),
    (
        "json_rows",
        "rows built from JSON (jsonb_populate_record[set])",
        ("ExecMakeTableFunctionResult", "populate_record_worker", "populate_recordset_worker"),
    ),
    (
        "json_output",
        "JSON and rows returned (jsonb_out, printtup)",
        ("jsonb_out", "JsonbToCString", "printtup"),
    ),
    (
        "reads",
        "reading rows (index and sequential scans)",
        ("ExecIndexScan", "ExecIndexOnlyScan", "ExecSeqScan", "index_getnext_slot"),
    ),
    (
        "check_constraints",
        "CHECK constraints (read from the catalog's text for each statement)",
        ("ExecConstraints", "ExecRelCheck"),
    ),
    (
        "opening_relations",
        "opening and locking each statement's tables and indexes",
        ("ExecOpenIndices", "ExecCloseIndices", "relation_open", "index_open", "LockRelationOid"),
    ),
    (
        "executor_setup",
        "setting up and tearing down each statement's plan",
        ("standard_ExecutorStart", "standard_ExecutorEnd", "ExecInitNode"),
    ),
    (
        "planning",
        "parsing and planning (cached plans revalidated)",
        (
            "pg_parse_query",
            "pg_analyze_and_rewrite_fixedparams",
            "standard_planner",
            "GetCachedPlan",
            "RevalidateCachedQuery",
        ),
    ),
    ("wal_flush", "flushing WAL at commit (fdatasync)", ("XLogFlush", "issue_xlog_fsync")),
    ("commit", "the rest of commit", ("CommitTransaction", "CommitTransactionCommand")),
    (
        "network",
        "reading and sending messages",
        (
            "secure_read",
            "secure_write",
            "pq_recvbuf",
            "internal_flush",
            "pq_getmessage",
            "__send",
            "__libc_recv",
            "tcp_sendmsg",
            "tcp_recvmsg",
        ),
    ),
)
PART_LABELS = {key: label for key, label, _ in PARTS}
_MARKS = {function: key for key, _, functions in PARTS for function in functions}
_ORDER = {key: i for i, (key, _, _) in enumerate(PARTS)}

FREQUENCY = 999  # samples per second per CPU


def part_of(stack: list[str]) -> str:
    """The part a sample belongs to: the first of PARTS with a function on its stack."""
    found = [_MARKS[name] for name in stack if name in _MARKS]
    return min(found, key=_ORDER.__getitem__) if found else "other"


def read_samples(lines) -> list[tuple[str, int, list[str]]]:
    """`perf script -F comm,pid,ip,sym` text: (command, pid, stack leaf first) per sample. A sample
    is a header line (the command, right-aligned, and the pid) and its frames, each on a line
    that starts with a tab; frames without a name are dropped."""
    samples: list[tuple[str, int, list[str]]] = []
    for raw in lines:
        line = raw.rstrip("\n")
        if line.startswith("\t"):
            parts = line.split()  # the address, then the function's name
            name = parts[1].split("+", 1)[0] if len(parts) > 1 else ""
            if samples and name and name != "[unknown]":
                samples[-1][2].append(name)
        elif line.strip():
            command, _, pid = line.strip().rpartition(" ")
            if pid.isdigit():
                samples.append((command.strip(), int(pid), []))
    return samples


def split(samples, backends: set[int]) -> dict:
    """The backends' samples by part (shares of their total), the functions they were most
    often in, and the count of other PostgreSQL processes' samples."""
    parts: collections.Counter = collections.Counter()
    leaves: collections.Counter = collections.Counter()
    others = 0
    for command, pid, stack in samples:
        if command != "postgres":
            continue
        if pid not in backends:
            others += 1
            continue
        parts[part_of(stack)] += 1
        if stack:
            leaves[stack[0]] += 1
    total = sum(parts.values())
    if not total:
        raise RuntimeError(
            "perf recorded no sample of this process's PostgreSQL backends: is PostgreSQL on "
            "this machine, and may perf sample it (run as root)?"
        )
    return {
        "backend_samples": total,
        "other_postgres_samples": others,
        "parts": {key: round(parts[key] / total, 4) for key in [*_ORDER, "other"] if parts[key]},
        "top_functions": [
            {"function": name, "share": round(count / total, 4)}
            for name, count in leaves.most_common(15)
        ],
    }


def profile_postgres(workflow: str, runs: int, payload_kb, repeat: int, out: Path) -> dict:
    """`measure` under `perf record -a -g`, split as the module says."""
    from django.db import connection

    from taskpilots.evidence.profile import measure

    if shutil.which("perf") is None:
        raise RuntimeError("perf is not installed (apt-get install linux-perf)")
    path = out / f"postgres-{time.strftime('%Y%m%d-%H%M%S')}.perf"
    # perf's messages go to a file: a pipe nobody reads while the loop runs could fill and stop it.
    log = path.with_suffix(".log").open("w+b")
    recorder = subprocess.Popen(
        ["perf", "record", "-a", "-g", "-F", str(FREQUENCY), "-o", str(path)],
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    time.sleep(1)  # perf attaches to every CPU before the loop starts
    if recorder.poll() is not None:
        log.seek(0)
        raise RuntimeError(
            f"perf record failed ({log.read().decode(errors='replace')[-300:].strip()}): sampling "
            "the whole machine needs root or kernel.perf_event_paranoid at most 0"
        )
    try:
        figures = measure(workflow, runs, payload_kb, repeat)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pid FROM pg_stat_activity "
                "WHERE datname = current_database() AND backend_type = 'client backend'"
            )
            backends = {row[0] for row in cursor.fetchall()}
    finally:
        recorder.send_signal(signal.SIGINT)
        recorder.wait(timeout=120)
        log.close()
    script = subprocess.run(
        ["perf", "script", "-i", str(path), "-F", "comm,pid,ip,sym"],
        capture_output=True,
        text=True,
        check=True,
    )
    result = split(read_samples(script.stdout.splitlines()), backends)
    return {
        **figures,
        **result,
        "tool": "postgres",
        "frequency_hz": FREQUENCY,
        "backends": len(backends),
        "file": str(path),
    }


def render_postgres(records: list[dict]) -> str:
    """docs/benchmarks.md's table of PostgreSQL's CPU by part, from docs/results/postgres.jsonl:
    the last result recorded there for each workflow, a column each, under the environment of
    the last of them."""
    from taskpilots.evidence.bench_engine_report import describe_environment

    current, env, last = None, None, {}
    for record in records:
        if record["kind"] == "environment":
            current = record
        elif record["kind"] == "result" and record.get("tool") == "postgres":
            env, last[record["workflow"]] = current, record
    if not last:
        return "_No PostgreSQL profile recorded yet._\n"
    results = list(last.values())
    keys = {key for result in results for key in result["parts"]}
    order = [key for key, _, _ in PARTS if key in keys] + (["other"] if "other" in keys else [])
    first = results[0]["parts"]
    order.sort(key=lambda key: (key == "other", -first.get(key, 0)))
    lines = [describe_environment(env), ""]
    for result in results:
        low, high = result["payload_kb"]
        lines.append(
            f"- `{result['workflow']}`: {result['repeat']} rounds of {result['runs']} runs with "
            f"{low}–{high} KB payloads and {result['runs']} without, after one warm-up round; "
            f"{result['backend_samples']:,} samples of the backends at {result['frequency_hz']} "
            f"Hz ({result['other_postgres_samples']:,} more in other PostgreSQL processes); "
            "most often at the top of the stack: "
            + ", ".join(
                f"`{top['function']}` {top['share'] * 100:.1f}%"
                for top in result["top_functions"][:5]
            )
            + "."
        )
    lines += [
        "",
        "| part of PostgreSQL's CPU | "
        + " | ".join(f"`{result['workflow']}`" for result in results)
        + " |",
        "|---|" + "---|" * len(results),
    ]
    for key in order:
        label = PART_LABELS.get(key, "everything else (no marked function on the stack)")
        shares = [result["parts"].get(key, 0) for result in results]
        lines.append(f"| {label} | " + " | ".join(f"{v * 100:.1f}%" for v in shares) + " |")
    return "\n".join(lines) + "\n"

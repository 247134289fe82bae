"""Scratch databases for the evidence commands (bench, drill), so they never touch a real install.

`manage.py bench …` and `manage.py drill …` re-run themselves with `--here` against a database
created next to the configured one (same server, name `<configured>_<purpose>`), migrated from
scratch and dropped afterwards: the install they were run on keeps its runs, rules, users and
workflow filters exactly as they were, on the embedded PostgreSQL as on a configured one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from django.db import connection

from taskpilots.evidence.workers import ROOT, database_url

Say = Callable[[str], None]


def scratch_name(purpose: str) -> str:
    return f"{connection.settings_dict['NAME']}_{purpose}"[:60]


def create_database(name: str) -> None:
    """(Re)create an empty database `name` on the configured server."""
    import psycopg

    with psycopg.connect(database_url("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def drop_database(name: str) -> None:
    import psycopg

    with psycopg.connect(database_url("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def scratch_database(
    purpose: str, say: Say, *, keep: Callable[[], bool] = lambda: False
) -> Iterator[str]:
    """Create and migrate `<configured>_<purpose>`, yield its URL, drop it afterwards unless
    `keep()` says to keep it (for a look in the console after a failed drill)."""
    name = scratch_name(purpose)
    url = database_url(name)
    say(f"scratch database {name}: creating and migrating")
    create_database(name)
    try:
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "-v", "0"],
            cwd=ROOT,
            env=scratch_env(url),
            check=True,
        )
        yield url
    finally:
        if keep():
            say(f"scratch database {name} kept for inspection: DATABASE_URL={url}")
        else:
            drop_database(name)
            say(f"scratch database {name} dropped")


def scratch_env(url: str) -> dict[str, str]:
    return {**os.environ, "DATABASE_URL": url, "TASKPILOTS_TESTING": "1"}


def run_here(command: str, args: list[str], url: str) -> int:
    """`manage.py <command> <args> --here` against the scratch database at `url`."""
    return subprocess.run(
        [sys.executable, "manage.py", command, *args, "--here"], cwd=ROOT, env=scratch_env(url)
    ).returncode

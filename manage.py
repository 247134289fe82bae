#!/usr/bin/env python
import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "taskpilots.settings")
    from taskpilots import devenv

    if devenv.is_development():
        # TASKPILOTS_DEV=1 (or the tests): the embedded PostgreSQL and filesystem broker under
        # var/ when DATABASE_URL / CELERY_BROKER_URL are unset. Production never gets here.
        devenv.prepare()
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)

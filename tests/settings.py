"""The test suite's settings: the production settings module, read in test mode.

pytest loads this module (pyproject.toml names it), so `pytest` run directly gets the same
configuration as `make test`: TASKPILOTS_TESTING=1 (plain HTTP, fast password hashing, the dev
secret key) and, when DATABASE_URL / CELERY_BROKER_URL are unset, the embedded PostgreSQL and
filesystem broker under var/, started here before the settings read them. The worker processes
the tests start inherit this environment.
"""

import os

os.environ["TASKPILOTS_TESTING"] = "1"

from taskpilots import devenv  # noqa: E402

devenv.prepare()

from taskpilots.settings import *  # noqa: E402, F403

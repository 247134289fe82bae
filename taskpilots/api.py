"""The JSON API under /api/v1/: the frame from runs.api.base with its two routers, the runs'
(runs, events) and the people's (cancel, settle, decide)."""

from __future__ import annotations

from approvals.api import router as people
from approvals.bulk_api import router as bulk_actions
from runs.api.base import make_api
from runs.api.runs import router as runs

api = make_api()
api.add_router("", runs)
api.add_router("", people)
api.add_router("", bulk_actions)

"""The JSON API under /api/v1/: the frame from runs.api.base with its routers: the runs' (runs,
events), the people's (cancel, settle, decide), bulk actions, and people's credentials (who am
I, delegations)."""

from __future__ import annotations

from approvals.api import router as people
from approvals.bulk_api import router as bulk_actions
from runs.api.base import make_api
from runs.api.runs import router as runs
from runs.api.tokens import router as tokens

api = make_api()
api.add_router("", runs)
api.add_router("", people)
api.add_router("", bulk_actions)
api.add_router("", tokens)

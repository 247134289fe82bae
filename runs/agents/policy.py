"""ToolPolicy: the TaskPilots metadata of an agent's own tool (a Python function the agent
framework calls), shared by the OpenAI Agents SDK runner (runs.agents.sdk) and the Pydantic AI
runner (runs.agents.pydantic_ai). It needs neither framework."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from runs.models import Risk
from runs.tools import CallContext, LookupResult, Verification


@dataclass(frozen=True)
class ToolPolicy:
    """TaskPilots metadata for one of the agent's function tools.

    `tool` names a registered TaskPilots tool to call instead of the SDK function (its own
    metadata then applies; `needs_approval` may still be set per agent). Otherwise the SDK
    function becomes a python tool with these fields.
    """

    tool: str = ""
    side_effect: bool = True
    risk: str = Risk.MEDIUM
    # None: the TaskPilots tool's setting, or the SDK tool's own `needs_approval`.
    needs_approval: bool | Callable[[dict], bool] | None = None
    approval_reason: str = ""
    queue: str = "support"
    dedupes_by_key: bool = False
    lookup: Callable[[str, CallContext], LookupResult] | None = None
    # Reconciliation by reads for a tool without a lookup by key (runs.tools.Verification).
    verification: Verification | None = None
    settle_seconds: float | None = None
    target: Callable[[dict], str] | None = None
    scope: str = ""
    # None: the SDK tool's `timeout_seconds`, else the engine's default.
    timeout: float | None = None
    compensating_tool: str = ""
    compensation_params: Callable[[dict, dict], dict] | None = None

"""ToolPolicy: the TaskPilots metadata of an agent's own tool (a Python function the agent
framework calls), shared by the OpenAI Agents SDK runner (runs.agents.sdk), the Pydantic AI
runner (runs.agents.pydantic_ai) and LangGraph graphs (runs.agents.langgraph). It needs none of
the frameworks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from runs.models import Risk
from runs.tools import CallContext, LookupResult, Tool, Verification, python_tool


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

    def python_tool(
        self,
        name: str,
        invoker: Callable,
        *,
        timeout: float | None,
        params_schema: dict,
        description: str,
    ) -> Tool:
        """The framework's function as the TaskPilots python tool `name` with this policy's
        metadata (`timeout`: the framework tool's own, used when the policy sets none)."""
        return python_tool(
            name,
            invoker,
            side_effect=self.side_effect,
            risk=self.risk,
            dedupes_by_key=self.dedupes_by_key,
            lookup_fn=self.lookup,
            verification=self.verification,
            settle_seconds=self.settle_seconds,
            target=self.target or (lambda params, _n=name: f"agent-tool:{_n}"),
            scope=self.scope,
            timeout=self.timeout if self.timeout is not None else timeout,
            compensating_tool=self.compensating_tool,
            compensation_params=self.compensation_params,
            params_schema=params_schema,
            description=description,
        )

"""The SDK's MCP servers (`Agent(mcp_servers=[...])`) as TaskPilots MCP tools (runs.agents.mcp):
checked and registered by register_agent, listed on a model turn (on first use in a process),
and offered to the model as function tools named as the SDK names them."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping
from typing import Any

from agents import Agent, FunctionTool

from runs.agents.function_tools import function_tool_for
from runs.agents.sdk.base import AgentSetupError
from runs.agents.sdk.graph import _AgentNode, _McpSource
from runs.models import FailureClass
from runs.tools import ToolError


def _listed_mcp_tools(node: _AgentNode) -> list[tuple[_McpSource, Any]]:
    """The agent's MCP servers' tools, listed on first use in this process."""
    from runs.agents.mcp import McpSetupError

    listed = []
    for source in node.mcp:
        try:
            listed.extend((source, tool) for tool in source.toolset.values())
        except McpSetupError as exc:
            raise ToolError(FailureClass.INVALID_INPUT, str(exc)) from None
    return listed


def _mcp_function_tools(agent: Agent, chosen) -> list[tuple[FunctionTool, str]]:
    """SDK function tools for the chosen MCP tools, named as the SDK names them."""
    from agents.mcp.util import MCPUtil
    from agents.strict_schema import ensure_strict_json_schema

    prefixed = agent.mcp_config.get("include_server_in_tool_names", False)
    strict = agent.mcp_config.get("convert_schemas_to_strict", False)
    made, owners = [], {}
    for source, tool in chosen:
        name = tool.mcp_name
        if prefixed:
            base = MCPUtil._build_prefixed_tool_base_name(source.sdk.name, name)
            name = MCPUtil._shorten_tool_name(base, f"{source.sdk.name}\x00{name}")
        if owners.get(name, source) is not source:
            raise ToolError(
                FailureClass.INVALID_INPUT,
                f"Duplicate tool names found across MCP servers: {name!r}; set "
                "Agent(mcp_config={'include_server_in_tool_names': True})",
            )
        owners[name] = source
        function = function_tool_for(tool.name, name=name, description=tool.description)
        if strict:
            try:
                schema = ensure_strict_json_schema(function.params_json_schema)
                function = dataclasses.replace(
                    function, params_json_schema=schema, strict_json_schema=True
                )
            except Exception:  # noqa: S110 - the SDK keeps a schema it cannot make strict
                pass
        made.append((function, tool.name))
    return made


def _mcp_source(sdk_server: Any, agent: Agent, config: Mapping[str, Any]) -> _McpSource:
    from agents.mcp import MCPServerSse

    from runs.agents.mcp import McpSetupError, register_mcp_tools, server_from_sdk

    where = f"MCP server {getattr(sdk_server, 'name', sdk_server)!r} of agent {agent.name!r}"
    if isinstance(sdk_server, MCPServerSse):  # its params look like streamable HTTP's
        raise AgentSetupError(
            f"{where}: MCPServerSse (the older HTTP+SSE transport) is not supported under "
            "TaskPilots: use MCPServerStdio or MCPServerStreamableHttp"
        )
    for attribute, why in _MCP_REFUSED:
        if getattr(sdk_server, attribute, None) not in (None, [], {}):
            raise AgentSetupError(f"{where}: {attribute} {why}")
    failure = getattr(sdk_server, "_failure_error_function", None)
    if callable(failure):
        raise AgentSetupError(f"{where}: failure_error_function {_NO_ERROR_FORMATTER}")
    if callable(getattr(sdk_server, "_needs_approval_policy", None)):
        raise AgentSetupError(
            f"{where}: a require_approval function is not supported under TaskPilots; give "
            "the tool McpToolConfig(needs_approval=<function of the arguments>) in mcp_tools="
        )
    try:
        server = server_from_sdk(sdk_server)
        toolset = register_mcp_tools(server, config=dict(config))
    except McpSetupError as exc:
        raise AgentSetupError(str(exc)) from None
    return _McpSource(sdk_server, server, toolset)


_NO_ERROR_FORMATTER = (
    "is not used under TaskPilots: a failed call is classified (outage, unknown outcome, ...) "
    "and routed by the engine's rules, never told to the model as if it were a result"
)
_MCP_REFUSED = [
    (
        "tool_meta_resolver",
        "is not supported: TaskPilots sends its own _meta (the idempotency key, run and step) "
        "with every call",
    ),
    ("tool_input_guardrails", "(MCP tool guardrails) are not run under TaskPilots yet"),
    ("tool_output_guardrails", "(MCP tool guardrails) are not run under TaskPilots yet"),
    (
        "message_handler",
        "is not supported: TaskPilots' MCP client does not pass server notifications on",
    ),
]


def _mcp_config_for(sdk_server: Any, mcp_config: dict) -> Mapping[str, Any]:
    from runs.agents.mcp import server_from_sdk

    keys = [sdk_server.name]
    with contextlib.suppress(Exception):  # _mcp_source says what is wrong with the server
        keys.append(server_from_sdk(sdk_server).name)
    config: dict[str, Any] = {}
    for key in keys:
        config.update(mcp_config.pop(key, None) or {})
    return config


def _check_server_names(sources) -> None:
    by_name: dict[str, Any] = {}
    for source in sources:
        other = by_name.setdefault(source.server.name, source.server)
        if other != source.server:
            raise AgentSetupError(
                f"two different MCP servers are named {source.server.name!r}: their tools would "
                "share the names mcp.<server>.<tool>; give them different names"
            )

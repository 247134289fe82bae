"""Pydantic AI's MCP servers (`Agent(toolsets=[MCPToolset(...)])`) as TaskPilots MCP tools
(runs.agents.mcp), as the OpenAI Agents SDK runner does for `Agent(mcp_servers=[...])`.

At registration each `MCPToolset` becomes a TaskPilots McpServer named by the toolset's `id`
(stdio: command, args, env, cwd; streamable HTTP: the URL), and its tools are registered as
the TaskPilots tools `mcp.<id>.<tool>`: lazily, listed on first use in a process and cached in a
file (runs.agents.mcp.McpToolset), so registering starts and reaches no server.

While the agent runs under TaskPilots, each `MCPToolset` is swapped for a TaskPilotsMcpToolset
that lists the same tools through TaskPilots, inside the agent's own wrappers (`.prefixed()`,
`.filtered()`, `.renamed()`, `.prepared()`, `.with_metadata()`): the model sees the names and
schemas it would see without TaskPilots. Pydantic AI never calls the server: a call of one of
these tools is a `call:` step of its TaskPilots tool (the tool definition's metadata names it),
with snapshot, intent, idempotency key, approval rule and reconciliation.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import (
    AbstractToolset,
    CombinedToolset,
    FilteredToolset,
    FunctionToolset,
    IncludeReturnSchemasToolset,
    PrefixedToolset,
    PreparedToolset,
    RenamedToolset,
    SetMetadataToolset,
    ToolsetTool,
    WrapperToolset,
)

from runs.agents.pydantic_ai.journal import TARGET_KEY
from runs.agents.pydantic_ai.workflow import AgentSetupError
from runs.models import FailureClass
from runs.tools import ToolError

# Wrappers whose work is on the tool definitions only (their call_tool just passes on), so they
# keep working with the calls made by the engine.
_WRAPPERS = (
    PrefixedToolset,
    FilteredToolset,
    RenamedToolset,
    PreparedToolset,
    SetMetadataToolset,
    IncludeReturnSchemasToolset,
)


@dataclass
class McpSource:
    """One MCPToolset of the agent, as TaskPilots MCP tools (listed lazily)."""

    original: Any  # pydantic_ai.mcp.MCPToolset
    server: Any  # runs.agents.mcp.McpServer
    toolset: Mapping[str, Any]  # runs.agents.mcp.McpToolset


class TaskPilotsMcpToolset(AbstractToolset[Any]):
    """An MCPToolset's tools, listed by TaskPilots (runs.agents.mcp.McpToolset): the same tool
    definitions, each naming its TaskPilots tool in its metadata. Its tools are never called
    through Pydantic AI (the journal answers or plans every call)."""

    def __init__(self, source: McpSource) -> None:
        self.source = source

    @property
    def id(self) -> str | None:
        return self.source.server.name

    @property
    def label(self) -> str:
        return f"MCP server {self.source.server.name!r} (under TaskPilots)"

    async def get_tools(self, ctx) -> dict[str, ToolsetTool[Any]]:
        from pydantic_ai.mcp import TOOL_SCHEMA_VALIDATOR

        tools = {}
        for tool in _listed(self.source).values():
            definition = ToolDefinition(
                name=tool.mcp_name,
                description=tool.description or None,
                parameters_json_schema=tool.input_schema or {"type": "object", "properties": {}},
                metadata={"annotations": tool.annotations or None, TARGET_KEY: tool.name},
            )
            tools[tool.mcp_name] = ToolsetTool(
                toolset=self,
                tool_def=definition,
                max_retries=ctx.max_retries,
                args_validator=TOOL_SCHEMA_VALIDATOR,
            )
        return tools

    async def call_tool(self, name, tool_args, ctx, tool) -> Any:
        raise ToolError(
            FailureClass.INVALID_INPUT,
            f"the MCP tool {name!r} was called outside a TaskPilots step",
        )


def _listed(source: McpSource) -> Mapping[str, Any]:
    """The server's tools, listed on first use in this process (or from the cached listing)."""
    from runs.agents.mcp import McpSetupError

    try:
        return source.toolset.resolve()
    except McpSetupError as exc:
        raise ToolError(FailureClass.INVALID_INPUT, str(exc)) from None


def swap_mcp_servers(
    toolset: AbstractToolset, mcp_tools: dict[str, Mapping[str, Any]], sources: dict[str, McpSource]
) -> AbstractToolset:
    """`toolset` (not the agent's FunctionToolset) with each MCPToolset inside it replaced by a
    TaskPilotsMcpToolset; its servers' tools registered (lazily) into `sources`, by server name.
    The configuration of each server is taken out of `mcp_tools`. Anything else is refused."""
    _check_nesting(toolset)

    def swap(leaf: AbstractToolset) -> AbstractToolset:
        _refuse_options(leaf)
        server = server_from_pydantic_ai(leaf)
        known = sources.get(server.name)
        if known is None:
            known = sources[server.name] = _source(leaf, server, mcp_tools)
        elif known.server != server:
            raise AgentSetupError(
                f"two different MCP servers have the id {server.name!r}: their tools would "
                "share the names mcp.<id>.<tool>; give them different ids"
            )
        return TaskPilotsMcpToolset(known)

    return toolset.visit_and_replace(swap)


def _check_nesting(toolset: AbstractToolset) -> None:
    if isinstance(toolset, CombinedToolset):
        for inner in toolset.toolsets:
            _check_nesting(inner)
    elif isinstance(toolset, WrapperToolset):
        if type(toolset) not in _WRAPPERS:
            raise AgentSetupError(_unsupported_wrapper(toolset))
        _check_nesting(toolset.wrapped)
    elif not _is_mcp_toolset(toolset):
        raise AgentSetupError(_not_supported(toolset))


def _unsupported_wrapper(toolset: AbstractToolset) -> str:
    name = type(toolset).__name__
    if name == "ApprovalRequiredToolset":
        return (
            f"{toolset.label}: approval_required() on an MCP server is not used under TaskPilots; "
            "give the tool an approval rule instead: mcp_tools={'<server id>': {'<tool>': "
            "McpToolConfig(needs_approval=True or <a function of the arguments>)}}"
        )
    return (
        f"{toolset.label}: the toolset wrapper {name} is not supported around an MCP server "
        "under TaskPilots (supported: prefixed, filtered, renamed, prepared, with_metadata)"
    )


def _not_supported(toolset: AbstractToolset) -> str:
    if isinstance(toolset, FunctionToolset):
        why = "a FunctionToolset inside a wrapper or a combined toolset is not supported yet"
    else:
        why = (
            "it is neither a FunctionToolset nor an MCP server (MCPToolset): its tools are listed "
            "only while the agent runs, so TaskPilots cannot register them up front"
        )
    return (
        f"toolset {toolset.label} of the agent: {why} (give the agent its function tools "
        "directly, or TaskPilots MCP tools from runs.agents.mcp as functions)"
    )


def _is_mcp_toolset(toolset: AbstractToolset) -> bool:
    try:
        from pydantic_ai.mcp import MCPToolset
    except ImportError:  # without fastmcp, no MCPToolset could be built
        return False
    return isinstance(toolset, MCPToolset)


def _source(leaf: Any, server: Any, mcp_tools: dict[str, Mapping[str, Any]]) -> McpSource:
    from runs.agents.mcp import McpSetupError, register_mcp_tools

    config = dict(mcp_tools.pop(server.name, None) or {})
    try:
        toolset = register_mcp_tools(server, config=config)
    except McpSetupError as exc:  # pragma: no cover - nothing is listed at registration
        raise AgentSetupError(str(exc)) from None
    return McpSource(leaf, server, toolset)


_NOT_PASSED_ON = "is not supported: TaskPilots' MCP client does not pass server requests on"
_OPTIONS_REFUSED = [
    (
        "process_tool_call",
        "is not run under TaskPilots: TaskPilots makes the call itself and sends its own _meta "
        "(the idempotency key, run and step) with every call",
    ),
    ("sampling_model", _NOT_PASSED_ON),
    ("_auth_func", "(auth as a function of the run) is not supported under TaskPilots yet"),
    ("_headers_func", "(headers as a function of the run) is not supported under TaskPilots yet"),
]


def _refuse_options(leaf: Any) -> None:
    where = f"MCP server {leaf.label}"
    for attribute, why in _OPTIONS_REFUSED:
        if getattr(leaf, attribute, None) is not None:
            raise AgentSetupError(f"{where}: {attribute.lstrip('_')} {why}")
    options = getattr(leaf, "_client_options", None) or {}
    for handler in ("sampling_handler", "elicitation_handler"):
        if options.get(handler) is not None:
            raise AgentSetupError(f"{where}: {handler} {_NOT_PASSED_ON}")
    if getattr(leaf, "include_instructions", False):
        raise AgentSetupError(
            f"{where}: include_instructions=True is not supported under TaskPilots yet (the "
            "server's instructions would be read on every step): put them in the agent's own"
        )


def server_from_pydantic_ai(leaf: Any):
    """TaskPilots' McpServer for a Pydantic AI MCPToolset: named by its `id`; a stdio server by
    its command, args, env and cwd; a streamable HTTP server by its URL. SSE, in-process
    servers, custom headers or authentication are refused, saying why."""
    from fastmcp.client.transports import SSETransport, StdioTransport, StreamableHttpTransport

    from runs.agents.mcp import McpServer, McpSetupError

    transport = getattr(getattr(leaf, "client", None), "transport", None)
    name = _server_name(leaf)
    where = f"MCP server {name!r}"
    try:
        if isinstance(transport, SSETransport):
            raise McpSetupError(
                f"{where}: the SSE transport is not supported under TaskPilots; serve it over "
                "streamable HTTP (a URL not ending in /sse) or stdio"
            )
        if isinstance(transport, StdioTransport):
            return McpServer(
                name,
                command=[transport.command, *(transport.args or [])],
                env=dict(transport.env) if transport.env else None,
                cwd=str(transport.cwd) if transport.cwd else None,
            )
        if isinstance(transport, StreamableHttpTransport):
            if transport.headers or getattr(transport, "auth", None) is not None:
                raise McpSetupError(
                    f"{where}: custom headers or authentication are not supported under "
                    "TaskPilots yet; run the server over stdio, or without them"
                )
            return McpServer(name, url=str(transport.url))
    except McpSetupError as exc:
        raise AgentSetupError(str(exc)) from None
    raise AgentSetupError(
        f"{where} ({type(transport).__name__}) is not supported under TaskPilots: give "
        "MCPToolset a stdio command or a streamable HTTP URL"
    )


def _server_name(leaf: Any) -> str:
    raw = ""
    with contextlib.suppress(Exception):
        raw = leaf.id or ""
    name = "".join(c if c.isalnum() or c in "-_" else "_" for c in raw).strip("_")[:60]
    if not name:
        raise AgentSetupError(
            f"MCP server {leaf.label} has no id: give it one, MCPToolset(..., id='<name>') (as "
            "Pydantic AI's durable execution asks too); its tools become mcp.<id>.<tool>"
        )
    return name

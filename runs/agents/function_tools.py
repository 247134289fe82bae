"""SDK function tools backed by registered TaskPilots tools: what an SDK agent's model calls
when the tool itself is a TaskPilots tool (an MCP tool, an HTTP tool). Shared by the agent runner
(runs.agents.sdk) and the MCP tools (runs.agents.mcp.mcp_function_tools), which import it and
not each other."""

from __future__ import annotations

import json
import uuid

from runs import tools as tool_registry
from runs.agents import MissingExtra, json_schema_from_flat, tool_info
from runs.tools import CallContext

try:
    from agents import FunctionTool
    from agents.tool_context import ToolContext
except ModuleNotFoundError as exc:  # the optional `agents` extra
    raise MissingExtra("openai-agents") from exc


def function_tool_for(tool_name: str, *, name: str = "", description: str = "") -> FunctionTool:
    """An SDK function tool the model can call, backed by the registered TaskPilots tool.

    Under TaskPilots (register_agent) a call goes through the engine's protocol. Used with the
    SDK's own `Runner.run`, the tool is simply called, without TaskPilots' protection.
    """
    tool = tool_registry.get(tool_name)
    info = tool_info(tool_name)
    schema = info.input_schema or json_schema_from_flat(tool.params_schema)

    async def invoke(tool_context: ToolContext, arguments: str) -> str:
        import asyncio

        params = json.loads(arguments or "{}")
        ctx = CallContext(
            idempotency_key=f"sdk-{uuid.uuid4()}",
            run_id="",
            step=tool_context.tool_name,
            attempt=1,
            timeout=tool.timeout,
        )
        result = await asyncio.to_thread(tool.invoke, params, ctx)
        return json.dumps(result.response, ensure_ascii=False)

    invoke.taskpilots_tool = tool_name  # type: ignore[attr-defined]
    return FunctionTool(
        name=name or tool_name.replace(".", "_")[-64:],
        description=description or info.description or tool.description,
        params_json_schema=schema,
        on_invoke_tool=invoke,
        strict_json_schema=False,
    )

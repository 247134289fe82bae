"""A Pydantic AI agent with an MCP server, written as Pydantic AI's docs teach: the drafts server
(tests/agents/drafts_mcp_server.py, over stdio) as `MCPToolset(..., id="drafts")`, filtered and
prefixed, and a structured output_type; a fake model (FunctionModel) that answers from the
conversation. Registered unchanged as the workflow `test.pai_mcp_agent`; imported by the tests
and, through TASKPILOTS_WORKFLOW_MODULES, by their worker processes.

The server counts what it receives in the ledger named by PAI_DRAFTS_LEDGER (each published
draft with the idempotency key of its call). Each model call appends a line to the file named by
PAI_MODEL_LOG (when set), so the tests count model calls across processes too.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from fastmcp.client.transports import StdioTransport
from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from runs.agents.mcp import McpToolConfig
from runs.agents.pydantic_ai import register_pydantic_agent

SERVER = Path(__file__).with_name("drafts_mcp_server.py")
# Per model call: the tools it was offered ({name: parameters schema}).
MODEL_CALLS: list[dict[str, dict]] = []
HIDDEN = ("delete_drafts", "find_draft")


class Reply(BaseModel):
    """The agent's structured output."""

    summary: str
    published: bool


def fake_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Read the style guide, publish a draft in its tone, answer."""
    MODEL_CALLS.append({t.name: t.parameters_json_schema for t in info.function_tools})
    if log := os.environ.get("PAI_MODEL_LOG"):
        with open(log, "a") as out:
            out.write("call\n")
    turn = sum(isinstance(m, ModelResponse) for m in messages)
    if turn == 0:
        return ModelResponse(parts=[ToolCallPart("drafts_style_guide", {"topic": "apology"})])
    if turn == 1:
        guide = messages[-1].parts[0].content
        draft = {"title": "Sorry about order o-1", "body": f"A {guide['tone']} apology."}
        return ModelResponse(parts=[ToolCallPart("drafts_publish_draft", draft)])
    output = info.output_tools[0].name
    answer = {"summary": "Draft published.", "published": True}
    return ModelResponse(parts=[ToolCallPart(output, answer)])


def ledger() -> Path:
    default = Path(tempfile.gettempdir()) / "pai-drafts.ledger"
    return Path(os.environ.get("PAI_DRAFTS_LEDGER") or default)


def build_agent(ledger_path: Path) -> Agent:
    drafts = MCPToolset(
        StdioTransport(command=sys.executable, args=[str(SERVER), str(ledger_path), "--lookup"]),
        id="drafts",
    )
    return Agent(
        FunctionModel(fake_model),
        output_type=Reply,
        instructions="Draft replies for the support team in the house style.",
        toolsets=[drafts.filtered(lambda ctx, tool: tool.name not in HIDDEN).prefixed("drafts")],
    )


def register(approval: bool = False, name: str = "test.pai_mcp_agent"):
    publish = McpToolConfig(
        lookup_tool="find_draft",
        target=lambda params: f"draft:{params['title']}",
        needs_approval=approval,
        approval_reason="Drafts are checked before they are published",
    )
    return register_pydantic_agent(
        name, build_agent(ledger()), mcp_tools={"drafts": {"publish_draft": publish}}
    )


register()

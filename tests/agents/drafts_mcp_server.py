"""A small MCP server for the SDK handoff tests (stdio): a style guide to read, drafts to
publish, and a tool the agent's tool_filter hides.

    python tests/agents/drafts_mcp_server.py LEDGER [--lookup]

Each `publish_draft` call appends one JSON line to LEDGER (the idempotency key from the call's
`_meta`, and the title), so a test counts the writes on the receiving side; each start of the
server appends its pid to LEDGER.starts. Standalone (no Django): it is started by path, as its
own process.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations

KEY = "taskpilots/idempotency-key"
LEDGER = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("drafts.ledger")

server = MCPServer("drafts")


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def style_guide(topic: str) -> dict:
    """The house style for writing about a topic."""
    return {"topic": topic, "tone": "warm", "max_words": 80}


@server.tool(annotations=ToolAnnotations(destructiveHint=False, idempotentHint=False))
def publish_draft(title: str, body: str, ctx: Context) -> dict:
    """Publish a reply draft for the support team."""
    meta = dict(ctx.request_context.meta or {})
    with LEDGER.open("a") as ledger:
        ledger.write(json.dumps({"key": meta.get(KEY), "title": title}) + "\n")
    published = len(LEDGER.read_text().splitlines())
    return {"id": f"draft-{published}", "title": title}


@server.tool()
def delete_drafts() -> dict:
    """Delete every draft (hidden from the agent by its tool_filter)."""
    LEDGER.write_text("")
    return {"deleted": True}


def find_draft(idempotency_key: str) -> dict:
    """Whether a draft was published with this idempotency key (TaskPilots' lookup by key)."""
    lines = LEDGER.read_text().splitlines() if LEDGER.exists() else []
    for number, line in enumerate(lines, start=1):
        entry = json.loads(line)
        if entry.get("key") == idempotency_key:
            draft = {"id": f"draft-{number}", "title": entry.get("title")}
            return {"found": True, "id": draft["id"], "response": draft}
    return {"found": False}


if "--lookup" in sys.argv[2:]:
    server.tool(annotations=ToolAnnotations(readOnlyHint=True))(find_draft)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    with LEDGER.with_name(f"{LEDGER.name}.starts").open("a") as starts:
        starts.write(f"{os.getpid()}\n")
    server.run()

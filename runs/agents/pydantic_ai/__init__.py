"""Run a Pydantic AI `Agent`, written as Pydantic AI's docs teach, as a TaskPilots run.

    agent = Agent("openai:gpt-5", deps_type=Shop, output_type=Reply, instructions="...")

    @agent.tool
    def send_mail(ctx: RunContext[Shop], to: str, body: str) -> dict: ...

    register_pydantic_agent("shop.agent", agent, deps=lambda run_input: Shop(...),
                            tools={"send_mail": ToolPolicy(lookup=..., needs_approval=True)},
                            mcp_tools={"drafts": {"publish_draft": McpToolConfig(...)}})
    engine.start_run("shop.agent", {"message": "Please refund order 42"})

As Pydantic AI's own durable-execution integrations (Temporal, DBOS, Prefect) do, each model
request and each tool call is a durable step; here they are TaskPilots steps, and the agent's
loop stays Pydantic AI's own: a capability (runs.agents.pydantic_ai.journal) answers what is
recorded and stops at the first operation that is not.

1. `start` records the prompt.
2. `model:<k>`: the k-th model request, asked once and recorded (the ModelResponse, with Pydantic
   AI's ModelMessagesTypeAdapter); a resumed run replays it and never asks again.
3. For each tool call of that response: `approve:<k>.<i>:<tool>` when its approval rule (the
   ToolPolicy's `needs_approval`, or the tool's own `requires_approval=True`) says so, then
   `call:<k>.<i>:<tool>`, a `side_effect` or `read` step of the TaskPilots python tool
   `<workflow>.<tool>` (or, for an MCP server's tool, `mcp.<id>.<tool>`): snapshot, intent,
   idempotency key, reconciliation after a crash and failure routing, as for any other tool.
   `call_context()` in the tool gives its CallContext.
4. `finish`, once the agent returns: `final_output` is its output as JSON (a structured
   `output_type` dumped by pydantic).

MCP servers (`toolsets=[MCPToolset(..., id="drafts")]`, also prefixed, filtered, renamed) run
too (runs.agents.pydantic_ai.mcp_servers): each becomes a TaskPilots McpServer whose tools are
the TaskPilots MCP tools `mcp.<id>.<tool>` (listed on first use, the listing cached), with
`mcp_tools={"<id>": {"<tool>": McpToolConfig(...)}}` for their metadata and approval rules; the
model sees the same tool names and schemas, and a call of one is a `call:` step of its
TaskPilots tool.

Dependencies come from `deps(run_input)`, built again wherever a pass runs. The agent's code
between model requests and tool calls runs again on every step, so it must be deterministic
(as under Temporal or DBOS). Other toolsets (dynamic, external) are refused at registration:
their tools are only known while the agent runs.

Needs the `pydantic-ai` extra (`pip install 'taskpilots[pydantic-ai]'`); without it, importing
this package raises MissingExtra saying so.
"""

from runs.agents import MissingExtra

try:  # the optional `pydantic-ai` extra, which every module of this package imports
    import pydantic_ai  # noqa: F401
except ModuleNotFoundError as exc:
    raise MissingExtra("pydantic-ai-slim", extra="pydantic-ai") from exc

from runs.agents.policy import ToolPolicy
from runs.agents.pydantic_ai.registration import call_context, register_pydantic_agent
from runs.agents.pydantic_ai.workflow import AgentSetupError, PydanticAgentWorkflow

__all__ = [
    "AgentSetupError",
    "PydanticAgentWorkflow",
    "ToolPolicy",
    "call_context",
    "register_pydantic_agent",
]

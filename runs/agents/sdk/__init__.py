"""Run an OpenAI Agents SDK `Agent` (and the agents it hands off to) as a TaskPilots run.

    writer = Agent(name="writer", instructions="...", output_type=Draft,
                   mcp_servers=[MCPServerStdio(name="drafts", params={...})])
    triage = Agent(name="triage", instructions="...", tools=[check_policy], handoffs=[writer])
    register_agent("support.agent", triage, tools={"check_policy": ToolPolicy(side_effect=False)})
    engine.start_run("support.agent", {"message": "Please refund order 42"})

The SDK's own `Runner.run` keeps its loop in memory, so a crash would call the model again and
repeat tool calls. Here the loop is the workflow's `next` function, and every decision is a
recorded step (runs.workflows.DynamicStep):

1. `start` records the conversation's input.
2. `guardrail:input.<i>:<name>`: the first agent's input guardrails, one recorded compute step
   each; a tripped one is followed by `tripwire:...`, a failing step a person looks at.
3. `turn:<k>` is a dynamic compute step: its handler rebuilds the conversation from recorded
   step results, calls the current agent's model once (`Model.get_response`, with its tools,
   handoffs and output schema) and records the output items, the agent, and which tools and
   handoffs the model was offered. A resumed run reads them back and never asks again.
4. For each tool call of that turn, in order: an `approve:<k>.<i>:<tool>` approval step when the
   tool needs one (a normal ApprovalRequest in the console; the decision, with any edited
   arguments, is what the call then uses and what the model is told), then `call:<k>.<i>:<tool>`,
   a `side_effect` or `read` step according to the TaskPilots tool's metadata — snapshot,
   idempotency key, reconciliation and failure routing as for any other step.
5. A handoff call of that turn (after its tool calls, as the SDK orders them) is
   `handoff:<k>.<i>:<agent>`, a compute step recording from → to and what the handoff tool
   returns to the model; the next turn is the receiving agent's. Which agent is current is read
   from these recorded results only, so a run resumed in another process goes on with the
   right one.
6. A turn without tool calls (or a tool that ends the run, `tool_use_behavior`) leads to the
   last agent's output guardrails and `finish`, which validates a structured `output_type`.

SDK function tools map onto TaskPilots tools: a plain `@function_tool` is registered as a
python tool named `<workflow>.<tool>` with the metadata of its `ToolPolicy` (by default a
medium-risk side effect: the cautious guess); a tool made by `function_tool_for` (e.g. an MCP
tool, runs.agents.mcp) calls the TaskPilots tool it names; the tools of `Agent(mcp_servers=...)`
become TaskPilots MCP tools (`mcp.<server>.<tool>`), listed on the first model turn in a process.
A function tool gets the run's context object as `ctx.context` (`register_agent(context=...)`;
without one, the call's CallContext), and the CallContext always through `call_context_of(ctx)`.

Modules: registration (register_agent: the agents a handoff reaches, checked, their tools bound
and registered), graph (what a registration holds for each agent), runner (AgentWorkflow: the
durable loop and each step's work; the step and handler names), conversation (the conversation
read back from recorded step results), tools (function tools as TaskPilots tools: ToolPolicy,
call_context_of), mcp_servers (the tools of `Agent(mcp_servers=...)`), handlers (the steps'
handlers, registered by name when this package is imported), base (AgentSetupError, the run's
input and output). What this package exports (`__all__`) is the public API.
"""

from runs.agents import MissingExtra

try:  # the optional `agents` extra, which every module of this package imports
    import agents  # noqa: F401
except ModuleNotFoundError as exc:
    raise MissingExtra("openai-agents") from exc

from runs.agents.function_tools import function_tool_for
from runs.agents.sdk import handlers  # noqa: F401  (registers the step handlers by name)
from runs.agents.sdk.base import AgentSetupError
from runs.agents.sdk.registration import register_agent
from runs.agents.sdk.runner import AgentWorkflow
from runs.agents.sdk.tools import (
    AgentCallContext,
    ToolPolicy,
    call_context_of,
    register_function_tool,
)

__all__ = [
    "AgentCallContext",
    "AgentSetupError",
    "AgentWorkflow",
    "ToolPolicy",
    "call_context_of",
    "function_tool_for",
    "register_agent",
    "register_function_tool",
]

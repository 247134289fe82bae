"""Run a LangGraph graph, written as LangGraph's docs teach, as a TaskPilots run.

    builder = StateGraph(MessagesState)
    builder.add_node("agent", call_model)           # a chat model with tools bound
    builder.add_node("tools", ToolNode([send_mail]))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    graph = builder.compile()

    register_langgraph("shop.graph", graph,
                       tools={"send_mail": ToolPolicy(lookup=..., needs_approval=True)})
    engine.start_run("shop.graph", {"message": "Please refund order 42"})

TaskPilots wraps the graph's nodes; it is not its checkpointer (docs/agents.md says why). The
graph is compiled again from its builder, each node journaled and each ToolNode's tool calls
intercepted, and every pass invokes it from its input against the run's recorded steps
(runs.agents.langgraph.journal), stopping at the first operation not recorded:

1. `start` records the graph's input.
2. `node:<s>:<node>`: the node's run in LangGraph superstep s, run once and recorded (its state
   update; messages in LangChain's serialized form). A recorded node is never run again, so a
   model it calls is not asked again.
3. `interrupt:<s>.<r>:<node>`: the node called `interrupt(value)`. An approval step in the
   inbox showing the value (a dict as the parameters, anything else as `value`); the approved,
   possibly edited, value is what `interrupt()` returns when the node runs again
   (`node:<s>.<r>:<node>`), as LangGraph's `Command(resume=...)` would. A rejection stops the
   run, as for any TaskPilots approval.
4. For each tool call a ToolNode makes: `approve:<s>.<i>:<tool>` when its ToolPolicy's approval
   rule says so, then `call:<s>.<i>:<tool>`, a `side_effect` or `read` step of the TaskPilots
   python tool `<workflow>.<tool>`: snapshot, intent, idempotency key, reconciliation after a
   crash. `call_context()` in the tool gives its CallContext. The result comes back to the
   graph as the ToolMessage.
5. `finish`, once the graph returns: `final_output` is the last message's content.

Routing functions run on every pass and a node runs again from its start after an interrupt
(as under LangGraph itself): both have to be deterministic up to the operation recorded.
Tools that take injected state, store or runtime are refused at registration, as are graphs
compiled with interrupt_before/interrupt_after; Send and subgraph Commands are not recorded.

Needs the `langgraph` extra (`pip install 'taskpilots[langgraph]'`); without it, importing this
package raises MissingExtra saying so.
"""

from runs.agents import MissingExtra

try:  # the optional `langgraph` extra, which every module of this package imports
    import langgraph.graph  # noqa: F401
except ModuleNotFoundError as exc:
    raise MissingExtra("langgraph", extra="langgraph") from exc

from runs.agents.langgraph.registration import call_context, register_langgraph
from runs.agents.langgraph.workflow import GraphSetupError, LangGraphWorkflow
from runs.agents.policy import ToolPolicy

__all__ = [
    "GraphSetupError",
    "LangGraphWorkflow",
    "ToolPolicy",
    "call_context",
    "register_langgraph",
]

"""The handlers of the runner's dynamic compute steps, registered by name when this module is
imported (runs.agents.sdk imports it). The names are stored with the steps in the database, so
they never change. Each handler finds the run's AgentWorkflow and has it do the step's work."""

from __future__ import annotations

import json

from runs import workflows
from runs.agents.sdk.base import AgentSetupError, _output_json
from runs.agents.sdk.conversation import _turn_count
from runs.agents.sdk.registration import _AGENTS
from runs.agents.sdk.runner import (
    FINISH_HANDLER,
    GUARDRAIL_HANDLER,
    HANDOFF_CALLBACK_HANDLER,
    HANDOFF_HANDLER,
    REFUSAL_HANDLER,
    TRIPWIRE_HANDLER,
    TURN_HANDLER,
    AgentWorkflow,
)
from runs.models import FailureClass
from runs.tools import ToolError
from runs.workflows import Context


def _agent_for(ctx: Context) -> AgentWorkflow:
    try:
        return _AGENTS[(ctx.workflow, ctx.version)]
    except KeyError:
        raise AgentSetupError(f"{ctx.workflow} v{ctx.version} is not a registered agent") from None


def _model_turn(ctx: Context) -> dict:
    return _agent_for(ctx).take_turn(ctx)


def _hand_off(ctx: Context) -> dict:
    return _agent_for(ctx).hand_off(ctx)


def _guardrail(ctx: Context) -> dict:
    return _agent_for(ctx).run_guardrail(ctx)


def _tripwire(ctx: Context) -> dict:
    # A person looks at it: skipping the step lets the run go on despite the guardrail.
    tripped = ctx.results.get(ctx.spec.get("guardrail_step", "")) or {}
    info = json.dumps(tripped.get("output_info"), ensure_ascii=False)[:500]
    raise ToolError(
        FailureClass.INVALID_INPUT,
        f"guardrail {tripped.get('guardrail', '?')!r} tripped its wire: {info}",
    )


def _finish(ctx: Context) -> dict:
    runner = _agent_for(ctx)
    agent, output = runner.final_output(ctx)
    turns = _turn_count(ctx)
    usage = {"requests": 0, "input_tokens": 0, "output_tokens": 0}
    for number in range(1, turns + 1):
        for key, value in ((ctx.results.get(f"turn:{number}") or {}).get("usage") or {}).items():
            if key in usage and isinstance(value, int):
                usage[key] += value
    return {
        "final_output": _output_json(agent, output),
        "last_agent": agent.name,
        "turns": turns,
        "usage": usage,
    }


def _refuse_call(ctx: Context) -> dict:
    return {"error": ctx.spec.get("error", "the call was refused")}


workflows.register_handler(TURN_HANDLER, _model_turn, waits=True)
workflows.register_handler(HANDOFF_HANDLER, _hand_off)
workflows.register_handler(HANDOFF_CALLBACK_HANDLER, _hand_off, waits=True)
workflows.register_handler(GUARDRAIL_HANDLER, _guardrail, waits=True)
workflows.register_handler(TRIPWIRE_HANDLER, _tripwire)
workflows.register_handler(FINISH_HANDLER, _finish)
workflows.register_handler(REFUSAL_HANDLER, _refuse_call)

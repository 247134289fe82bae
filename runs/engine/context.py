"""What a step sees of its run: the workflow's Context, and the prior-results summary that every
snapshot records."""

from __future__ import annotations

from typing import Any

from runs.models import Run, Step, canonical_json
from runs.workflows import Context

# How much of each earlier result a snapshot keeps (the one definition: the engine, the
# console and the metrics read summaries of this length).
SUMMARY_CHARS = 300


def build_context(run: Run, steps: list[Step] | None = None) -> Context:
    if steps is None:
        steps = list(
            run.steps.order_by("position").only(
                "name", "iteration", "status", "result", "kind", "tool", "position"
            )
        )
    results: dict[str, Any] = {}
    history = []
    for step in steps:
        if step.status in Step.DONE and step.status != Step.Status.SKIPPED:
            results[step.name] = step.result
        history.append(
            {
                "name": step.name,
                "iteration": step.iteration,
                "status": step.status,
                "kind": step.kind,
                "tool": step.tool,
            }
        )
    return Context(
        run_id=str(run.id),
        workflow=run.workflow,
        version=run.workflow_version,
        input=run.input,
        results=results,
        principal=run.principal,
        scopes=tuple(run.scopes or ()),
        history=history,
    )


def summarize(value: Any, limit: int = SUMMARY_CHARS) -> str:
    """One result as canonical JSON, cut to `limit` characters (with an ellipsis).

    Strings longer than `limit` are cut to `limit` characters before encoding: each character
    encodes to at least one, so the text agrees with the whole value's up to past `limit`, and
    a 16 KB document is not encoded to keep 300 characters of it."""
    text = canonical_json(_strings_cut(value, limit))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _strings_cut(value: Any, limit: int) -> Any:
    if isinstance(value, str):
        return value[:limit] if len(value) > limit else value
    if isinstance(value, dict):
        return {key: _strings_cut(item, limit) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_strings_cut(item, limit) for item in value]
    return value


def prior_results_summary(results: dict[str, Any]) -> dict[str, str]:
    return {name: summarize(value) for name, value in results.items()}

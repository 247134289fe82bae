"""Compensation: undo a run's committed side effects, newest first, each as a keyed side effect."""

from __future__ import annotations

from runs import tools as tool_registry
from runs.engine.dispatch import enqueue
from runs.models import Run, SideEffect, Step, StepKind, TimelineEvent, to_json_value
from runs.verbs import Verb

# Where a run waits when its compensation leaves side effects nothing could undo.
BY_HAND_QUEUE = "support"


def undoable(tool_name: str) -> bool:
    """Whether TaskPilots can undo this tool's side effects (its compensating tool)."""
    try:
        return bool(tool_registry.get(tool_name).compensating_tool)
    except tool_registry.UnknownTool:
        return False


def begin_compensation(run: Run, reason: str, *, actor: str = "system") -> None:
    """Undo the run's committed side effects, newest first, each as a keyed side-effect step.

    1. Skip whatever the run was about to do.
    2. Nothing committed: the run is simply cancelled.
    3. Otherwise the run compensates: one compensating step per committed effect whose tool has
       a compensating tool; the others are listed for a person when the steps are done.
    """
    effects = list(
        SideEffect.objects.filter(run=run, status=SideEffect.Status.COMMITTED)
        .select_related("step", "snapshot")
        .order_by("-committed_at", "-id")
    )
    for step in Step.objects.filter(run=run, status__in=Step.UNFINISHED).exclude(
        spec__has_key="compensates"
    ):
        step.skip(reason=reason, actor=actor)
    if not effects:
        run.cancel(reason, actor=actor)
        return
    run.begin_compensation(reason, actor=actor)
    last = run.steps.order_by("-position").values_list("position", flat=True).first() or 0
    for offset, effect in enumerate(effects, start=1):
        _plan_compensation(run, effect, last + offset)
    enqueue(run.pk)


def _plan_compensation(run: Run, effect: SideEffect, position: int) -> None:
    try:
        tool = tool_registry.get(effect.tool)
    except tool_registry.UnknownTool:
        tool = None
    if tool is None or not tool.compensating_tool:
        TimelineEvent.append(
            run.pk,
            Verb.COMPENSATION_NOT_AVAILABLE,
            {"key": effect.idempotency_key, "tool": effect.tool},
        )
        return
    original = {
        "key": effect.idempotency_key,
        "external_id": effect.external_id,
        "params": effect.snapshot.params,
        "response": effect.receipt.get("response"),
    }
    params = (
        tool.compensation_params(original["params"], original)
        if tool.compensation_params
        else {"original": original}
    )
    name = f"compensate:{effect.step.name}"
    spec = {
        "dynamic": True,
        "kind": StepKind.SIDE_EFFECT,
        "tool": tool.compensating_tool,
        "params": params,
        "stage": "compensation",
        "compensates": effect.pk,
    }
    step = Step.objects.create(
        run=run,
        name=name,
        iteration=Step.objects.filter(run=run, name=name).count(),
        position=position,
        kind=StepKind.SIDE_EFFECT,
        stage="compensation",
        tool=tool.compensating_tool,
        spec=to_json_value(spec),
    )
    TimelineEvent.append(
        run.pk,
        Verb.COMPENSATION_PLANNED,
        {
            "step": name,
            "compensates": effect.idempotency_key,
            "tool": tool.compensating_tool,
            "iteration": step.iteration,
            "from": "",
            "to": Step.Status.PENDING,
        },
    )


def settle_compensation(step: Step) -> None:
    """A compensating step succeeded: its original side effect (and step) are compensated."""
    effect = SideEffect.objects.filter(pk=step.spec["compensates"]).first()
    if effect is None or effect.status != SideEffect.Status.COMMITTED:
        return
    comp_key = SideEffect.objects.filter(step=step).values_list("idempotency_key", flat=True)
    effect.mark_compensated(comp_key.first() or "")
    original = Step.objects.get(pk=effect.step_id)
    if original.status == Step.Status.SUCCEEDED:
        original.mark_compensated()


def finish_compensation(run: Run) -> None:
    """Every compensating step is done: the run is compensated, or goes to a person for the
    effects nothing could undo."""
    leftovers = list(
        SideEffect.objects.filter(run=run, status=SideEffect.Status.COMMITTED)
        .exclude(step__spec__has_key="compensates")
        .values_list("tool", "idempotency_key")
    )
    if leftovers:
        listed = ", ".join(f"{tool} ({key})" for tool, key in leftovers)
        run.ask_human(
            f"Compensation finished, but these side effects have no compensating "
            f"tool and must be undone by hand: {listed}",
            queue=BY_HAND_QUEUE,
        )
        return
    run.mark_compensated()

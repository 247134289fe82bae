"""Workflow definitions: named, versioned, ordered steps declared in Python.

    register(Workflow("support.reply", 1, [
        compute("classify", classify_message, stage="triage"),
        read("lookup_customer", "crm.lookup", params=lambda ctx: {"email": ctx.input["email"]}),
        side_effect("send_reply", "mail.send", params=build_reply, stage="reply"),
    ]))

Steps run in order unless a step (or the workflow) has a `next` function, which returns the name
of the next declared step, a `DynamicStep` decided at run time (an agent's next tool call), or
`END`. Each decision is recorded as a step row the moment it is made, so a resumed run follows
the same path without asking again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from runs.models import StepKind

END = None


class WorkflowError(Exception):
    pass


class UnknownWorkflow(WorkflowError, LookupError):
    pass


@dataclass(frozen=True)
class StepDef:
    name: str
    kind: str
    stage: str = ""
    # compute: fn(ctx) -> result
    fn: Callable[[Context], Any] | None = None
    # read / side_effect / approval: the tool and a pure function building its parameters
    tool: str = ""
    params: Callable[[Context], dict] | None = None
    # approval: ask only when this is true (otherwise the step passes without a person)
    when: Callable[[Context], bool] | None = None
    queue: str = "support"
    reason: str | Callable[[Context], str] = ""
    sla: timedelta | None = None
    # wait_event
    event_type: str = ""
    correlation: Callable[[Context], str] | None = None
    timeout: timedelta | None = None
    # wait_timer
    delay: timedelta | Callable[[Context], timedelta] | None = None
    next: Callable[[Context], str | DynamicStep | None] | None = None
    # compute: the function waits on the outside world (a model turn), so the worker gives its
    # database connection back while it runs (tool calls always do).
    waits: bool = False

    def __post_init__(self) -> None:
        if self.kind not in StepKind.values:
            raise WorkflowError(f"step {self.name!r}: unknown kind {self.kind!r}")
        if self.kind == StepKind.COMPUTE and self.fn is None:
            raise WorkflowError(f"compute step {self.name!r} needs fn")
        if self.kind in (StepKind.READ, StepKind.SIDE_EFFECT) and not self.tool:
            raise WorkflowError(f"{self.kind} step {self.name!r} needs a tool")
        if self.kind == StepKind.WAIT_EVENT and not (self.event_type and self.correlation):
            raise WorkflowError(f"wait_event step {self.name!r} needs event_type and correlation")
        if self.kind == StepKind.WAIT_TIMER and self.delay is None:
            raise WorkflowError(f"wait_timer step {self.name!r} needs a delay")

    def build_params(self, ctx: Context) -> dict:
        return dict(self.params(ctx)) if self.params else {}

    def spec(self) -> dict:
        return {}


@dataclass(frozen=True)
class DynamicStep:
    """A step decided while the run goes: its parameters are values, recorded on the step row."""

    name: str
    kind: str
    tool: str = ""
    params: dict = field(default_factory=dict)
    stage: str = ""
    queue: str = "support"
    reason: str = ""
    extra: dict = field(default_factory=dict)

    def spec(self) -> dict:
        return {
            "dynamic": True,
            "kind": self.kind,
            "tool": self.tool,
            "params": self.params,
            "stage": self.stage,
            "queue": self.queue,
            "reason": self.reason,
            **self.extra,
        }


# Compute functions a dynamic step can name (a recorded spec holds a name, not a function), and
# those of them that wait on the outside world.
_HANDLERS: dict[str, Callable[[Context], Any]] = {}
_WAITING_HANDLERS: set[str] = set()


def register_handler(
    name: str, fn: Callable[[Context], Any], *, waits: bool = False
) -> Callable[[Context], Any]:
    """Make `fn` callable from dynamic compute steps: DynamicStep(..., kind="compute",
    extra={"handler": name, ...}). It receives the Context; `ctx.spec` is the step's spec.
    `waits`: it waits on the outside world (a model turn), see StepDef.waits."""
    _HANDLERS[name] = fn
    (_WAITING_HANDLERS.add if waits else _WAITING_HANDLERS.discard)(name)
    return fn


def step_from_spec(name: str, spec: dict) -> StepDef:
    """The definition of a recorded dynamic step (agent tool call, model turn, compensation)."""
    params = spec.get("params") or {}
    fn = None
    if spec["kind"] == "compute":
        try:
            fn = _HANDLERS[spec["handler"]]
        except KeyError:
            raise WorkflowError(
                f"dynamic compute step {name!r} names handler {spec.get('handler')!r}, which is "
                "not registered"
            ) from None
    return StepDef(
        name=name,
        kind=spec["kind"],
        stage=spec.get("stage", ""),
        fn=fn,
        tool=spec.get("tool", ""),
        params=lambda ctx, _p=params: _p,
        queue=spec.get("queue", "support"),
        reason=spec.get("reason", ""),
        waits=spec.get("handler") in _WAITING_HANDLERS,
    )


def compute(name: str, fn: Callable[[Context], Any], **kw: Any) -> StepDef:
    return StepDef(name=name, kind=StepKind.COMPUTE, fn=fn, **kw)


def read(name: str, tool: str, params: Callable[[Context], dict] | None = None, **kw) -> StepDef:
    return StepDef(name=name, kind=StepKind.READ, tool=tool, params=params, **kw)


def side_effect(name: str, tool: str, params: Callable[[Context], dict], **kw: Any) -> StepDef:
    return StepDef(name=name, kind=StepKind.SIDE_EFFECT, tool=tool, params=params, **kw)


def approval(name: str, *, params: Callable[[Context], dict] | None = None, **kw: Any) -> StepDef:
    return StepDef(name=name, kind=StepKind.APPROVAL, params=params, **kw)


def wait_event(
    name: str, event_type: str, correlation: Callable[[Context], str], **kw: Any
) -> StepDef:
    return StepDef(
        name=name, kind=StepKind.WAIT_EVENT, event_type=event_type, correlation=correlation, **kw
    )


def wait_timer(name: str, delay: timedelta | Callable[[Context], timedelta], **kw) -> StepDef:
    return StepDef(name=name, kind=StepKind.WAIT_TIMER, delay=delay, **kw)


@dataclass
class Context:
    """What a step's functions see: the run's input and the results of finished steps.

    Functions that build parameters must be pure (the same context gives the same parameters):
    the idempotency check compares them on every attempt.
    """

    run_id: str
    workflow: str
    version: int
    input: dict
    results: dict[str, Any]
    principal: str = "system"
    scopes: tuple[str, ...] = ()
    iteration: int = 0
    history: list[dict] = field(default_factory=list)
    # The recorded spec of the step being executed (dynamic steps: tool, params, handler, ...).
    spec: dict = field(default_factory=dict)

    def result(self, name: str, default: Any = None) -> Any:
        return self.results.get(name, default)


@dataclass
class Workflow:
    name: str
    version: int
    steps: list[StepDef]
    next: Callable[[Context, str], str | DynamicStep | None] | None = None
    description: str = ""
    scopes: tuple[str, ...] = ("*",)
    # Validate and normalise untrusted input when a run starts (raise ValueError with a message).
    validate_input: Callable[[dict], dict] | None = None
    _by_name: dict[str, StepDef] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.steps:
            raise WorkflowError(f"workflow {self.name!r} has no steps")
        self._by_name = {}
        for step in self.steps:
            if step.name in self._by_name:
                raise WorkflowError(f"workflow {self.name!r}: step {step.name!r} declared twice")
            self._by_name[step.name] = step

    def step(self, name: str) -> StepDef:
        try:
            return self._by_name[name]
        except KeyError:
            raise WorkflowError(
                f"step {name!r} is not declared in {self.name} v{self.version}"
            ) from None

    def has_step(self, name: str) -> bool:
        return name in self._by_name

    def definition_of(self, name: str, spec: dict) -> StepDef:
        return step_from_spec(name, spec) if spec.get("dynamic") else self.step(name)

    def following(self, ctx: Context, last_name: str, last_spec: dict) -> StepDef | DynamicStep:
        """The step after `last_name`, or END."""
        chooser = None
        if not last_spec.get("dynamic") and self.has_step(last_name):
            chooser = self.step(last_name).next
        if chooser is not None:
            return self._resolve(chooser(ctx))
        if self.next is not None:
            return self._resolve(self.next(ctx, last_name))
        if last_spec.get("dynamic"):
            after = last_spec.get("after", "")
            if not after:
                return END
            last_name = after
        index = self.steps.index(self.step(last_name))
        return self.steps[index + 1] if index + 1 < len(self.steps) else END

    def _resolve(self, choice):
        if choice is None or isinstance(choice, DynamicStep):
            return choice
        if isinstance(choice, str):
            return self.step(choice)
        raise WorkflowError(
            f"a next function returned {choice!r}: want a step name, a DynamicStep or END"
        )

    def describe(self) -> list[dict]:
        return [
            {"name": s.name, "kind": s.kind, "stage": s.stage, "tool": s.tool} for s in self.steps
        ]


# --------------------------------------------------------------------------------------------
# Registry

_WORKFLOWS: dict[tuple[str, int], Workflow] = {}


def register(workflow: Workflow, *, replace: bool = False) -> Workflow:
    key = (workflow.name, workflow.version)
    if key in _WORKFLOWS and not replace and _WORKFLOWS[key] is not workflow:
        raise WorkflowError(f"workflow {workflow.name} v{workflow.version} is already registered")
    _WORKFLOWS[key] = workflow
    return workflow


def unregister(name: str, version: int) -> None:
    _WORKFLOWS.pop((name, version), None)


def get(name: str, version: int | None = None) -> Workflow:
    from runs.registry import load_lazily

    if not any(n == name for (n, _) in _WORKFLOWS):
        try:
            load_lazily(name)
        except ImportError as exc:  # e.g. an optional extra that is not installed
            raise UnknownWorkflow(f"workflow {name!r} cannot be loaded: {exc}") from exc
    if version is None:
        versions = [v for (n, v) in _WORKFLOWS if n == name]
        if not versions:
            raise UnknownWorkflow(f"workflow {name!r} is not registered")
        version = max(versions)
    try:
        return _WORKFLOWS[(name, version)]
    except KeyError:
        raise UnknownWorkflow(f"workflow {name!r} version {version} is not registered") from None


def all_workflows() -> list[Workflow]:
    """Every registered workflow, the lazily registered ones included (runs.registry)."""
    from runs.registry import load_all_lazily

    load_all_lazily()
    return sorted(_WORKFLOWS.values(), key=lambda w: (w.name, w.version))


# --------------------------------------------------------------------------------------------
# What is still to come (the rehydration document's pending steps)

_FINISHED = ("succeeded", "failed", "cancelled", "compensated")


def pending_steps(run, recorded: list[dict]) -> dict:
    """The declared steps a paused run has still to go through, after its recorded ones: what
    resuming it will do, for the person deciding. In declaration order; `exact` is false when
    the workflow (or one of the steps left) chooses its next step at run time, so the plan may
    branch, and when the workflow is not registered here (then the list is empty)."""
    if run.status in _FINISHED:
        return {"pending_steps": [], "pending_steps_exact": True}
    try:
        workflow = get(run.workflow, run.workflow_version)
    except UnknownWorkflow:
        return {"pending_steps": [], "pending_steps_exact": False}
    names = {step["name"] for step in recorded}
    positions = [i for i, step in enumerate(workflow.steps) if step.name in names]
    after = max(positions) + 1 if positions else 0
    planned = [step for step in workflow.steps[after:] if step.name not in names]
    branches = workflow.next is not None or any(
        step.next is not None for step in workflow.steps[max(after - 1, 0) :]
    )
    return {
        "pending_steps": [
            {"name": step.name, "kind": step.kind, "tool": step.tool or None, "stage": step.stage}
            for step in planned
        ],
        "pending_steps_exact": not branches,
    }

"""Starting runs: idempotent by business key, nothing written for a refused start."""

from __future__ import annotations

from runs import workflows as workflow_registry
from runs.batch import create_run
from runs.engine.dispatch import enqueue
from runs.invisible import character_name, first_forbidden_in_identifier
from runs.models import Run, digest, to_json_value
from runs.verbs import Verb
from runs.workflows import Workflow


class StartError(ValueError):
    """The run cannot start: unknown workflow, invalid input, or a business key conflict."""


class BusinessKeyConflict(StartError):
    """The business key already started a run for another request: `why` is "workflow" (another
    workflow or version) or "input" (the same workflow with other input)."""

    def __init__(self, run: Run, why: str = "input"):
        self.run = run
        self.why = why
        what = "another workflow" if why == "workflow" else "other input"
        super().__init__(
            f"business key {run.business_key!r} already started run {run.pk} with {what}"
        )


def start_run(
    workflow: str,
    input: dict,
    *,
    version: int | None = None,
    business_key: str | None = None,
    principal: str = "system",
    scopes: list[str] | None = None,
    session_context_ref: str = "",
    actor: str = "system",
) -> tuple[Run, bool]:
    """Create a run (or return the existing one for the same business key and input).

    Returns (run, created). A business key names one request to one workflow: the same key
    with another workflow (or another explicit version), or with different input, raises
    BusinessKeyConflict; nothing is written for a rejected start.
    """
    try:
        definition = workflow_registry.get(workflow, version)
    except workflow_registry.UnknownWorkflow as exc:
        raise StartError(str(exc)) from None
    if not isinstance(input, dict):
        raise StartError("input must be a JSON object")
    check_session_ref(session_context_ref)
    if definition.validate_input is not None:
        try:
            input = definition.validate_input(input)
        except (ValueError, TypeError, KeyError) as exc:
            raise StartError(f"invalid input for {workflow}: {exc}") from None
    input = to_json_value(input)
    input_digest = digest(input)
    run = Run(
        workflow=definition.name,
        workflow_version=definition.version,
        input=input,
        input_digest=input_digest,
        business_key=business_key,
        principal=principal,
        scopes=list(scopes if scopes is not None else definition.scopes),
        session_context_ref=session_context_ref,
    )
    created = {
        "workflow": run.workflow,
        "version": run.workflow_version,
        "business_key": business_key,
        "input_digest": input_digest,
        "principal": principal,
    }
    # One statement: the run, its run.created event and its chain head, or nothing at all when
    # the business key started a run already (then that run is the answer, or a conflict).
    if not create_run(run, [(Verb.RUN_CREATED, created, actor)]):
        existing = Run.objects.get(business_key=business_key)
        return _same_start(existing, definition, version, input_digest)
    enqueue(run.pk)
    return run, True


# The longest session reference a run keeps (Run.session_context_ref, Snapshot's copy of it).
SESSION_REF_MAX = 200


def check_session_ref(value) -> None:
    """A session reference is an opaque string naming the conversation or session that asked
    for the run (empty: none). Refused, with nothing written, when it is not a string, is
    longer than the column, or holds a control or format character (it is shown to people)."""
    if not isinstance(value, str):
        raise StartError("session_context_ref must be a string")
    if len(value) > SESSION_REF_MAX:
        raise StartError(f"session_context_ref is longer than {SESSION_REF_MAX} characters")
    char = first_forbidden_in_identifier(value)
    if char is not None:  # the API's definition of an identifier (runs/invisible.py)
        raise StartError(
            f"session_context_ref contains {character_name(char)}, an invisible or control "
            "character"
        )


def _same_start(
    existing: Run, definition: Workflow, version: int | None, input_digest: str
) -> tuple[Run, bool]:
    # Without an explicit version a retry may resolve to a newer one: still the same request.
    if existing.workflow != definition.name or (
        version is not None and existing.workflow_version != version
    ):
        raise BusinessKeyConflict(existing, why="workflow")
    if existing.input_digest != input_digest:
        raise BusinessKeyConflict(existing)
    return existing, False

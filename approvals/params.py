"""Parameters a person edits (an approval with edits, a retry with edits) are untrusted: the one
check of them against the tool's input schema, for the console's forms and the API alike."""

from __future__ import annotations

import contextlib
from typing import Any

from approvals.permissions import ActionRefused
from runs import tools as tool_registry
from runs.models import to_json_value
from runs.tools import ToolError


class InvalidParams(ActionRefused):
    """Edited parameters the tool does not accept; `field` names the parameter at fault."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


def validate_params(tool_name: str, params: Any, *, proposed: Any = None) -> dict:
    """Edited parameters are untrusted: check them against the tool's input schema.

    The one check for the console's edit forms and the API. In order:
    1. A JSON object.
    2. Only parameters the tool declares (its params_schema and, for agent and MCP tools, the
       properties of its JSON input schema) or that were proposed to the person: an edit may
       change values, never invent parameters a tool or a model would then receive.
    3. Every declared parameter present, of its type.
    4. The tool's own validation (an MCP or agent tool checks its full JSON schema).
    5. A size bound.
    """
    if not isinstance(params, dict):
        raise InvalidParams("The edited parameters must be a JSON object.")
    tool = None
    if tool_name:
        with contextlib.suppress(tool_registry.UnknownTool):
            tool = tool_registry.get(tool_name)
    declared = dict(tool.params_schema) if tool is not None else {}
    input_schema = _input_schema(tool) if tool is not None else {}
    known = set(declared) | set(input_schema.get("properties") or {})
    known |= set(proposed) if isinstance(proposed, dict) else set()
    for name in params:
        if name not in known:
            allowed = ", ".join(sorted(known)) or "none"
            raise InvalidParams(
                f"{name} is not a parameter of {tool_name or 'this step'} (parameters: {allowed}).",
                field=name,
            )
    for name, kind in declared.items():
        if name not in params:
            raise InvalidParams(f"{name} is required.", field=name)
        value = params[name]
        ok = isinstance(value, kind) and not (isinstance(value, bool) and kind is not bool)
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            ok = True
        if not ok:
            raise InvalidParams(
                f"{name} must be {_TYPE_NAMES.get(kind, kind.__name__)}, "
                f"not {_TYPE_NAMES.get(type(value), type(value).__name__)}.",
                field=name,
            )
    if tool is not None:
        try:
            tool.validate(params)
        except ToolError as exc:
            raise InvalidParams(f"The edited parameters are not valid: {exc.message}") from None
        if input_schema and not hasattr(tool, "input_schema"):  # McpTool checked it already
            _check_json_schema(input_schema, params)
    value = to_json_value(params)
    if len(str(value)) > 256 * 1024:
        raise InvalidParams("The edited parameters are too large (256 KiB at most).")
    return value


_TYPE_NAMES = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "true or false",
    dict: "an object",
    list: "a list",
    type(None): "null",
}


def _input_schema(tool) -> dict:
    """The JSON schema a model sees for an agent or MCP tool (empty for plain tools)."""
    schema = getattr(tool, "input_schema", None)
    if not schema:
        from runs.agents import tool_info

        schema = tool_info(tool.name).input_schema
    return schema if isinstance(schema, dict) else {}


def _check_json_schema(schema: dict, params: dict) -> None:
    import jsonschema

    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = sorted(validator.iter_errors(params), key=lambda e: list(e.path))
    if errors:
        path = [str(part) for part in errors[0].path]
        raise InvalidParams(
            f"{'.'.join(path) or 'The parameters'}: {errors[0].message}",
            field=".".join(path) or None,
        )

"""Parameters a person edits (an approval with edits, a retry with edits) are untrusted: the one
check of them against the tool's input schema, for the console's forms and the API alike."""

from __future__ import annotations

import contextlib
import re
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

    The one check for the console's edit forms and the API, before a decision is recorded. In
    order:
    1. A JSON object.
    2. Only parameters the tool declares (its params_schema and the properties of its JSON input
       schema) or that were proposed to the person: an edit may change values, never invent
       parameters a tool or a model would then receive.
    3. Every declared parameter present, of its type.
    4. The tool's full JSON input schema, when it has one (types, formats, bounds, required
       parameters: a refund's amount above 0, its currency a code), naming the parameter at
       fault. Plain tools state it through runs.agents.tool_info (the demo tools do, in
       taskpilots/demo/tools.py), agent and MCP tools with their own schema.
    5. The tool's own validation.
    6. A size bound.
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
    if input_schema:
        _check_json_schema(input_schema, params)
    if tool is not None:
        try:
            tool.validate(params)
        except ToolError as exc:
            raise InvalidParams(f"The edited parameters are not valid: {exc.message}") from None
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

    cls = jsonschema.validators.validator_for(schema)
    validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
    try:
        errors = sorted(validator.iter_errors(params), key=lambda e: [str(p) for p in e.path])
    except (jsonschema.exceptions.SchemaError, re.error, TypeError, ValueError) as exc:
        # A schema that cannot be applied (an MCP server's, say) checks nothing: refuse rather
        # than let edits through unchecked.
        raise InvalidParams(f"The tool's input schema cannot be checked: {exc}") from None
    if not errors:
        return
    error = errors[0]
    path = list(error.path)
    if not path:
        # An error about the object itself names the parameter where it can: the one missing
        # (`required`) or not allowed (`additionalProperties`).
        name = _named_property(error, params)
        if name:
            path = [name]
    field = _field(path)
    raise InvalidParams(f"{field or 'The parameters'}: {error.message}", field=field)


def _named_property(error, params: dict) -> str:
    if error.validator == "required" and isinstance(error.validator_value, list):
        return next((n for n in error.validator_value if n not in params), "")
    if error.validator == "additionalProperties" and isinstance(error.schema, dict):
        allowed = set((error.schema.get("properties") or {}).keys())
        return next((str(n) for n in params if n not in allowed), "")
    return ""


def _field(path: list) -> str | None:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or None

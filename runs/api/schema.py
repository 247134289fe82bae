"""What the API's OpenAPI schema states beyond the field types: every rule the server enforces
that a schema can express, so a client (or a fuzzer) that follows the schema is never refused.

- Identifiers: no invisible, control or format characters (the pattern of runs/api/errors.py,
  from the table in runs/invisible.py).
- Free text, every other string of a request (filters, condition values) and every string
  inside free JSON (`input`, `payload`, `edited_params`): no NUL, at most 32 768 characters
  (keys: 200), as the body guard refuses.
- Integers: a JSON number with no fraction (`1.0`) is an integer, as JSON Schema says.
- Date-times: ISO 8601 strings only (`created_before=0.5` is not a date).
- Cursors: their exact format.
- Workflows: the registered names and, per name, the registered versions.
- Bulk actions: what each action needs (a comment to settle outcomes or cancel, the answer
  about an engineer to release, exactly one target to reassign), and days that exist.
- Errors: every status the server may answer (411, 413, 415, 405, 431…), in one shape, and
  for the endpoints with codes of their own, which codes a 422 carries.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any
from uuid import UUID

from pydantic import BeforeValidator, Field, WithJsonSchema
from pydantic_core import PydanticCustomError

from runs.api.errors import MAX_KEY_CHARS, MAX_STRING_CHARS

# --------------------------------------------------------------------------------------------
# Free text and free JSON

NO_NUL = "^[^\x00]*$"
# Blank text is refused by the actions (`reason`: "Say why").
NOT_BLANK = "^[^\x00]*[^\x00\\s][^\x00]*$"


def free_text(default: Any = ..., *, max_length: int, blank: bool = True, **extra: Any) -> Any:
    """A str field whose schema says what the body guard refuses (NUL) and what the actions do
    (a blank `reason`)."""
    pattern = NO_NUL if blank else NOT_BLANK
    return Field(default, max_length=max_length, json_schema_extra={"pattern": pattern}, **extra)


JSON_COMPONENTS = {
    "JsonString": {"type": "string", "maxLength": MAX_STRING_CHARS, "pattern": NO_NUL},
    "JsonValue": {
        "anyOf": [
            {"type": "null"},
            {"type": "boolean"},
            {"type": "number"},
            {"$ref": "#/components/schemas/JsonString"},
            {"type": "array", "items": {"$ref": "#/components/schemas/JsonValue"}},
            {"$ref": "#/components/schemas/JsonObject"},
        ],
        "description": "Any JSON value; strings without NUL, nested at most 20 levels.",
    },
    "JsonObject": {
        "type": "object",
        "propertyNames": {"maxLength": MAX_KEY_CHARS, "pattern": NO_NUL},
        "additionalProperties": {"$ref": "#/components/schemas/JsonValue"},
    },
}
# Pydantic cannot point at a component it does not know: `refine` swaps this marker for the ref.
_JSON_OBJECT_MARKER = "x-taskpilots-json-object"
JsonObject = Annotated[
    dict[str, Any], WithJsonSchema({"type": "object", _JSON_OBJECT_MARKER: True})
]


# --------------------------------------------------------------------------------------------
# Numbers and date-times


def integral(value: Any) -> Any:
    # JSON has one number type: 3.0 is the integer 3 (JSON Schema agrees); 3.5 stays a float
    # and is refused by the strict int that follows, as is "3".
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


ISO_DATE_TIME = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?([Zz]|[+-]\d{2}:?\d{2})?"
)
_EARLIEST = datetime.min.replace(tzinfo=UTC)
_LATEST = datetime.max.replace(tzinfo=UTC)


def _iso_date_time(value: Any) -> Any:
    """Only ISO 8601 date-times: a number is not a date (pydantic would read 0.5 as 1970)."""
    if not isinstance(value, str) or not ISO_DATE_TIME.fullmatch(value):
        raise PydanticCustomError(
            "date_time_format",
            "must be an ISO 8601 date-time such as 2026-05-01T12:00:00Z (without an offset: UTC)",
        )
    try:
        parsed = datetime.fromisoformat(value.replace("z", "Z").replace("t", "T"))
    except ValueError as exc:
        raise PydanticCustomError(
            "date_time_format", "is not a valid date-time: {error}", {"error": str(exc)}
        ) from None
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=UTC)  # a time without a zone is UTC, never server time
    try:
        # UTC here: PostgreSQL refuses offsets beyond ±15:59 that Python accepts.
        return parsed.astimezone(UTC)
    except OverflowError:
        # 0001-01-01T00:00+01:00 is before the first representable instant: the filter means
        # "from the beginning" (or "until the end" at the other edge), not an error.
        return _EARLIEST if parsed.year == 1 else _LATEST


IsoDateTime = Annotated[
    datetime,
    BeforeValidator(_iso_date_time),
    WithJsonSchema({"type": "string", "format": "date-time"}),
]


# --------------------------------------------------------------------------------------------
# Cursors: `<microseconds since 1970 UTC>.<run id, 32 hex digits>`; every string of this form
# is a valid position (the API only ever gives out ones it has seen, but any is meaningful).

CURSOR_PATTERN = "^[0-9]{1,17}\\.[0-9a-f]{32}$"
_CURSOR = re.compile(CURSOR_PATTERN)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def encode_cursor(created_at: datetime, run_id: UUID) -> str:
    micros = (created_at - _EPOCH) // timedelta(microseconds=1)
    return f"{micros}.{run_id.hex}"


def decode_cursor(cursor: str) -> tuple[datetime, UUID] | None:
    if not _CURSOR.fullmatch(cursor):
        return None
    micros, run_hex = cursor.split(".")
    return _EPOCH + timedelta(microseconds=int(micros)), UUID(hex=run_hex)


def older_than(runs, created_at: datetime, run_id: UUID):
    """The runs before a position, newest first: (created_at, id) < (created_at, run_id), with
    the redundant bound that lets run_created_idx do the work."""
    return runs.filter(created_at__lte=created_at).exclude(created_at=created_at, id__gte=run_id)


def newer_than(runs, created_at: datetime, run_id: UUID):
    """The runs after a position: (created_at, id) > (created_at, run_id)."""
    return runs.filter(created_at__gte=created_at).exclude(created_at=created_at, id__lte=run_id)


# --------------------------------------------------------------------------------------------
# The schema document


def refine(schema: dict, *, workflows: dict[str, list[int]]) -> dict:
    """Add what the models cannot say: the JSON components, the registered workflows (and their
    versions), and conditional requirements."""
    schema = _point_at_json_object(schema)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components.update(JSON_COMPONENTS)
    start = components.get("StartRunIn")
    if start is not None and workflows:
        start["properties"]["workflow"]["enum"] = sorted(workflows)
        # Each workflow with its own versions: another version is refused (422 on `version`).
        start["anyOf"] = [
            {
                "properties": {
                    "workflow": {"const": name},
                    "version": {"anyOf": [{"type": "null"}, {"enum": versions}]},
                }
            }
            for name, versions in sorted(workflows.items())
        ]
    decision = components.get("DecisionIn")
    if decision is not None:
        decision["if"] = {
            "properties": {"decision": {"const": "approved_with_edits"}},
            "required": ["decision"],
        }
        edits = {"$ref": "#/components/schemas/JsonObject"}
        decision["then"] = {"required": ["edited_params"], "properties": {"edited_params": edits}}
    outcome = components.get("OutcomeIn")
    if outcome is not None:
        outcome["if"] = {"properties": {"happened": {"const": True}}, "required": ["happened"]}
        outcome["then"] = {"required": ["proof"], "properties": {"proof": {"pattern": NOT_BLANK}}}
    preview = components.get("BulkPreviewIn")
    if preview is not None:
        preview["allOf"] = BULK_ACTION_NEEDS
    for name, component in components.items():
        if name.endswith("In"):  # what a client sends (the body guard refuses NUL anywhere)
            _no_nul_in_strings(component)
    for path, methods in (schema.get("paths") or {}).items():
        for method, operation in methods.items():
            codes = ERROR_CODES_422.get((method, path.removeprefix(API_PREFIX)))
            responses = operation.get("responses") or {}
            response = responses.get(422) or responses.get("422")
            if codes and response is not None:
                response["description"] = "Unprocessable Content: " + codes
    return schema


API_PREFIX = "/api/v1"


def _non_blank(name: str) -> dict:
    # Present and not blank (the server strips it: "  " is no value).
    return {"required": [name], "properties": {name: {"type": "string", "pattern": NOT_BLANK}}}


def _when_action(actions: tuple[str, ...], then: dict) -> dict:
    return {
        "if": {"properties": {"action": {"enum": list(actions)}}, "required": ["action"]},
        "then": then,
    }


# approvals/bulk.py clean_params: refused with 422 `invalid` naming the field.
BULK_ACTION_NEEDS = [
    _when_action(("confirm_happened", "confirm_not_happened", "cancel"), _non_blank("comment")),
    _when_action(
        ("release",),
        {"required": ["needed_engineer"], "properties": {"needed_engineer": {"type": "boolean"}}},
    ),
    _when_action(("reassign",), {"oneOf": [_non_blank("to"), _non_blank("to_queue")]}),
]


# The 422 codes of endpoints that have codes of their own besides the schema's (`missing_field`,
# `unknown_field`, `invalid_field`, `invalid_type`, `invalid_characters`).
ERROR_CODES_422 = {
    ("post", "/bulk-actions/preview"): (
        "`invalid` (a filter or the action's parameters the server refuses; `field` names it, "
        "e.g. `filters.date_to` or `comment`), `unknown_user`, `unknown_queue` (a queue none of "
        "the configured ones: the message lists them), or a code of the schema's."
    ),
    ("post", "/bulk-actions/{bulk_id}/execute"): "`unknown_user`, or a code of the schema's.",
    ("post", "/runs"): (
        "`unknown_workflow`, `invalid_input` (the workflow's own validator), or a code of the "
        "schema's."
    ),
    ("post", "/approvals/{approval_id}/decision"): (
        "`invalid_params` (edits the tool's input schema refuses; `field` is "
        "`edited_params.<parameter>`), `invalid_conditions`, `unknown_user`, `missing_field`, "
        "or a code of the schema's."
    ),
}


def _no_nul_in_strings(node: Any) -> None:
    """Every string of a request without a pattern, format or fixed values gets NO_NUL."""
    if isinstance(node, dict):
        fixed = {"pattern", "format", "enum", "const", "$ref"} & node.keys()
        if node.get("type") == "string" and not fixed:
            node["pattern"] = NO_NUL
        for value in node.values():
            _no_nul_in_strings(value)
    elif isinstance(node, list):
        for item in node:
            _no_nul_in_strings(item)


def _point_at_json_object(node: Any) -> Any:
    if isinstance(node, dict):
        if node.get(_JSON_OBJECT_MARKER):
            rest = {k: v for k, v in node.items() if k not in (_JSON_OBJECT_MARKER, "type")}
            return {"$ref": "#/components/schemas/JsonObject", **rest}
        return {key: _point_at_json_object(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_point_at_json_object(item) for item in node]
    return node

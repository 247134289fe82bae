"""Conditions an approver attaches to an approval, which the engine enforces on the call.

A condition is `{"param": name, "op": op, "value": value}` on one top-level parameter of the
call: a cap or floor on a number (`amount <= 50`) or the values a parameter may take
(`currency in EUR, USD`). The console writes them as text, one per line or separated by `;`;
the API sends the list. `validate()` is the one check at the boundary (console and API alike);
`broken()` is what the engine asks right before it calls the tool (runs.engine.ledger).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

NUMERIC_OPS = ("<=", "<", ">=", ">")
OPS = (*NUMERIC_OPS, "==", "in")
MAX_CONDITIONS = 20
MAX_VALUES = 50
MAX_TEXT = 2000

_LINE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(<=|>=|==|<|>|\bin\b)\s*(.*?)\s*$")


class ConditionError(ValueError):
    """A condition that cannot be accepted; `index` is its position (0-based) when known."""

    def __init__(self, message: str, index: int | None = None):
        super().__init__(message)
        self.index = index


def describe(condition: dict) -> str:
    """`amount <= 50`, `currency in EUR, USD`: how people read a condition."""
    value = condition["value"]
    shown = ", ".join(_text(v) for v in value) if condition["op"] == "in" else _text(value)
    return f"{condition['param']} {condition['op']} {shown}"


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _is_number(value: Any) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and not (isinstance(value, float) and not math.isfinite(value))
    )


def _same_type(value: Any, like: Any) -> bool:
    if _is_number(like):
        return _is_number(value)
    return type(value) is type(like) and isinstance(value, str | bool)


def parse_text(text: str, params: dict) -> list[dict]:
    """The console's syntax, typed by the proposed parameters (`amount <= 50` is a number
    because `amount` is one). Raises ConditionError naming the line at fault."""
    if len(text) > MAX_TEXT:
        raise ConditionError(f"Conditions are limited to {MAX_TEXT} characters.")
    parts = [p for p in re.split(r"[;\n]", text) if p.strip()]
    conditions = []
    for index, part in enumerate(parts):
        match = _LINE.match(part)
        if match is None:
            raise ConditionError(
                f"“{part.strip()[:80]}” is not a condition: write “param op value”, with op one "
                f"of {', '.join(OPS)} (e.g. “amount <= 50” or “currency in EUR, USD”).",
                index,
            )
        param, op, raw = match.groups()
        like = params.get(param) if isinstance(params, dict) else None
        if op == "in":
            values = [_typed(v.strip(), like) for v in raw.split(",") if v.strip()]
            conditions.append({"param": param, "op": op, "value": values})
        else:
            conditions.append({"param": param, "op": op, "value": _typed(raw, like)})
    return validate(conditions, params)


def _typed(raw: str, like: Any) -> Any:
    """A value written as text, read as the type of the parameter it is compared with."""
    if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "\"'":
        return raw[1:-1]
    if _is_number(like) or isinstance(like, bool):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw


def validate(conditions: Any, params: Any) -> list[dict]:
    """The conditions, checked against the parameters the approver is shown: a list of at most
    MAX_CONDITIONS objects with exactly param/op/value, op in OPS, a parameter the call has,
    a value of that parameter's type (a number for the comparisons, a non-empty list for
    `in`), and one the shown parameters already meet (else nothing could ever be called).
    Returns them normalised; raises ConditionError."""
    if conditions is None:
        return []
    if not isinstance(conditions, list):
        raise ConditionError("Conditions must be a list.")
    if len(conditions) > MAX_CONDITIONS:
        raise ConditionError(f"At most {MAX_CONDITIONS} conditions.")
    params = params if isinstance(params, dict) else {}
    checked = []
    for index, condition in enumerate(conditions):
        checked.append(_validate_one(condition, params, index))
    return checked


def _validate_one(condition: Any, params: dict, index: int) -> dict:
    if not isinstance(condition, dict) or set(condition) != {"param", "op", "value"}:
        raise ConditionError(
            "Each condition is an object with exactly “param”, “op” and “value”.", index
        )
    param, op, value = condition["param"], condition["op"], condition["value"]
    if op not in OPS:
        raise ConditionError(f"Unknown operator {op!r}: use one of {', '.join(OPS)}.", index)
    if not isinstance(param, str) or param not in params:
        known = ", ".join(sorted(params)) or "none"
        raise ConditionError(
            f"The call has no parameter {param!r} (its parameters: {known}).", index
        )
    proposed = params[param]
    if op in NUMERIC_OPS:
        if not _is_number(proposed):
            raise ConditionError(f"{param} is not a number: “{op}” needs one.", index)
        if not _is_number(value):
            raise ConditionError(f"{param} {op} needs a number, not {_text(value)!r}.", index)
    elif op == "in":
        if not isinstance(value, list) or not value or len(value) > MAX_VALUES:
            raise ConditionError(
                f"{param} in needs a list of 1 to {MAX_VALUES} allowed values.", index
            )
        wrong = [v for v in value if not _same_type(v, proposed)]
        if wrong:
            raise ConditionError(
                f"{param} is a {_kind(proposed)}: {_text(wrong[0])!r} cannot be one of its values.",
                index,
            )
    elif not _same_type(value, proposed):
        raise ConditionError(
            f"{param} is a {_kind(proposed)}: it cannot equal {_text(value)!r}.", index
        )
    checked = {"param": param, "op": op, "value": value}
    if not holds(checked, params):
        raise ConditionError(
            f"The parameters shown already break “{describe(checked)}” ({param} is "
            f"{_text(proposed)}): nothing could be called.",
            index,
        )
    return checked


def _kind(value: Any) -> str:
    if _is_number(value):
        return "number"
    return {str: "text", bool: "true/false"}.get(type(value), "structured value")


def holds(condition: dict, params: dict) -> bool:
    """Whether `params` meet the condition (a missing or mistyped parameter does not)."""
    if not isinstance(params, dict) or condition["param"] not in params:
        return False
    actual, op, value = params[condition["param"]], condition["op"], condition["value"]
    if op in NUMERIC_OPS:
        if not (_is_number(actual) and _is_number(value)):
            return False
        return {
            "<=": actual <= value,
            "<": actual < value,
            ">=": actual >= value,
            ">": actual > value,
        }[op]
    if op == "in":
        return any(_same_type(actual, v) and actual == v for v in value)
    return _same_type(actual, value) and actual == value


def broken(conditions: list[dict], params: dict) -> list[str]:
    """The conditions `params` break, as people read them (empty: the call may be made)."""
    return [describe(c) for c in conditions or () if not holds(c, params)]

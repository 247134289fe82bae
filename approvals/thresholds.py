"""A rule's thresholds measured on a call's parameters (approvals/gate.py counts approvers with
them): the amount in the rule's currency, converted by TASKPILOTS_CURRENCY_RATES, and the number of
records touched. A value that cannot be read or converted counts as above: the careful side.

Plain functions of a rule (anything with EscalationRule's threshold fields), a tool and the
parameters: no model is imported here, so the rule's own `approvers_for` can use them.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any

from django.conf import settings

from runs.tools import Tool


def _number(value: Any) -> Decimal | None:
    if isinstance(value, bool) or not isinstance(value, int | float | str | Decimal):
        return None
    try:
        number = Decimal(str(value))
    except (InvalidOperation, ValueError):
        return None
    return number if number.is_finite() else None


def convert(amount: Decimal, currency: str, to: str) -> Decimal | None:
    """`amount` of `currency` in `to`, by the configured rates; None when either is unknown."""
    if currency == to:
        return amount
    rates = settings.TASKPILOTS.get("CURRENCY_RATES") or {}
    if currency not in rates or to not in rates:
        return None
    return amount * Decimal(rates[currency]) / Decimal(rates[to])


def amount_of(rule, params: dict, tool: Tool | None) -> Decimal | None:
    """The call's amount in the rule's currency, or None when it cannot be told (then the
    threshold counts as passed)."""
    name = rule.amount_param or (tool.amount_param if tool is not None else "")
    amount = _number(params.get(name)) if name else None
    if amount is None or not rule.amount_currency:
        return amount
    currency_param = (tool.currency_param if tool is not None else "") or "currency"
    currency = params.get(currency_param)
    if currency is None and tool is not None:
        currency = tool.default_currency or None
    if not isinstance(currency, str):
        return None
    return convert(amount, currency.strip().upper(), rule.amount_currency.upper())


def records_of(rule, params: dict, tool: Tool | None) -> int | None:
    name = rule.records_param or (tool.records_param if tool is not None else "")
    value = params.get(name) if name else None
    if isinstance(value, list | dict):
        return len(value)
    number = _number(value)
    return int(number) if number is not None and number == int(number) else None


def _measures(rule, tool: Tool | None, param: str, declared: str) -> bool:
    """Whether the rule can measure this call: it names the parameter, or the tool declares it.
    A rule for this very tool that cannot measure it counts it as above (careful); a general
    rule simply does not apply to tools without such a parameter."""
    return bool(param or (tool is not None and declared) or rule.tool)


def above_threshold(rule, params: dict, tool: Tool | None) -> bool:
    """Whether the call passes any of the rule's thresholds (amount, records)."""
    if rule.amount_param or rule.amount_above is not None:
        declared = tool.amount_param if tool is not None else ""
        if _measures(rule, tool, rule.amount_param, declared):
            amount = amount_of(rule, params, tool)
            if amount is None or amount > (rule.amount_above or 0):
                return True
    if rule.records_above is not None:
        declared = tool.records_param if tool is not None else ""
        if _measures(rule, tool, rule.records_param, declared):
            count = records_of(rule, params, tool)
            if count is None or count > rule.records_above:
                return True
    return False

"""The one place for what people read: labels keyed by the models' choices, the engine's known
sentences in the reader's language, and `sentence`, which renders one of the console's sentences
from its template partial (templates/console/sentences/) with every value escaped."""

from __future__ import annotations

import re
from typing import Any

from django.template.loader import render_to_string
from django.utils.formats import number_format
from django.utils.html import conditional_escape
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext_lazy

from approvals.models import (
    ApprovalRequest,
    DecisionVerb,
)
from runs.models import (
    FailureClass,
    Risk,
    Run,
    SideEffect,
    Step,
    StepKind,
)

PAGE_SIZE = 25


# --------------------------------------------------------------------------------------------
# Labels: the one place for what people read. The model choices carry plain English (for the
# Django admin); the console, the audit pages and the forms show these translatable ones, keyed
# by the same choices.

RUN_STATUS_LABELS = {
    Run.Status.PENDING: gettext_lazy("Pending"),
    Run.Status.RUNNING: gettext_lazy("Running"),
    Run.Status.WAITING: gettext_lazy("Waiting"),
    Run.Status.NEEDS_HUMAN: gettext_lazy("Needs a person"),
    Run.Status.TAKEN_OVER: gettext_lazy("Taken over"),
    Run.Status.COMPENSATING: gettext_lazy("Undoing side effects"),
    Run.Status.SUCCEEDED: gettext_lazy("Succeeded"),
    Run.Status.FAILED: gettext_lazy("Failed"),
    Run.Status.CANCELLED: gettext_lazy("Cancelled"),
    Run.Status.COMPENSATED: gettext_lazy("Undone (compensated)"),
}
STEP_STATUS_LABELS = {
    Step.Status.PENDING: gettext_lazy("To do"),
    Step.Status.RUNNING: gettext_lazy("Running"),
    Step.Status.SUCCEEDED: gettext_lazy("Done"),
    Step.Status.DEGRADED: gettext_lazy("Done with fallback"),
    Step.Status.RETRY_SCHEDULED: gettext_lazy("Retry scheduled"),
    Step.Status.WAITING: gettext_lazy("Waiting"),
    Step.Status.NEEDS_HUMAN: gettext_lazy("Needs a person"),
    Step.Status.UNKNOWN_OUTCOME: gettext_lazy("Outcome unknown"),
    Step.Status.FAILED: gettext_lazy("Failed"),
    Step.Status.SKIPPED: gettext_lazy("Skipped"),
    Step.Status.COMPENSATED: gettext_lazy("Undone"),
}
EFFECT_STATUS_LABELS = {
    SideEffect.Status.INTENDED: gettext_lazy("About to be sent"),
    SideEffect.Status.COMMITTED: gettext_lazy("Done"),
    SideEffect.Status.UNKNOWN: gettext_lazy("Outcome unknown"),
    SideEffect.Status.NOT_COMMITTED: gettext_lazy("This call did not go through"),
    SideEffect.Status.COMPENSATED: gettext_lazy("Undone"),
}
# One plain name per failure class, everywhere a person reads one: the inbox filter and badges,
# the bulk form, rule chips, the rule form and tester, metrics and the API docs. (The model
# choices in runs/models/ keep their technical names for the Django admin and migrations.)
FAILURE_LABELS = {
    FailureClass.TRANSIENT: gettext_lazy("Kept failing"),
    FailureClass.OUTAGE: gettext_lazy("System outage"),
    FailureClass.INVALID_INPUT: gettext_lazy("Invalid data"),
    FailureClass.PERMISSION: gettext_lazy("Permission denied"),
    FailureClass.UNKNOWN_OUTCOME: gettext_lazy("Unknown outcome"),
    FailureClass.TIMEOUT: gettext_lazy("Wait timed out"),
    FailureClass.EMPTY_RESULT: gettext_lazy("Nothing found"),
    FailureClass.API_DRIFT: gettext_lazy("API changed"),
}
# A two-person approval one person gave and a second has not (an inbox filter, not a cause).
SECOND_APPROVAL = "second_approval"
REASON_LABELS = {
    "approval": gettext_lazy("Approval"),
    SECOND_APPROVAL: gettext_lazy("Waiting for a second approver"),
    **FAILURE_LABELS,
}


def failure_class_choices() -> list[tuple[str, Any]]:
    """(value, label) for a select of failure classes, in the order the model lists them."""
    return [(value, FAILURE_LABELS[value]) for value in FailureClass.values]


STEP_KIND_LABELS = {
    StepKind.COMPUTE: gettext_lazy("Compute"),
    StepKind.READ: gettext_lazy("Read"),
    StepKind.SIDE_EFFECT: gettext_lazy("Side effect"),
    StepKind.APPROVAL: gettext_lazy("Approval"),
    StepKind.WAIT_EVENT: gettext_lazy("Wait for event"),
    StepKind.WAIT_TIMER: gettext_lazy("Wait for timer"),
}
# What a person did, as the rest of a sentence that starts with their name.
VERB_LABELS = {
    DecisionVerb.APPROVE: gettext_lazy("approved"),
    DecisionVerb.APPROVE_WITH_EDITS: gettext_lazy("approved with edits"),
    DecisionVerb.REJECT: gettext_lazy("rejected"),
    DecisionVerb.TAKE_OVER: gettext_lazy("took over"),
    DecisionVerb.RELEASE: gettext_lazy("released"),
    DecisionVerb.CONFIRM_HAPPENED: gettext_lazy("confirmed it happened"),
    DecisionVerb.CONFIRM_NOT_HAPPENED: gettext_lazy("confirmed it did not happen"),
    DecisionVerb.RETRY: gettext_lazy("retried"),
    DecisionVerb.SKIP: gettext_lazy("skipped the step"),
    DecisionVerb.COMPLETE_BY_HAND: gettext_lazy("marked the step done by hand"),
    DecisionVerb.CANCEL: gettext_lazy("cancelled the run"),
    DecisionVerb.REASSIGN: gettext_lazy("reassigned the run"),
}
# An approval request's decision.
DECISION_LABELS = {
    ApprovalRequest.Decision.APPROVED: gettext_lazy("Approved"),
    ApprovalRequest.Decision.APPROVED_WITH_EDITS: gettext_lazy("Approved with edits"),
    ApprovalRequest.Decision.REJECTED: gettext_lazy("Rejected"),
}

FAILURE_CLASS_LABELS = FAILURE_LABELS
# Translatable in runs/models/ (the tools page and rule chips show them).
RISK_LABELS = dict(Risk.choices)


def label(mapping: dict, value: str) -> str:
    return str(mapping.get(value, value))


# Sentences the engine writes into a run (its attention reason, a step's last error) are stored
# in English, so the record reads the same whoever reads it. The console shows the known ones
# in the reader's language, matched whole (runs/engine/compensation.py, runs/engine/ledger.py;
# tests/approvals/test_engine_sentences.py makes the engine write each one); anything else, such
# as a tool's own error, is shown as it was written.
_NO_DEDUPE = {
    "its verification read could not tell whether it did, and it does not dedupe": gettext_lazy(
        "%(error)s. %(tool)s may or may not have done this; its verification read could not "
        "tell whether it did, and it does not dedupe, so a person must check (idempotency key "
        "%(key)s)."
    ),
    "it cannot be asked by key, has no verification read and does not dedupe": gettext_lazy(
        "%(error)s. %(tool)s may or may not have done this; it cannot be asked by key, has no "
        "verification read and does not dedupe, so a person must check (idempotency key "
        "%(key)s)."
    ),
}
ENGINE_SENTENCES = [
    (
        re.compile(
            r"Compensation finished, but these side effects have no compensating tool and must "
            r"be undone by hand: (?P<listed>.+)",
            re.S,
        ),
        {
            "": gettext_lazy(
                "Compensation finished, but these side effects have no compensating tool and must "
                "be undone by hand: %(listed)s"
            )
        },
    ),
    (
        re.compile(
            r"(?P<error>.+)\. (?P<tool>\S+) may or may not have done this; (?P<why>"
            + "|".join(map(re.escape, _NO_DEDUPE))
            + r"), so a person must check \(idempotency key (?P<key>\S+)\)\.",
            re.S,
        ),
        _NO_DEDUPE,
    ),
]


def engine_text(text: Any) -> Any:
    """An engine-written sentence in the reader's language, as plain text (the template still
    escapes it and shows invisible characters); any other text unchanged."""
    if not isinstance(text, str):
        return text
    for pattern, templates in ENGINE_SENTENCES:
        match = pattern.fullmatch(text)
        if match:
            values = match.groupdict()
            return str(templates[values.pop("why", "")]) % values
    return text


def sentence(partial: str, **values: Any) -> SafeString:
    """One of the console's sentences in the reader's language: `partial` names a partial under
    templates/console/sentences/ (`"next_action.html#approve"`), where its text is, with these
    values. The template escapes every value and isolates agent, tool and user data
    (`|untrusted`); a SafeString (a sentence put inside another) goes in as it is."""
    return mark_safe(render_to_string(f"console/sentences/{partial}", values).strip())


def sentences(*parts: Any) -> SafeString:
    """Sentences side by side, each escaped unless it is already safe (sentence() made it)."""
    return mark_safe(" ".join(str(conditional_escape(part)) for part in parts if part))


# ISO 4217 minor units where they are not 2 (yen and won have no cents; dinars have three).
CURRENCY_DECIMALS = {
    **dict.fromkeys(
        (
            "BIF",
            "CLP",
            "DJF",
            "GNF",
            "ISK",
            "JPY",
            "KMF",
            "KRW",
            "PYG",
            "RWF",
            "UGX",
            "UYI",
            "VND",
            "VUV",
            "XAF",
            "XOF",
            "XPF",
        ),
        0,
    ),
    **dict.fromkeys(("BHD", "IQD", "JOD", "KWD", "LYD", "OMR", "TND"), 3),
}


def amount_of(params: Any) -> str:
    """A money amount in the parameters, with its currency and as many decimals as that
    currency has: `1,250.00 USD`, `1,250 JPY`. Without a currency in the call, it says so (the
    payment system then applies its default); "" when there is no amount. An amount finer than
    its currency allows is shown with all its digits: a person approves what will be sent."""
    if not isinstance(params, dict):
        return ""
    amount = params.get("amount")
    if isinstance(amount, bool) or not isinstance(amount, int | float):
        return ""
    currency = params.get("currency")
    currency = currency.strip() if isinstance(currency, str) else ""
    decimals = CURRENCY_DECIMALS.get(currency.upper(), 2)
    if round(amount, decimals) != amount:
        decimals = len(repr(float(amount)).partition(".")[2].rstrip("0"))
    shown = number_format(amount, decimal_pos=decimals, force_grouping=True)
    if currency:
        return sentence("labels.html#amount", amount=shown, currency=currency)
    return sentence("labels.html#amount-no-currency", amount=shown)

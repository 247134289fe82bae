"""Console forms: inbox and run-list filters, and one form per human action.

Every action form carries the run's lock_version as `expected_version`, so a stale page or a
double submit loses cleanly in approvals/actions.py.

What a person types is checked here, with the API's rules, so that bad input is a form error
and never reaches the database: `TextField` (no NUL, no unpaired surrogate: PostgreSQL stores
neither), `IdentifierField` (names and keys: no invisible, control or format character,
runs/invisible.py), `JsonTextField` (JSON through the API's parser, runs/api/errors.py:
no NaN or out-of-range numbers, no key twice, bounded depth and lengths) and `DayField` (a day
a filter can use, approvals/viewer_time.py).
"""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.forms.fields import InvalidJSONInput, JSONString
from django.utils.translation import gettext_lazy as _

from approvals import viewer_time
from approvals.console import REASON_LABELS, RUN_STATUS_LABELS
from approvals.models import known_queues
from approvals.params import InvalidParams, validate_params
from runs import invisible
from runs import tools as tool_registry
from runs.api.errors import JsonRefused, parse_json_text
from runs.invisible import neutralise

MAX_JSON_CHARS = 256 * 1024
# The empty choice Django 6.1 puts first in a select for a model field with choices. Its own
# zh-Hans catalog does not have it yet; marked here so makemessages keeps it in ours, which
# Django merges over its own (the rule and channel forms show it).
BLANK_CHOICE_LABEL = _("- Select an option -")


# --------------------------------------------------------------------------------------------
# What a person types


def validate_text(value: str) -> None:
    """Free text: no unpaired surrogate (not valid Unicode; PostgreSQL cannot store it). NUL is
    refused by Django's own validator, which every CharField has."""
    try:
        str(value).encode("utf-8")
    except UnicodeEncodeError:
        raise ValidationError(
            _("This text contains an unpaired surrogate, which is not valid text."),
            code="surrogate",
        ) from None


def validate_identifier(value: str) -> None:
    """Names and keys (tools, queues, workflows, steps, users): free text's rules, and no
    character an identifier may not hold (the API's rule, runs/invisible.py)."""
    validate_text(value)
    char = invisible.first_forbidden_in_identifier(value)
    if char is not None and char != "\x00":  # NUL: Django's own validator says it
        raise ValidationError(
            _(
                "This contains %(character)s, an invisible or control character; names and "
                "keys may not hold one."
            ),
            params={"character": invisible.character_name(char)},
            code="invisible_character",
        )


class TextField(forms.CharField):
    default_validators = [validate_text]


class IdentifierField(forms.CharField):
    default_validators = [validate_identifier]

    def __init__(self, **kwargs):
        super().__init__(**{**kwargs, "strip": False})

    def to_python(self, value):
        # Spaces a person typed around a name go; a line separator (U+2028) or another invisible
        # character stays and is refused, rather than quietly making "mail.send\u2028" name
        # mail.send.
        return super().to_python(value).strip(" \t\r\n")


def json_error(exc: JsonRefused) -> ValidationError:
    """What the API's JSON parser refused, in the reader's language."""
    messages = {
        "syntax": _("This is not valid JSON: %(error)s"),
        "not_finite": _(
            "%(value)s is not a number JSON can hold (no NaN, Infinity or numbers out of range)."
        ),
        "nul_byte": _("The JSON holds a NUL character (\\u0000), which cannot be stored."),
        "surrogate": _(
            "The JSON holds an unpaired surrogate (such as \\ud800), which is not valid text."
        ),
        "too_deep": _("The JSON is nested deeper than %(limit)s levels."),
        "string_too_long": _("A string in the JSON is longer than %(limit)s characters."),
        "key_too_long": _("A key in the JSON is longer than %(limit)s characters."),
        "duplicate_key": _("The key “%(key)s” appears twice in one object; give it once."),
    }
    message = messages.get(exc.reason, messages["syntax"])
    return ValidationError(message, code=exc.reason, params={"error": exc.message, **exc.params})


class JsonTextField(forms.JSONField):
    """JSON a person types, read by the API's parser (runs.api.errors.parse_json_text) rather
    than json.loads, whose NaN, 1e400, "\\u0000", lone surrogates and deep nesting would reach
    PostgreSQL (or the recursion limit) as a 500. `json_object`: only an object is accepted."""

    def __init__(self, *, json_object: bool = False, max_chars: int = MAX_JSON_CHARS, **kwargs):
        super().__init__(**kwargs)
        self.json_object = json_object
        self.max_chars = max_chars

    def _parse(self, text: str) -> Any:
        if len(text) > self.max_chars:
            raise ValidationError(
                _("This is too large (%(limit)s KiB at most)."),
                params={"limit": self.max_chars // 1024},
                code="too_large",
            )
        try:
            return parse_json_text(text, what="The text")
        except JsonRefused as exc:
            raise json_error(exc) from None

    def to_python(self, value):
        if self.disabled:
            return value
        if value in self.empty_values:
            return None
        if isinstance(value, list | dict | int | float | JSONString):
            return value
        converted = self._parse(str(value))
        if self.json_object and not isinstance(converted, dict):
            raise ValidationError(_("Give a JSON object."), code="not_an_object")
        return JSONString(converted) if isinstance(converted, str) else converted

    def bound_data(self, data, initial):
        # Shown again as typed when it does not parse (Django's own field would call json.loads
        # here, and fail on deep nesting while rendering the error).
        if self.disabled:
            return initial
        if data is None:
            return None
        try:
            return self._parse(str(data))
        except ValidationError:
            return InvalidJSONInput(data)


class DayField(forms.DateField):
    """A day for a "started from / until" filter: also one whose start and end exist in the
    viewer's zone (9999-12-31 has no end: approvals/viewer_time.py)."""

    def validate(self, value):
        super().validate(value)
        if value:
            try:
                viewer_time.check_day(value)
            except viewer_time.DayOutOfRange:
                raise ValidationError(
                    _("%(day)s is outside the dates runs can be searched by."),
                    params={"day": value.isoformat()},
                    code="out_of_range",
                ) from None


class InboxFilterForm(forms.Form):
    queue = forms.ChoiceField(label=_("Queue"), required=False)
    workflow = forms.ChoiceField(label=_("Workflow"), required=False)
    reason = forms.ChoiceField(label=_("Reason"), required=False)
    owner = forms.ChoiceField(
        label=_("Owner"),
        required=False,
        choices=[
            ("", _("Anyone")),
            ("mine", _("Mine")),
            ("unassigned", _("Unassigned")),
            ("unclaimed", _("Nobody handling it")),
        ],
    )

    def __init__(self, *args, queues=(), workflows=(), **kwargs):
        super().__init__(*args, **kwargs)
        # Names from workflows, tools and rules are shown with their invisible characters.
        self.fields["queue"].choices = [("", _("All queues"))] + [
            (q, neutralise(q)) for q in queues
        ]
        self.fields["workflow"].choices = [("", _("All workflows"))] + [
            (w, neutralise(w)) for w in workflows
        ]
        self.fields["reason"].choices = [("", _("All reasons"))] + list(REASON_LABELS.items())

    def filters(self) -> dict[str, str]:
        if not self.is_valid():
            return {}
        return {k: v for k, v in self.cleaned_data.items() if v}


class RunSearchForm(forms.Form):
    q = forms.CharField(
        label=_("Run id or business key"), required=False, max_length=200, strip=True
    )
    workflow = forms.ChoiceField(label=_("Workflow"), required=False)
    status = forms.ChoiceField(
        label=_("Status"),
        required=False,
        choices=[("", _("Any status"))] + list(RUN_STATUS_LABELS.items()),
    )
    date_from = DayField(
        label=_("Started from"), required=False, widget=forms.DateInput(attrs={"type": "date"})
    )
    date_to = DayField(
        label=_("Started until"), required=False, widget=forms.DateInput(attrs={"type": "date"})
    )

    def __init__(self, *args, workflows=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["workflow"].choices = [("", _("All workflows"))] + [
            (w, neutralise(w)) for w in workflows
        ]

    def filters(self) -> dict[str, Any]:
        if not self.is_valid():
            return {}
        return {k: v for k, v in self.cleaned_data.items() if v}


# --------------------------------------------------------------------------------------------
# Actions


class ActionForm(forms.Form):
    expected_version = forms.IntegerField(min_value=0, widget=forms.HiddenInput)
    # What a person acts on, as the page showed it (approvals.live.actionable_state).
    expected_state = forms.CharField(required=False, max_length=64, widget=forms.HiddenInput)
    comment = forms.CharField(
        label=_("Comment"),
        required=False,
        max_length=4000,
        widget=forms.Textarea(attrs={"rows": 2}),
    )


class ReleaseForm(ActionForm):
    """Releasing a taken-over run asks the person what it cost: whether it needed an engineer
    (required; the takeover metrics count the answers) and, optionally, what for."""

    needed_engineer = forms.TypedChoiceField(
        label=_("Did this need an engineer?"),
        choices=[("yes", _("Yes")), ("no", _("No"))],
        coerce=lambda value: value == "yes",
        widget=forms.RadioSelect,
        error_messages={"required": _("Say whether this run needed an engineer.")},
    )
    engineer_note = forms.CharField(
        label=_("What did it need? (note)"),
        required=False,
        max_length=2000,
        widget=forms.Textarea(attrs={"rows": 2}),
    )


def _conditions_field() -> forms.CharField:
    return forms.CharField(
        label=_("Only if (conditions)"),
        required=False,
        max_length=2000,
        strip=True,
        help_text=_(
            "One per line, e.g. “amount <= 50” or “currency in EUR, USD”. TaskPilots checks "
            "them right before the call and hands the run to a person instead of calling when "
            "they do not hold."
        ),
        widget=forms.Textarea(attrs={"rows": 2, "spellcheck": "false"}),
    )


class ReassignForm(ActionForm):
    """Hand the run on: a run waiting for a person to another queue, a taken-over run to
    another person (approvals/actions.py move_to_queue / reassign)."""

    to_queue = forms.ChoiceField(label=_("To the queue"), required=False)
    to = IdentifierField(label=_("Or to the person (username)"), required=False, max_length=150)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["to_queue"].choices = [("", "—")] + [(q, neutralise(q)) for q in known_queues()]

    def clean(self):
        data = super().clean()
        if bool(data.get("to_queue")) == bool((data.get("to") or "").strip()):
            raise forms.ValidationError(_("Choose a queue or a person (one of the two)."))
        return data


class ApproveForm(ActionForm):
    approval = forms.IntegerField(min_value=1, widget=forms.HiddenInput)
    conditions = _conditions_field()


class RejectForm(ApproveForm):
    conditions = None
    comment = forms.CharField(
        label=_("Why reject it?"),
        max_length=4000,
        widget=forms.Textarea(attrs={"rows": 2}),
        error_messages={"required": _("Say why you reject it.")},
    )


class StepForm(ActionForm):
    step = forms.IntegerField(min_value=1, widget=forms.HiddenInput)


class ConfirmHappenedForm(StepForm):
    field_order = ["proof", "comment"]

    proof = forms.CharField(
        label=_("External reference (proof)"),
        max_length=2000,
        error_messages={
            "required": _("Give the external reference (e.g. the message or record id).")
        },
    )


class ReasonForm(ActionForm):
    comment = forms.CharField(
        label=_("Reason"),
        max_length=4000,
        widget=forms.Textarea(attrs={"rows": 2}),
        error_messages={"required": _("Say why.")},
    )


class CompleteForm(ActionForm):
    result = JsonTextField(
        label=_("Result (JSON)"),
        widget=forms.Textarea(attrs={"rows": 4, "spellcheck": "false"}),
        error_messages={"required": _('Give the step\'s result as JSON, e.g. {"id": "…"}.')},
    )


def _field_for(kind: type, value: Any, name: str) -> forms.Field:
    common = {"label": name, "required": True}
    if kind is bool:
        return forms.BooleanField(label=name, required=False)
    if kind is int:
        return forms.IntegerField(**common)
    if kind is float:
        return forms.FloatField(**common)
    if kind is str:
        long = isinstance(value, str) and (len(value) > 80 or "\n" in value)
        widget = forms.Textarea(attrs={"rows": 4}) if long else forms.TextInput
        return TextField(max_length=MAX_JSON_CHARS, strip=False, widget=widget, **common)
    return JsonTextField(widget=forms.Textarea(attrs={"rows": 3}), **common)


class EditParamsForm(ActionForm):
    """A form built from the tool's params_schema (one field per declared parameter); a tool
    without a schema gets one JSON object field. Undeclared parameters are kept as they were."""

    approval = forms.IntegerField(min_value=1, widget=forms.HiddenInput, required=False)

    def __init__(
        self, *args, tool: str = "", params: dict | None = None, conditions=False, **kwargs
    ):
        super().__init__(*args, **kwargs)
        self.tool = tool
        self.original = dict(params or {}) if isinstance(params, dict) else {}
        try:
            self.schema = dict(tool_registry.get(tool).params_schema) if tool else {}
        except tool_registry.UnknownTool:
            self.schema = {}
        if self.schema:
            currency = self.original.get("currency")
            for name, kind in self.schema.items():
                field = _field_for(kind, self.original.get(name), name)
                field.initial = self.original.get(name)
                if name == "amount" and isinstance(currency, str) and currency:
                    field.label = f"{name} ({neutralise(currency)})"
                self.fields[f"param__{name}"] = field
        else:
            self.fields["params_json"] = JsonTextField(
                json_object=True,
                label=_("Parameters (JSON object)"),
                initial=self.original,
                widget=forms.Textarea(attrs={"rows": 6, "spellcheck": "false"}),
            )
        if conditions:
            # Approving with edits can be conditional too (checked against the edited call).
            self.fields["conditions"] = _conditions_field()

    def param_fields(self):
        return [self[name] for name in self.fields if name.startswith("param")]

    def clean(self):
        data = super().clean()
        if "params_json" in self.fields:
            params = data.get("params_json")
            if params is not None and not isinstance(params, dict):
                self.add_error("params_json", _("Give a JSON object."))
                return data
        else:
            params = dict(self.original)
            for name in self.schema:
                key = f"param__{name}"
                if key in data:
                    params[name] = data[key]
            if len(json.dumps(params, default=str)) > MAX_JSON_CHARS:
                raise forms.ValidationError(_("The parameters are too large (256 KiB at most)."))
        if params is not None and not self.errors:
            # The same check as the API and the action itself (approvals/actions.py).
            try:
                params = validate_params(self.tool, params, proposed=self.original)
            except InvalidParams as exc:
                field = f"param__{exc.field}"
                if field not in self.fields:
                    field = "params_json" if "params_json" in self.fields else None
                self.add_error(field, str(exc))
        data["params"] = params
        return data


# --------------------------------------------------------------------------------------------
# Admin and bulk forms whose values used to be read from request.POST as they came


def first_error(form: forms.Form) -> tuple[str, str | None]:
    """The first error of an invalid form as (message, field name or None), for pages that show
    one message and mark the field (bulk actions, tool pauses)."""
    for name, errors in form.errors.items():
        field = None if name == NON_FIELD_ERRORS else name
        label = form.fields[name].label if field in form.fields else ""
        message = str(errors[0])
        return (f"{label}: {message}" if label else message), field
    return "", None  # pragma: no cover (only called for invalid forms)


class ToolPauseForm(forms.Form):
    tool = IdentifierField(label=_("Tool"), max_length=150)
    # Blank is refused by rules.pause_tool, with its own message ("Say why…").
    reason = TextField(label=_("Reason"), required=False, max_length=2000, strip=False)


class ToolResumeForm(forms.Form):
    tool = IdentifierField(label=_("Tool"), max_length=150)


class BulkPreviewForm(forms.Form):
    """The console's bulk action form (approvals/bulk_views.py): the same checks as the API's
    BulkPreviewIn before approvals/bulk.py sees the values (which checks them again, with the
    filters' and the action's own rules)."""

    action = forms.CharField(required=False, max_length=50)
    workflow = IdentifierField(label=_("Workflow"), required=False, max_length=100)
    step = IdentifierField(label=_("Step"), required=False, max_length=100)
    tool = IdentifierField(label=_("Tool"), required=False, max_length=200)
    reason = forms.CharField(label=_("Failure class"), required=False, max_length=50)
    queue = IdentifierField(label=_("Queue"), required=False, max_length=100)
    status = forms.CharField(label=_("Status"), required=False, max_length=50)
    owner = forms.CharField(label=_("Owner"), required=False, max_length=50)
    date_from = DayField(label=_("Started from"), required=False)
    date_to = DayField(label=_("Started to"), required=False)
    comment = TextField(label=_("Comment"), required=False, max_length=4000)
    needed_engineer = forms.CharField(required=False, max_length=10)
    to = IdentifierField(label=_("Reassign to (username)"), required=False, max_length=150)
    to_queue = IdentifierField(label=_("or to the queue"), required=False, max_length=100)
    # Also act on runs someone else said they are handling (their soft claim).
    despite_claims = forms.BooleanField(required=False)
    # Runs picked in a list (their ids, comma-separated; approvals/bulk.py checks each).
    runs = forms.CharField(label=_("Picked runs"), required=False, max_length=40_000)

    FILTERS = ("workflow", "step", "tool", "reason", "queue", "status", "owner", "runs")

    def filters(self) -> dict[str, str]:
        data = self.cleaned_data
        found = {name: data[name] for name in self.FILTERS}
        for name in ("date_from", "date_to"):
            found[name] = data[name].isoformat() if data[name] else ""
        return found

    def params(self) -> dict:
        names = ("comment", "needed_engineer", "to", "to_queue", "despite_claims")
        return {k: self.cleaned_data[k] for k in names}

"""Console forms: inbox and run-list filters, and one form per human action.

Every action form carries the run's lock_version as `expected_version`, so a stale page or a
double submit loses cleanly in approvals/actions.py.
"""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.utils.translation import gettext_lazy as _

from approvals.console import REASON_LABELS, RUN_STATUS_LABELS
from approvals.models import known_queues
from approvals.params import InvalidParams, validate_params
from runs import tools as tool_registry
from runs.invisible import neutralise

MAX_JSON_CHARS = 256 * 1024


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
    date_from = forms.DateField(
        label=_("Started from"), required=False, widget=forms.DateInput(attrs={"type": "date"})
    )
    date_to = forms.DateField(
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
    to = forms.CharField(label=_("Or to the person (username)"), required=False, max_length=150)

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
    result = forms.CharField(
        label=_("Result (JSON)"),
        widget=forms.Textarea(attrs={"rows": 4, "spellcheck": "false"}),
        error_messages={"required": _('Give the step\'s result as JSON, e.g. {"id": "…"}.')},
    )

    def clean_result(self):
        text = self.cleaned_data["result"]
        if len(text) > MAX_JSON_CHARS:
            raise forms.ValidationError(_("The result is too large (256 KiB at most)."))
        try:
            return json.loads(text)
        except ValueError as exc:
            raise forms.ValidationError(
                _("This is not valid JSON: %(error)s"), params={"error": str(exc)}
            ) from None


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
        return forms.CharField(max_length=MAX_JSON_CHARS, strip=False, widget=widget, **common)
    return forms.JSONField(widget=forms.Textarea(attrs={"rows": 3}), **common)


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
            self.fields["params_json"] = forms.JSONField(
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

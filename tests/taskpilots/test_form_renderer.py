"""The project's form renderer (taskpilots/forms.py) inlines Django's widget templates: every
form the console and admin render, and every widget it inlines, comes out exactly as Django's
own renderer writes it — escaping included."""

from __future__ import annotations

import pytest
from django import forms
from django.forms.renderers import DjangoTemplates, get_default_renderer

from approvals import rules
from approvals.audit_views import AuditSearchForm
from approvals.forms import ActionForm, InboxFilterForm, RunSearchForm
from approvals.notifications import ChannelForm
from approvals.tool_metadata import MetadataForm
from runs.api.admin import ApiClientForm
from taskpilots.forms import FormRenderer

HOSTILE = '"><script>alert(1)</script>&amp;\u202e'


def both(form_class, **kwargs) -> tuple[str, str]:
    ours = form_class(renderer=FormRenderer(), **kwargs)
    django_s = form_class(renderer=DjangoTemplates(), **kwargs)
    return str(ours), str(django_s)


def test_the_project_renders_forms_with_it():
    assert isinstance(get_default_renderer(), FormRenderer)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "form_class",
    [
        AuditSearchForm,
        ActionForm,
        InboxFilterForm,
        RunSearchForm,
        ChannelForm,
        rules.RuleForm,
        rules.TesterForm,
        MetadataForm,
        ApiClientForm,
    ],
)
def test_every_project_form_renders_as_django_does(form_class):
    ours, theirs = both(form_class)
    assert ours == theirs
    # Bound to hostile input: the values and errors come out the same, escaped the same.
    data = dict.fromkeys(form_class.base_fields, HOSTILE)
    ours, theirs = both(form_class, data=data)
    assert ours == theirs
    assert "<script>" not in ours


class EveryWidget(forms.Form):
    text = forms.CharField(initial=HOSTILE, widget=forms.TextInput(attrs={"autofocus": True}))
    hidden = forms.CharField(initial=HOSTILE, widget=forms.HiddenInput)
    number = forms.IntegerField(initial=7, widget=forms.NumberInput(attrs={"disabled": False}))
    email = forms.EmailField(widget=forms.EmailInput(attrs={"placeholder": HOSTILE}))
    url = forms.URLField()
    password = forms.CharField(widget=forms.PasswordInput(render_value=True), initial=HOSTILE)
    checked = forms.BooleanField(initial=True)
    date = forms.DateField(widget=forms.DateInput(attrs={"type": "date"}))
    area = forms.CharField(initial=HOSTILE, widget=forms.Textarea(attrs={"rows": 3}))
    file = forms.FileField()
    choice = forms.ChoiceField(
        choices=[("", "none"), (HOSTILE, HOSTILE), ("group", [("a", "A <b>"), ("b", "B")])],
        initial=HOSTILE,
    )
    many = forms.MultipleChoiceField(choices=[("x", "X"), ("y", "Y")], initial=["y"])
    radio = forms.ChoiceField(choices=[("x", "X"), ("y", "Y")], widget=forms.RadioSelect)
    boxes = forms.MultipleChoiceField(
        choices=[("x", "X")], widget=forms.CheckboxSelectMultiple, initial=["x"]
    )
    when = forms.SplitDateTimeField()


def test_every_widget_renders_as_django_does():
    ours, theirs = both(EveryWidget)
    assert ours == theirs
    assert "&lt;script&gt;" in ours and "<script>" not in ours
    ours, theirs = both(EveryWidget, data={"text": HOSTILE, "choice": "a", "many": ["x", "y"]})
    assert ours == theirs


def test_the_inlined_templates_are_the_ones_used():
    # A lookup per widget, not per include: a text input and a select are one template each.
    renderer = FormRenderer()
    for name in ("text", "hidden", "checkbox", "number"):
        template = renderer.get_template(f"django/forms/widgets/{name}.html")
        assert "taskpilots/form_templates" in template.origin.name
        assert "include" not in template.template.source
    select = renderer.get_template("django/forms/widgets/select.html")
    assert "taskpilots/form_templates" in select.origin.name

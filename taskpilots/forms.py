"""The project's form renderer: Django's widget templates with their includes written inline.

Django renders every widget through a chain of small templates — a text or hidden input
includes input.html, which includes attrs.html; a select includes select_option.html for each
option, which includes attrs.html again. Each include is a template lookup and a new context
layer, so a form of a few fields costs milliseconds (the tools page renders one per tool). The
templates in taskpilots/form_templates are the same markup with the includes inlined; every
other widget template is Django's own (tests/taskpilots/test_form_renderer.py renders the
project's forms and every input widget through both and requires the same HTML).
"""

from __future__ import annotations

from pathlib import Path

import django.forms
from django.forms.renderers import DjangoTemplates
from django.utils.functional import cached_property

_INPUT = "django/forms/widgets/input.html"
# The widgets whose template is only `{% include "django/forms/widgets/input.html" %}`.
_INPUT_ALIASES = {
    f"django/forms/widgets/{name}.html": _INPUT
    for name in (
        "checkbox",
        "color",
        "date",
        "datetime",
        "email",
        "file",
        "hidden",
        "number",
        "password",
        "search",
        "tel",
        "text",
        "time",
        "url",
    )
}


class FormRenderer(DjangoTemplates):
    def get_template(self, template_name):
        return super().get_template(_INPUT_ALIASES.get(template_name, template_name))

    @cached_property
    def engine(self):
        return self.backend(
            {
                "APP_DIRS": True,
                "DIRS": [
                    Path(__file__).parent / "form_templates",
                    Path(django.forms.__file__).parent / "templates",
                ],
                "NAME": "taskpilots-forms",
                "OPTIONS": {},
            }
        )

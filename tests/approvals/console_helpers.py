"""Real paused runs for the console tests, made by the engine from the test workflows."""

from __future__ import annotations

import html
import re

import pytest

from runs import engine
from runs.models import Run

REFUND = ("test.refund", {"amount": 150, "payment": "pay_1"})
LEAD = ("test.lead", {"email": "lee@example.com", "name": "Lee"})
REPLY = ("test.reply", {"message": "Where is my refund?", "email": "ann@example.com",
                        "ticket": "T-1"})  # fmt: skip


def start(workflow: str, input: dict, **kw) -> Run:
    run, _ = engine.start_run(workflow, input, **kw)
    return engine.run_until_quiet(run.pk)


def approval_run(**input) -> Run:
    """A refund waiting for approval."""
    return start("test.refund", {"amount": 150, "payment": "pay_1", **input})


def unknown_outcome_run(sandbox) -> Run:
    """A CRM create that committed, then answered 500: nobody knows whether it happened."""
    sandbox.inject("crm", "commit_then_500", action="create")
    return start(*LEAD)


def invalid_data_run() -> Run:
    """tickets.update answers 422 for an empty ticket id: a person must fix the data."""
    return start("test.reply", {**REPLY[1], "ticket": ""})


def visible_text(response) -> str:
    """The page as a person reads it: tags dropped (untrusted values sit in <bdi>), entities
    decoded, whitespace collapsed."""
    text = re.sub(r"</(dt|dd|td|th|li|p|div|h[1-6])>", " ", response.content.decode())
    text = re.sub(r"<[^>]+>", "", text)
    return re.sub(r"\s+", " ", html.unescape(text))


def fresh(run: Run) -> Run:
    return Run.objects.get(pk=run.pk)


@pytest.fixture(autouse=True)
def fast_passwords(settings):
    """Persona fixtures hash a password; the production hasher costs ~0.6 s per user."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

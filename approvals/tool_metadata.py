"""The tools page's metadata section: per tool, what its code says, what its MCP server's
annotations say, the local decision in force and its history, and the admin's form to change or
clear that decision (approvals.models.ToolMetadataOverride; the engine reads it through
approvals.local_metadata).

What an admin may decide, and what needs confirming. The risk, whether the tool has a side
effect, and whether it dedupes by key. A change that makes the engine more careful is saved as
given. One that makes it less careful than what is in force — a side effect treated as a read,
a tool said to dedupe by key, a lower risk, also by clearing a stricter decision — is refused
with what it would do until the admin ticks the confirmation; the row records that it was
confirmed (`loosened`). Everything else about a tool (lookup, verification, compensation,
fallback) stays code.
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass, field
from typing import Any

from django import forms
from django.db.models import F, Window
from django.db.models.functions import RowNumber
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from approvals import local_metadata, rules
from approvals.console import RISK_LABELS
from approvals.models import (
    OVERRIDABLE,
    MetadataLoosened,
    ToolMetadataOverride,
    metadata_of,
)
from approvals.viewer_time import format_timestamp
from runs import tools as tool_registry
from runs.models import Risk

# History rows shown per tool (the newest first); older ones are in the Django admin.
HISTORY_SHOWN = 10

FIELD_LABELS = {
    "risk": gettext_lazy("Risk"),
    "side_effect": gettext_lazy("Side effect"),
    "dedupes_by_key": gettext_lazy("Dedupes by key"),
}
CHOICE_VALUES = {"": None, "true": True, "false": False}


class MetadataRefused(ValueError):
    """The decision cannot be made (an unknown tool); nothing was written."""


def shown_value(name: str, value: Any) -> str:
    """A metadata value as the page says it."""
    if value is None or value == "":
        return "—"
    if name == "risk":
        return str(RISK_LABELS.get(value, value))
    if name == "side_effect":
        return _("side effect") if value else _("read")
    return _("yes") if value else _("no")


def anchor_of(tool_name: str) -> str:
    """A stable element id for a tool's entry (tool names are not ids)."""
    return "tool-meta-" + hashlib.sha256(tool_name.encode()).hexdigest()[:12]


# --------------------------------------------------------------------------------------------
# The form


class MetadataForm(forms.Form):
    tool = forms.CharField(max_length=150, widget=forms.HiddenInput)
    # The id of the decision the form showed (0: none), so a stale form loses cleanly.
    expected = forms.IntegerField(min_value=0, required=False, widget=forms.HiddenInput)
    risk = forms.ChoiceField(label=FIELD_LABELS["risk"], required=False)
    side_effect = forms.ChoiceField(label=FIELD_LABELS["side_effect"], required=False)
    dedupes_by_key = forms.ChoiceField(label=FIELD_LABELS["dedupes_by_key"], required=False)
    reason = forms.CharField(
        label=gettext_lazy("Why"),
        max_length=2000,
        error_messages={"required": gettext_lazy("Say why; the history keeps it.")},
    )
    confirm = forms.BooleanField(
        label=gettext_lazy("I understand: the engine will be less careful with this tool"),
        required=False,
    )
    # The button pressed; "clear": back to the tool's own metadata, whatever the fields say.
    do = forms.ChoiceField(
        choices=[("save", "save"), ("clear", "clear")], required=False, widget=forms.HiddenInput
    )

    def __init__(self, *args, own: tool_registry.Tool | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        said = metadata_of(own) if own is not None else {}

        def keep(name: str) -> str:
            if name not in said:
                return _("As the tool says")
            return _("As the tool says (%(value)s)") % {"value": shown_value(name, said[name])}

        self.fields["risk"].choices = [("", keep("risk"))] + list(Risk.choices)
        self.fields["side_effect"].choices = [
            ("", keep("side_effect")),
            ("true", _("Side effect: snapshot and key before every call")),
            ("false", _("Read: no side effect")),
        ]
        self.fields["dedupes_by_key"].choices = [
            ("", keep("dedupes_by_key")),
            ("true", _("Dedupes by key: safe to send again under the same key")),
            ("false", _("Does not dedupe: an unknown outcome goes to a person")),
        ]

    def decision(self) -> dict[str, Any]:
        """The cleaned decision as ToolMetadataOverride.decide takes it."""
        data = self.cleaned_data
        clear = data.get("do") == "clear"
        return {
            "risk": "" if clear else data.get("risk", ""),
            "side_effect": None if clear else CHOICE_VALUES[data.get("side_effect", "")],
            "dedupes_by_key": None if clear else CHOICE_VALUES[data.get("dedupes_by_key", "")],
            "expected": data.get("expected"),
            "confirmed": bool(data.get("confirm")),
        }


def initial_for(tool_name: str, current: ToolMetadataOverride | None) -> dict[str, Any]:
    def choice(value: bool | None) -> str:
        return "" if value is None else ("true" if value else "false")

    return {
        "tool": tool_name,
        "expected": current.pk if current else 0,
        "risk": current.risk if current else "",
        "side_effect": choice(current.side_effect if current else None),
        "dedupes_by_key": choice(current.dedupes_by_key if current else None),
    }


def form_for(tool_name: str, own, current=None, *, data=None) -> MetadataForm:
    """The form of one tool's entry: showing the decision in force, or as posted (`data`)."""
    return MetadataForm(
        data,
        own=own,
        initial=initial_for(tool_name, current),
        auto_id=anchor_of(tool_name) + "-%s",
    )


# --------------------------------------------------------------------------------------------
# Saving


def registered(tool_name: str) -> tool_registry.Tool:
    """The tool as its code registered it; MetadataRefused (with suggestions) if unknown."""
    try:
        return tool_registry.registered(tool_name)
    except tool_registry.UnknownTool:
        raise MetadataRefused(
            _("No tool is called “%(name)s”. %(hint)s")
            % {"name": tool_name, "hint": rules._suggest(tool_name, rules.known_tools())}
        ) from None


def decide(form: MetadataForm, user) -> tuple[ToolMetadataOverride | None, bool]:
    """Save a valid form's decision (ToolMetadataOverride.decide: conflicts, repeats and
    unconfirmed loosening are refused there, under its lock)."""
    tool = registered(form.cleaned_data["tool"])
    return ToolMetadataOverride.decide(tool, user, form.cleaned_data["reason"], **form.decision())


def loosening_warnings(tool_name: str, refused: MetadataLoosened) -> list[str]:
    """What an unconfirmed, less careful change would do, field by field."""
    texts = []
    for name in refused.fields:
        if name == "side_effect":
            texts.append(
                _(
                    "%(tool)s would be called as a read: no snapshot, no idempotency key and no "
                    "ledger row before its calls, and a failed call is retried as a read, so a "
                    "call that did write can happen twice. Agents call it as a read; workflow "
                    "steps declared as side effects refuse to call it (invalid input, for a "
                    "person)."
                )
                % {"tool": tool_name}
            )
        elif name == "dedupes_by_key":
            texts.append(
                _(
                    "Whenever the outcome of a call to %(tool)s is unknown, the engine would "
                    "send it again under the same idempotency key. If the system behind it "
                    "does not honour the key, that call happens twice."
                )
                % {"tool": tool_name}
            )
        else:
            texts.append(
                _(
                    "The risk of %(tool)s would go down from %(before)s to %(after)s: "
                    "escalation rules for the higher risk stop matching its failures, and "
                    "approvals of its calls show the lower risk."
                )
                % {
                    "tool": tool_name,
                    "before": shown_value("risk", refused.before.get("risk")),
                    "after": shown_value("risk", refused.after.get("risk")),
                }
            )
    return texts


def conflict_message(tool_name: str, current: ToolMetadataOverride | None) -> str:
    if current is None:
        return _(
            "Someone else changed the metadata of %(tool)s first. This is what is in force "
            "now; make your decision again if it still applies."
        ) % {"tool": tool_name}
    return _(
        "Someone else changed the metadata of %(tool)s first: %(user)s at %(when)s. This is "
        "what is in force now; make your decision again if it still applies."
    ) % {
        "tool": tool_name,
        "user": current.changed_by.get_username(),
        "when": format_timestamp(current.changed_at),
    }


def saved_message(tool_name: str, decision: ToolMetadataOverride | None, changed: bool) -> str:
    if not changed:
        return _("Nothing changed.")
    seconds = f"{local_metadata.REFRESH_SECONDS:g}"
    if decision is None or decision.clears:
        return _(
            "%(tool)s is back to its own metadata. Steps use it from now on in this process, "
            "and in every worker within %(seconds)s s."
        ) % {"tool": tool_name, "seconds": seconds}
    return _(
        "The decision over %(tool)s is saved. Steps use it from now on in this process, and "
        "in every worker within %(seconds)s s."
    ) % {"tool": tool_name, "seconds": seconds}


# --------------------------------------------------------------------------------------------
# What the page shows


@dataclass
class Entry:
    """One tool's metadata on the page."""

    name: str
    anchor: str
    own: tool_registry.Tool | None  # None: not registered in this process
    tool: tool_registry.Tool | None  # as the engine sees it now
    decision: ToolMetadataOverride | None  # in force (never a clear)
    history: list[ToolMetadataOverride]
    more_history: bool
    form: MetadataForm | None
    fields: list[dict[str, Any]] = field(default_factory=list)
    mcp: dict[str, Any] | None = None
    open: bool = False
    error: str = ""
    success: str = ""
    warnings: list[str] = field(default_factory=list)


def _mcp_of(own: tool_registry.Tool) -> dict[str, Any] | None:
    server, mcp_name = getattr(own, "server", ""), getattr(own, "mcp_name", "")
    if not server and not mcp_name:
        return None
    annotations = getattr(own, "annotations", None)
    shown = None
    implied = None
    if isinstance(annotations, dict):
        shown = [
            (str(key), value if isinstance(value, str) else json.dumps(value))
            for key, value in sorted(annotations.items(), key=lambda item: str(item[0]))
        ]
        mcp = sys.modules.get("runs.agents.mcp")  # loaded wherever an MCP tool was made
        if mcp is not None:
            implied = [
                (FIELD_LABELS[name], shown_value(name, value))
                for name, value in mcp.metadata_from_annotations(annotations).items()
                if name in FIELD_LABELS
            ]
    return {"server": server, "name": mcp_name, "annotations": shown, "implied": implied}


def _fields(own, tool, decision) -> list[dict[str, Any]]:
    decided = decision.overrides() if decision else {}
    return [
        {
            "label": FIELD_LABELS[name],
            "own": shown_value(name, getattr(own, name)),
            "in_force": shown_value(name, getattr(tool, name)),
            "decided": name in decided,
        }
        for name in OVERRIDABLE
    ]


def _histories() -> dict[str, list[ToolMetadataOverride]]:
    """Every tool's newest HISTORY_SHOWN + 1 rows, in one query."""
    ranked = (
        ToolMetadataOverride.objects.annotate(
            newest=Window(RowNumber(), partition_by=[F("tool")], order_by=F("id").desc())
        )
        .filter(newest__lte=HISTORY_SHOWN + 1)
        .select_related("changed_by")
        .order_by("tool", "-id")
    )
    found: dict[str, list[ToolMetadataOverride]] = {}
    for row in ranked:
        row.shown_changes = [
            (FIELD_LABELS[name], shown_value(name, before), shown_value(name, after))
            for name, before, after in row.changes
        ]
        row.shown_loosened = [str(FIELD_LABELS.get(name, name)) for name in row.loosened]
        found.setdefault(row.tool, []).append(row)
    return found


def entries(
    *,
    bound: MetadataForm | None = None,
    focus: str = "",
    error: str = "",
    success: str = "",
    warnings: list[str] | None = None,
) -> list[Entry]:
    """Every registered tool's entry, then those of tools with a decision in force that this
    process does not register. `focus` is the tool the admin just acted on: its entry is open,
    with `bound` (the form as posted, on an error), the outcome and any warnings."""
    histories = _histories()
    found = []
    for name, tool in sorted(tool_registry.all_tools().items()):
        own = tool_registry.registered(name)
        history = histories.pop(name, [])
        newest = history[0] if history else None
        decision = newest if newest is not None and not newest.clears else None
        form = bound if bound is not None and name == focus else form_for(name, own, newest)
        entry = Entry(
            name=name,
            anchor=anchor_of(name),
            own=own,
            tool=tool,
            decision=decision,
            history=history[:HISTORY_SHOWN],
            more_history=len(history) > HISTORY_SHOWN,
            form=form,
            fields=_fields(own, tool, decision),
            mcp=_mcp_of(own),
        )
        found.append(entry)
    for name, history in sorted(histories.items()):
        if history[0].clears:
            continue
        found.append(
            Entry(
                name=name,
                anchor=anchor_of(name),
                own=None,
                tool=None,
                decision=history[0],
                history=history[:HISTORY_SHOWN],
                more_history=len(history) > HISTORY_SHOWN,
                form=None,
            )
        )
    for entry in found:
        if entry.name == focus:
            entry.open, entry.error, entry.success = True, error, success
            entry.warnings = list(warnings or [])
    return found


def page_context(**focus: Any) -> dict[str, Any]:
    """The whole tools page: pauses (approvals.rules.tool_rows) and metadata. The decisions
    are read first, in one statement, so the page shows what the engine now uses in this
    process and costs the same number of queries whenever it is opened."""
    local_metadata.CACHE.refresh(here=True)
    rows = rules.tool_rows()
    metadata = entries(**focus)
    decided = {entry.name for entry in metadata if entry.decision is not None}
    for row in rows:
        row["anchor"] = anchor_of(row["tool"].name)
        row["decided"] = row["tool"].name in decided
    return {"rows": rows, "metadata": metadata}

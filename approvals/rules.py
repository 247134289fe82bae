"""Escalation rules for admins: validation with suggestions, the "which rule would match" tester,
versioned changes (every change is a RuleVersion written in its own transaction), and tool pauses.

The engine reads rules from the database at routing time (EscalationRule.first_match), so a saved
change routes the very next failure, in every worker, without a restart.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

from django import forms
from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from approvals.console import FAILURE_LABELS, failure_class_choices
from approvals.models import EscalationRule, RuleChange, RuleVersion, ToolPause
from approvals.viewer_time import format_timestamp
from runs import tools as tool_registry
from runs import workflows as workflow_registry
from runs.invisible import neutralise
from runs.models import FailureClass, Risk, Run, Step, TimelineEvent, Wait
from runs.verbs import Verb

A = EscalationRule.Action


class RuleConflict(Exception):
    """Someone else changed the rule since the form was loaded."""

    def __init__(self, rule: EscalationRule, version: RuleVersion | None):
        self.rule = rule
        self.version = version
        who = version.changed_by.get_username() if version and version.changed_by else "?"
        super().__init__(
            _("Someone else changed this rule first: %(user)s saved version %(version)s.")
            % {"user": who, "version": rule.version}
        )


# --------------------------------------------------------------------------------------------
# Names the deployment knows (for validation and suggestions)


def known_workflows() -> dict[str, set[str]]:
    """Workflow name → the step names declared in any registered version."""
    names: dict[str, set[str]] = {}
    for workflow in workflow_registry.all_workflows():
        names.setdefault(workflow.name, set()).update(s.name for s in workflow.steps)
    return names


def known_tools() -> dict[str, tool_registry.Tool]:
    return tool_registry.all_tools()


def _suggest(name: str, known) -> str:
    close = difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.5)
    listed = ", ".join(sorted(known)[:12]) + ("…" if len(known) > 12 else "")
    if close:
        return _("Did you mean %(close)s? Known: %(known)s.") % {
            "close": " / ".join(close),
            "known": listed,
        }
    return _("Known: %(known)s.") % {"known": listed or "—"}


def _is_known_workflow(name: str) -> bool:
    try:
        workflow_registry.get(name)  # also loads lazily registered workflows
    except workflow_registry.UnknownWorkflow:
        return False
    return True


def _tool(name: str) -> tool_registry.Tool | None:
    try:
        return tool_registry.get(name)
    except tool_registry.UnknownTool:
        return None


# --------------------------------------------------------------------------------------------
# The form


class RuleForm(forms.ModelForm):
    expected_version = forms.IntegerField(widget=forms.HiddenInput, required=False)
    allow_unknown = forms.BooleanField(
        required=False,
        label=gettext_lazy("Save even if a workflow, step or tool name is not known here"),
        help_text=gettext_lazy("For names another deployment or a later release registers."),
    )

    class Meta:
        model = EscalationRule
        fields = [
            "name",
            "position",
            "enabled",
            "workflow",
            "step",
            "tool",
            "failure_class",
            "risk",
            "action",
            "queue",
            "escalate_to",
            "max_attempts",
            "backoff_base_seconds",
            "backoff_cap_seconds",
            "wait_window_seconds",
            "probe_interval_seconds",
            "approval_sla_seconds",
            "escalate_after_seconds",
            "approvers_required",
            "approvers_below",
            "amount_param",
            "amount_above",
            "amount_currency",
            "records_param",
            "records_above",
        ]
        labels = {
            "name": gettext_lazy("Name"),
            "position": gettext_lazy("Position (lower is tried first)"),
            "enabled": gettext_lazy("Enabled"),
            "workflow": gettext_lazy("Workflow"),
            "step": gettext_lazy("Step"),
            "tool": gettext_lazy("Tool"),
            "failure_class": gettext_lazy("Failure class"),
            "risk": gettext_lazy("Risk"),
            "action": gettext_lazy("Action"),
            "queue": gettext_lazy("Queue"),
            "escalate_to": gettext_lazy("Past the SLA, move to queue"),
            "max_attempts": gettext_lazy("Max attempts"),
            "backoff_base_seconds": gettext_lazy("Backoff base (s)"),
            "backoff_cap_seconds": gettext_lazy("Backoff cap (s)"),
            "wait_window_seconds": gettext_lazy("Wait window (s)"),
            "probe_interval_seconds": gettext_lazy("Probe interval (s)"),
            "approval_sla_seconds": gettext_lazy("SLA for a person (s)"),
            "escalate_after_seconds": gettext_lazy("SLA in the next queue (s, 0 = none)"),
            "approvers_required": gettext_lazy("Approvers needed (1 or 2)"),
            "approvers_below": gettext_lazy("Approvers at or below the threshold (0 or 1)"),
            "amount_param": gettext_lazy("Threshold: the amount in parameter…"),
            "amount_above": gettext_lazy("…is above"),
            "amount_currency": gettext_lazy("…in currency (ISO code)"),
            "records_param": gettext_lazy("Threshold: the records in parameter…"),
            "records_above": gettext_lazy("…are more than"),
        }
        help_texts = {
            "approval_sla_seconds": gettext_lazy(
                "How long a person has for an approval or an escalation this rule creates "
                "(0 = no SLA). Past it, the run escalates by the matching “Wait timed out” rule."
            ),
            "action": gettext_lazy(
                "“Ask a person to approve the call” puts every matching call behind approval, "
                "whether or not the workflow asks: high-value, high-risk or many-record writes."
            ),
            "approvers_required": gettext_lazy(
                "2: calls this rule matches need two different people, neither of whom "
                "started or took over the run."
            ),
            "approvers_below": gettext_lazy(
                "With a threshold: how many approve a call at or below it (0: none, for an "
                "“approve” rule)."
            ),
            "amount_param": gettext_lazy(
                "Optional: empty reads the amount the tool declares (e.g. a refund's amount)."
            ),
            "amount_currency": gettext_lazy(
                "Optional: the threshold's currency; other currencies are converted by "
                "TASKPILOTS_CURRENCY_RATES, and one it cannot convert counts as above."
            ),
            "records_param": gettext_lazy(
                "Optional: empty reads the records the tool declares (a count or a list)."
            ),
            "workflow": gettext_lazy("Empty matches any workflow."),
            "failure_class": gettext_lazy("“Wait timed out” also covers approvals past their SLA."),
        }

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["failure_class"].choices = [("", _("Any"))] + failure_class_choices()
        self.fields["risk"].choices = [("", _("Any"))] + list(Risk.choices)
        # Left out (an older form, a script): the rule keeps what it had (1 for a new rule).
        self.fields["approvers_required"].required = False
        self.fields["approvers_below"].required = False
        self.warnings: list[str] = []
        if self.instance.pk and not self.is_bound:
            self.initial["expected_version"] = self.instance.version

    def clean_backoff_base_seconds(self):
        value = self.cleaned_data["backoff_base_seconds"]
        if value is not None and value <= 0:
            raise forms.ValidationError(_("The backoff base must be more than 0 seconds."))
        return value

    def clean_max_attempts(self):
        value = self.cleaned_data["max_attempts"]
        if value is not None and value < 1:
            raise forms.ValidationError(_("Allow at least 1 attempt."))
        return value

    def clean(self):
        data = super().clean()
        self._check_thresholds(data)
        self._check_names(data)
        self._check_action(data)
        self._check_approvers(data)
        return data

    def _check_approvers(self, data: dict) -> None:
        required = data.get("approvers_required")
        if required is None:
            required = data["approvers_required"] = self.instance.approvers_required
        if required is not None and required not in (1, 2):
            self.add_error("approvers_required", _("An approval needs 1 or 2 approvers."))
            return
        approve = data.get("action") == A.APPROVE
        param, above = (data.get("amount_param") or "").strip(), data.get("amount_above")
        currency = (data.get("amount_currency") or "").strip().upper()
        records, count = (data.get("records_param") or "").strip(), data.get("records_above")
        data.update(amount_param=param, amount_currency=currency, records_param=records)
        if param and above is None:
            self.add_error(
                "amount_above",
                _("Give the amount above which %(param)s needs more approvers.") % {"param": param},
            )
        if above is not None and above < 0:
            self.add_error("amount_above", _("The amount must be 0 or more."))
        if currency and (len(currency) != 3 or not currency.isascii() or not currency.isalpha()):
            self.add_error("amount_currency", _("Give a 3-letter ISO 4217 code, e.g. USD."))
        elif currency and above is None:
            self.add_error("amount_above", _("Give the amount the currency is for."))
        if records and count is None:
            self.add_error(
                "records_above",
                _("Give the number of records above which more approvers are needed."),
            )
        threshold = bool(param) or above is not None or count is not None
        below = data.get("approvers_below")
        if below is None:
            # Left out: none below an "approve" rule's threshold; one below another rule's two.
            below = 0 if approve or not threshold else max(required - 1, 0)
        data["approvers_below"] = below
        if threshold and below >= required:
            self.add_error(
                "approvers_below",
                _("Below the threshold, fewer approvers than above it (0 or 1 with 1, 1 with 2)."),
            )
        if threshold and not approve and required == 1:
            self.add_error(
                "approvers_required",
                _("An amount threshold only makes sense with 2 approvers."),
            )
        if approve and data.get("failure_class"):
            self.add_error(
                "failure_class",
                _("An “approve” rule is about calls, not failures: leave the failure class empty."),
            )

    def _check_thresholds(self, data: dict) -> None:
        base, cap = data.get("backoff_base_seconds"), data.get("backoff_cap_seconds")
        if base is not None and cap is not None and cap < base:
            self.add_error(
                "backoff_cap_seconds",
                _("The backoff cap (%(cap)s s) must be at least the base (%(base)s s).")
                % {"cap": cap, "base": base},
            )
        window, probe = data.get("wait_window_seconds"), data.get("probe_interval_seconds")
        if data.get("action") == A.WAIT and window is not None and probe is not None:
            if probe < 1:
                self.add_error("probe_interval_seconds", _("Probe at least every second."))
            elif probe > window:
                self.add_error(
                    "probe_interval_seconds",
                    _(
                        "The probe interval (%(probe)s s) is longer than the wait window "
                        "(%(window)s s): the tool would never be probed."
                    )
                    % {"probe": probe, "window": window},
                )

    def _check_names(self, data: dict) -> None:
        """Unknown names are usually typos: refused with suggestions, unless the admin ticks
        "save even if not known" (a name another deployment registers)."""
        allow = data.get("allow_unknown")
        problems: list[tuple[str, str]] = []
        workflow, step, tool = data.get("workflow", ""), data.get("step", ""), data.get("tool", "")
        workflows = known_workflows()
        if workflow and not _is_known_workflow(workflow):
            hint = _suggest(workflow, workflows)
            problems.append(
                (
                    "workflow",
                    _("No workflow is called “%(name)s”. %(hint)s")
                    % {"name": workflow, "hint": hint},
                )
            )
        elif workflow and step:
            declared = known_workflows().get(workflow, set())
            if step not in declared:
                problems.append(
                    (
                        "step",
                        _(
                            "%(workflow)s declares no step “%(name)s” (steps "
                            "decided at run time are fine). %(hint)s"
                        )
                        % {"workflow": workflow, "name": step, "hint": _suggest(step, declared)},
                    )
                )
        if tool and _tool(tool) is None:
            problems.append(
                (
                    "tool",
                    _("No tool is called “%(name)s”. %(hint)s")
                    % {"name": tool, "hint": _suggest(tool, known_tools())},
                )
            )
        for field_name, message in problems:
            if allow:
                self.warnings.append(message)
            else:
                self.add_error(field_name, message)

    def _check_action(self, data: dict) -> None:
        action, tool = data.get("action"), data.get("tool", "")
        cls = data.get("failure_class", "")
        if action == A.DEGRADE:
            with_fallback = sorted(
                f"{t.name} → {t.fallback_tool}" for t in known_tools().values() if t.fallback_tool
            )
            listed = ", ".join(with_fallback) or "—"
            found = _tool(tool) if tool else None
            if not tool:
                self.add_error(
                    "tool",
                    _("“Degrade” needs a tool with a fallback. Tools with a fallback: %(tools)s.")
                    % {"tools": listed},
                )
            elif found is not None and not found.fallback_tool:
                self.add_error(
                    "action",
                    _(
                        "%(tool)s has no fallback tool to degrade to. Tools "
                        "with a fallback: %(tools)s."
                    )
                    % {"tool": tool, "tools": listed},
                )
            elif found is not None:
                self._check_fallback(found)
            if cls == FailureClass.UNKNOWN_OUTCOME:
                self.add_error(
                    "failure_class",
                    _(
                        "An unknown outcome cannot degrade: the first call may have landed, "
                        "and the fallback would do it a second time. It always goes to a person."
                    ),
                )
        if cls == FailureClass.TIMEOUT and action in (A.RETRY, A.WAIT, A.DEGRADE):
            self.add_error(
                "action",
                _(
                    "A wait or approval that timed out cannot be retried, "
                    "waited for or degraded: choose escalate, compensate "
                    "or fail."
                ),
            )
        if action in (A.ESCALATE, A.RETRY, A.WAIT, A.DEGRADE) and not data.get("queue"):
            self.add_error("queue", _("Name the queue a person picks this up from."))

    def _check_fallback(self, tool) -> None:
        """The fallback must be able to stand in: registered, and a write for a write (a read
        for a read: a read's fallback must not change anything)."""
        fallback = _tool(tool.fallback_tool)
        if fallback is None:
            self.add_error(
                "action",
                _("%(tool)s's fallback %(fallback)s is not a registered tool.")
                % {"tool": tool.name, "fallback": tool.fallback_tool},
            )
        elif tool.side_effect and not fallback.side_effect:
            self.add_error(
                "action",
                _(
                    "%(tool)s is a side effect but its fallback %(fallback)s is not: the "
                    "fallback could not do the write."
                )
                % {"tool": tool.name, "fallback": fallback.name},
            )
        elif not tool.side_effect and fallback.side_effect:
            self.add_error(
                "action",
                _(
                    "%(tool)s is a read but its fallback %(fallback)s is a side effect: a "
                    "degraded read must not change anything."
                )
                % {"tool": tool.name, "fallback": fallback.name},
            )


# --------------------------------------------------------------------------------------------
# Versioned changes


def _record_version(rule: EscalationRule, change: str, before: dict | None, user) -> RuleVersion:
    return RuleVersion.objects.create(
        rule=rule,
        version=rule.version,
        change=change,
        data=rule.data(),
        before=before,
        changed_by=user,
        changed_at=rule.updated_at,
    )


def _lock(rule_id: int, expected_version: int | None) -> EscalationRule:
    rule = EscalationRule.objects.select_for_update().get(pk=rule_id)
    if expected_version is not None and rule.version != expected_version:
        last = rule.versions.select_related("changed_by").order_by("-version").first()
        raise RuleConflict(rule, last)
    return rule


def save_rule(form: RuleForm, user) -> tuple[EscalationRule, bool]:
    """Create or update a rule and its RuleVersion in one transaction.

    Returns (rule, changed); saving an unchanged form writes no new version.
    """
    with transaction.atomic():
        if form.instance.pk is None:
            rule = form.save(commit=False)
            rule.version = 1
            rule.updated_at = timezone.now()
            rule.save()
            _record_version(rule, RuleChange.CREATED, None, user)
            return rule, True
        current = _lock(form.instance.pk, form.cleaned_data.get("expected_version"))
        before = current.data()
        rule = form.save(commit=False)
        if rule.data() == before:
            return current, False
        rule.version = current.version + 1
        rule.updated_at = timezone.now()
        rule.save()
        _record_version(rule, RuleChange.UPDATED, before, user)
        return rule, True


def _change(rule: EscalationRule, change: str, before: dict, user, **fields: Any) -> None:
    for name, value in fields.items():
        setattr(rule, name, value)
    rule.version += 1
    rule.updated_at = timezone.now()
    rule.save(update_fields=[*fields, "version", "updated_at"])
    _record_version(rule, change, before, user)


def set_enabled(
    rule_id: int, enabled: bool, user, expected_version: int | None = None
) -> EscalationRule:
    with transaction.atomic():
        rule = _lock(rule_id, expected_version)
        if rule.enabled != enabled:  # a repeated POST changes nothing
            change = RuleChange.ENABLED if enabled else RuleChange.DISABLED
            _change(rule, change, rule.data(), user, enabled=enabled)
    return rule


def move_rule(rule_id: int, direction: str, user) -> EscalationRule:
    """Swap the rule with its neighbour in routing order; both get a new version."""
    with transaction.atomic():
        ordered = list(EscalationRule.objects.select_for_update().order_by("position", "id"))
        index = next(i for i, r in enumerate(ordered) if r.pk == rule_id)
        other_index = index - 1 if direction == "up" else index + 1
        rule = ordered[index]
        if not 0 <= other_index < len(ordered):
            return rule
        other = ordered[other_index]
        first, second = (other, rule) if direction == "up" else (rule, other)
        # `first` comes before `second` now; afterwards it must come after it.
        if first.position == second.position:
            new_first, new_second = second.position + 1, first.position
        else:
            new_first, new_second = second.position, first.position
        before_first, before_second = first.data(), second.data()
        _change(first, RuleChange.MOVED, before_first, user, position=new_first)
        _change(second, RuleChange.MOVED, before_second, user, position=new_second)
    return rule


# --------------------------------------------------------------------------------------------
# The tester: which rule would route this failure, and what would happen


@dataclass
class Verdict:
    rule: EscalationRule | None
    sentence: str
    risk: str
    also_matching: list[EscalationRule]


def explain(rule: EscalationRule | None, *, tool: str = "", failure_class: str = "") -> str:
    if rule is None:
        return _("No enabled rule matches: the engine hands the run to the “ops” queue.")
    head = _("Rule #%(position)s “%(name)s” (version %(version)s)") % {
        "position": rule.position,
        "name": rule.name,
        "version": rule.version,
    }
    values = {
        "head": head,
        "queue": rule.queue,
        "attempts": rule.max_attempts,
        "base": f"{rule.backoff_base_seconds:g}",
        "cap": f"{rule.backoff_cap_seconds:g}",
        "window": rule.wait_window_seconds,
        "probe": rule.probe_interval_seconds,
        "tool": tool or _("the tool"),
        "fallback": "",
    }
    if rule.action == A.RETRY:
        text = ngettext(
            "%(head)s retries up to %(attempts)s attempt with exponential backoff from %(base)s s "
            "up to %(cap)s s (with jitter), then hands the run to the “%(queue)s” queue.",
            "%(head)s retries up to %(attempts)s attempts with exponential backoff from "
            "%(base)s s up to %(cap)s s (with jitter), then hands the run to the “%(queue)s” "
            "queue.",
            rule.max_attempts,
        )
    elif rule.action == A.WAIT:
        text = _(
            "%(head)s waits up to %(window)s s for %(tool)s to recover, probing every "
            "%(probe)s s, then hands the run to the “%(queue)s” queue."
        )
    elif rule.action == A.DEGRADE:
        found = _tool(tool or rule.tool)
        values["fallback"] = found.fallback_tool if found and found.fallback_tool else "?"
        text = _(
            "%(head)s answers from the fallback tool %(fallback)s instead (reads only); if "
            "that fails too, it hands the run to the “%(queue)s” queue."
        )
    elif rule.action == A.COMPENSATE:
        text = _(
            "%(head)s undoes the run's committed side effects, newest first, and ends the run."
        )
    elif rule.action == A.FAIL:
        text = _("%(head)s fails the run.")
    elif rule.action == A.APPROVE:
        text = _(
            "%(head)s routes no failure: it puts matching calls behind the approval of people "
            "in the “%(queue)s” queue, before anything is sent."
        )
    elif (failure_class or rule.failure_class) == FailureClass.API_DRIFT:
        # runs.engine.routing: drift on the escalate route pauses the tool instead.
        text = _(
            "%(head)s pauses %(tool)s for every run and tells the “%(queue)s” queue; the "
            "runs go on when an admin resumes the tool."
        )
    else:
        text = _("%(head)s hands the run to the “%(queue)s” queue.")
    text = text % values
    if rule.failure_class in ("", FailureClass.TIMEOUT) and rule.escalate_to:
        text += " " + _("Past its SLA it moves to the “%(to)s” queue.") % {"to": rule.escalate_to}
    return text


def which_rule(*, workflow="", step="", tool="", failure_class="", risk="") -> Verdict:
    """The rule the engine would pick for this failure (the same EscalationRule.first_match),
    plus the later rules that also match (they never fire while the first one does)."""
    if not risk and tool:
        found = _tool(tool)
        risk = found.risk if found else ""
    match = {
        "workflow": workflow,
        "step": step,
        "tool": tool,
        "failure_class": failure_class,
        "risk": risk,
    }
    routing = EscalationRule.objects.filter(enabled=True).exclude(action=A.APPROVE)
    matching = [r for r in routing if r.matches(**match)]
    first = EscalationRule.first_match(**match)
    verdict = explain(first, tool=tool, failure_class=failure_class)
    return Verdict(first, verdict, risk, matching[1:])


# How many recent failing steps the tester's list is drawn from.
RECENT_FAILURES_SCANNED = 500


TESTED_FIELD_LABELS = {
    "workflow": gettext_lazy("workflow"),
    "step": gettext_lazy("step"),
    "tool": gettext_lazy("tool"),
    "failure_class": gettext_lazy("failure class"),
    "risk": gettext_lazy("risk"),
}


def tested(query: dict[str, str]) -> list[tuple[str, str]]:
    """What the tester tried, for the chips under its verdict: field names and class and risk
    values in the reader's language, the rest as given."""
    labels = {"failure_class": FAILURE_LABELS, "risk": dict(Risk.choices)}
    return [
        (str(TESTED_FIELD_LABELS.get(key, key)), str(labels.get(key, {}).get(value, value)))
        for key, value in query.items()
    ]


def recent_failures(limit: int = 20) -> list[Step]:
    """Recent distinct failures for the tester's "pick a past failure": one entry per workflow,
    step, tool and failure class (they route the same way), the newest step standing for it,
    with how often it happened (`times`) among the last RECENT_FAILURES_SCANNED failing steps."""
    steps = (
        Step.objects.exclude(error_class="")
        .select_related("run")
        .only(
            "id",
            "name",
            "tool",
            "error_class",
            "created_at",
            "started_at",
            "finished_at",
            "run__workflow",
            "run__id",
        )
        .order_by("-id")[:RECENT_FAILURES_SCANNED]
    )
    distinct: dict[tuple, Step] = {}
    for step in steps:
        key = (step.run.workflow, step.name, step.tool, step.error_class)
        if key in distinct:
            distinct[key].times += 1
        elif len(distinct) < limit:
            step.times = 1
            distinct[key] = step
    return list(distinct.values())


def _failure_label(step: Step) -> str:
    cls = FAILURE_LABELS.get(step.error_class, step.error_class)
    # When it last failed: its last attempt began then (finished_at is when a person, or a
    # later attempt, resolved it).
    seen = step.started_at or step.created_at
    times = ngettext(
        "%(n)s time, last failed %(when)s", "%(n)s times, last failed %(when)s", step.times
    ) % {
        "n": step.times,
        "when": format_timestamp(seen),
    }
    return neutralise(" · ".join([step.run.workflow, step.name, step.tool or "—", str(cls), times]))


class TesterForm(forms.Form):
    failure = forms.TypedChoiceField(
        label=gettext_lazy("A past failure"), required=False, coerce=int, empty_value=None
    )
    workflow = forms.CharField(label=gettext_lazy("Workflow"), required=False, max_length=100)
    step = forms.CharField(label=gettext_lazy("Step"), required=False, max_length=150)
    tool = forms.CharField(label=gettext_lazy("Tool"), required=False, max_length=150)
    failure_class = forms.ChoiceField(label=gettext_lazy("Failure class"), required=False)
    risk = forms.ChoiceField(label=gettext_lazy("Risk"), required=False)

    def __init__(self, *args, failures: list[Step] = (), **kwargs):
        super().__init__(*args, **kwargs)
        self.failures = {s.pk: s for s in failures}
        self.fields["failure"].choices = [("", _("— or type below —"))] + [
            (s.pk, _failure_label(s)) for s in failures
        ]
        self.fields["failure_class"].choices = [("", _("Any"))] + failure_class_choices()
        self.fields["risk"].choices = [("", _("From the tool"))] + list(Risk.choices)

    def query(self) -> dict[str, str] | None:
        if not self.is_valid():
            return None
        data = self.cleaned_data
        step = self.failures.get(data["failure"]) if data.get("failure") else None
        if step is not None:
            return {
                "workflow": step.run.workflow,
                "step": step.name,
                "tool": step.tool,
                "failure_class": step.error_class,
                "risk": data.get("risk", ""),
            }
        return {
            k: data.get(k, "") or "" for k in ("workflow", "step", "tool", "failure_class", "risk")
        }


# --------------------------------------------------------------------------------------------
# Tool pauses (the circuit breaker)


class PauseError(ValueError):
    pass


def pause_tool(tool: str, user, reason: str) -> tuple[ToolPause, bool]:
    """Open a pause on the tool (steps that would call it wait). Returns (pause, created); an
    already paused tool keeps its pause (a repeated POST changes nothing)."""
    if _tool(tool) is None:
        raise PauseError(
            _("No tool is called “%(name)s”. %(hint)s")
            % {"name": tool, "hint": _suggest(tool, known_tools())}
        )
    if not reason.strip():
        raise PauseError(_("Say why the tool is paused; the people whose runs wait will read it."))
    with transaction.atomic():
        existing = (
            ToolPause.objects.select_for_update().filter(tool=tool, resumed_at__isnull=True).first()
        )
        if existing is not None:
            return existing, False
        return ToolPause.objects.create(tool=tool, reason=reason.strip(), paused_by=user), True


def resume_tool(tool: str, user) -> tuple[ToolPause | None, int]:
    """Close the tool's pause and wake the steps it held.

    1. Lock the open pause.
    2. For every step parked by it: make its probe due now and write `tool.resumed` on the
       run's timeline (same transaction). The sweeper then resumes those runs; the engine checks
       the pause again before the call.
    3. Close the pause (who, when) and seal it (ToolPause.resume).
    Returns (pause, steps woken); (None, 0) when the tool was not paused.
    """
    now = timezone.now()
    with transaction.atomic():
        pause = (
            ToolPause.objects.select_for_update().filter(tool=tool, resumed_at__isnull=True).first()
        )
        if pause is None:
            return None, 0
        held = list(
            Wait.objects.filter(
                kind=Wait.Kind.TOOL_RECOVERY,
                status=Wait.Status.PENDING,
                event_type=tool,
                correlation_key=f"pause:{pause.pk}",
            ).values_list("run_id", "step_id")
        )
        # The lock order: the runs (in one order, so two resumes cannot cross) before steps.
        for run_id in sorted({run_id for run_id, _step_id in held}):
            Run.lock(run_id)
        Step.objects.filter(
            pk__in=[step_id for _run_id, step_id in held], status=Step.Status.WAITING
        ).update(next_attempt_at=now)
        for run_id, _step_id in held:
            TimelineEvent.append(
                run_id,
                Verb.TOOL_RESUMED,
                {"tool": tool, "pause": pause.pk},
                actor=f"user:{user.get_username()}",
            )
        pause.resume(user, now)  # closed and sealed last: the records chain's lock comes last
    return pause, len(held)


def tool_rows() -> list[dict]:
    """Every registered tool with its open pause and how many steps it holds."""
    pauses = {
        p.tool: p
        for p in ToolPause.objects.filter(resumed_at__isnull=True).select_related("paused_by")
    }
    held: dict[str, int] = {}
    for tool_name in Wait.objects.filter(
        kind=Wait.Kind.TOOL_RECOVERY,
        status=Wait.Status.PENDING,
        correlation_key__startswith="pause:",
    ).values_list("event_type", flat=True):
        held[tool_name] = held.get(tool_name, 0) + 1
    rows = []
    for name, tool in sorted(known_tools().items()):
        rows.append({"tool": tool, "pause": pauses.get(name), "held": held.get(name, 0)})
    return rows

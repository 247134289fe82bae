"""The people's side of the gate in front of every side effect (runs.engine.gate): how many
distinct people must approve a call with exactly these parameters, and which decided approvals
may still cover it.

How many (`requirement`):
- at least one when the workflow declared an approval of the tool before the call (its
  approval step), or as many as the rule that approval step goes by asks for these parameters
  (the first matching routing rule, as when the step asked: "two approvers above 1,000");
- as many as the most demanding enabled `approve` rule that matches the call (workflow, step,
  tool, the tool's risk) asks for these parameters — whether or not the workflow declared an
  approval: high-value or high-risk writes and writes touching many records go to a person by
  rule, not only where a workflow author remembered an approval step.

A rule's threshold is measured on the parameters that will be sent, never on earlier ones
(approvals/thresholds.py): the amount in the rule's currency (TASKPILOTS_CURRENCY_RATES
converts; a currency it cannot convert counts as above), the number of records touched (a
count, or the length of a list). A value that cannot be read counts as above: the careful side.

Which approvals cover a call (`grants`): the run's approved requests for the tool, each with the
digest of the parameters it approved and its distinct approvers, that no other step's call has
executed (an approval covers one call, and its retries under the same key).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import connection

from approvals.models import ApprovalRequest, EscalationRule, HumanDecision, RuleAction
from runs.models import SideEffect, digest
from runs.people import Grant, Requirement
from runs.tools import Tool

APPROVE_VERBS = (HumanDecision.Verb.APPROVE, HumanDecision.Verb.APPROVE_WITH_EDITS)

# The rules' stamp (approvals.models.RulesStamp): a new value with every change of any rule.
# The hot path guards its statement on it (runs.engine.inline), so rules this process cached
# are used only while they are still the rules in force. An index lookup, where a digest of
# the rules' rows cost in proportion to the rules, twice in some statements; never NULL (a
# missing row reads '', unlike any stamp), since a NULL would make the guard pass.
RULES_STAMP_SQL = "SELECT coalesce(max(stamp), '') FROM approvals_rulesstamp WHERE id = 1"


# --------------------------------------------------------------------------------------------
# How many people


def _because(rule: EscalationRule, approvers: int) -> dict[str, Any]:
    """Why a rule asks for people, as the approval request keeps it (the run page says which
    rule, in which version, with which threshold)."""
    because = {**rule.describe(), "approvers": approvers}
    if rule.amount_param or rule.amount_above is not None:
        because["amount"] = {
            "param": rule.amount_param,
            "above": str(rule.amount_above) if rule.amount_above is not None else None,
            "currency": rule.amount_currency,
        }
    if rule.records_above is not None:
        because["records"] = {"param": rule.records_param, "above": rule.records_above}
    return because


@dataclass(frozen=True)
class _Rules:
    stamp: str
    rules: tuple[EscalationRule, ...]


_cached: _Rules | None = None


def approve_rules(*, cached: bool = False) -> _Rules:
    """The enabled `approve` rules in order, with the rules' stamp when read: as this
    process last read them when `cached` (no query, once read), else as they are now (one
    query while unchanged)."""
    global _cached
    known = _cached
    if cached and known is not None:
        return known
    with connection.cursor() as cursor:
        cursor.execute(RULES_STAMP_SQL)
        current = cursor.fetchone()[0]
    if known is None or known.stamp != current:
        rules = EscalationRule.objects.filter(enabled=True, action=RuleAction.APPROVE)
        known = _cached = _Rules(current, tuple(rules))
    return known


def rules_seen(stamp: Any) -> None:
    """The rules' stamp as a statement of the engine read it: rules this process
    cached under another stamp are dropped (read again at their next use), so the hot path
    clears calls by the rules of the worker's last statement, and its guard seldom refuses."""
    global _cached
    if _cached is not None and stamp is not None and _cached.stamp != stamp:
        _cached = None


def requirement(
    *,
    workflow: str,
    step: str,
    tool: Tool,
    params: Any,
    declared: str = "",
    cached: bool = False,
) -> Requirement:
    params = params if isinstance(params, dict) else {}
    approvers, reasons, rules = 0, [], []
    queue, sla = "support", 4 * 3600
    if declared:
        rule = EscalationRule.first_match(
            workflow=workflow, step=declared, tool=tool.name, failure_class="", risk=tool.risk
        )
        approvers = max(1, rule.approvers_for(params, tool) if rule is not None else 1)
        reasons.append(f"the workflow asks for approval at {declared}")
        if rule is not None:
            queue, sla = rule.queue, rule.approval_sla_seconds
            if approvers > 1:
                reasons.append(rule.name)
                rules.append(_because(rule, approvers))
    read = approve_rules(cached=cached)
    for rule in read.rules:
        if not rule.matches(
            workflow=workflow, step=step, tool=tool.name, failure_class="", risk=tool.risk
        ):
            continue
        needed = rule.approvers_for(params, tool)
        if needed <= 0:
            continue
        reasons.append(rule.name)
        rules.append(_because(rule, needed))
        if needed > approvers:
            approvers, queue, sla = needed, rule.queue, rule.approval_sla_seconds
    guard = (RULES_STAMP_SQL, read.stamp) if cached else None
    return Requirement(approvers, tuple(reasons), tuple(rules), queue, sla, guard)


# --------------------------------------------------------------------------------------------
# Which approvals cover a call


def approved_params(approval: ApprovalRequest) -> Any:
    """The parameters a decided approval approved (the edited ones when it was edited)."""
    if approval.edited_params is not None:
        return approval.edited_params
    return approval.proposed_params


def approvers_of(approval: ApprovalRequest) -> tuple[str, ...]:
    """The distinct people who approved a decided approval, in order."""
    names: list[str] = []
    for user in (approval.first_approved_by, approval.decided_by):
        if user is not None and user.get_username() not in names:
            names.append(user.get_username())
    return tuple(names)


def grants(run_id: Any, tools: tuple[str, ...], step_id: int) -> list[Grant]:
    approvals = list(
        ApprovalRequest.objects.filter(
            run_id=run_id,
            tool__in=tools,
            status=ApprovalRequest.Status.DECIDED,
            decision__in=[
                ApprovalRequest.Decision.APPROVED,
                ApprovalRequest.Decision.APPROVED_WITH_EDITS,
            ],
        )
        .select_related("decided_by", "first_approved_by", "step")
        .order_by("-decided_at", "-id")
    )
    if not approvals:
        return []
    executed: dict[int, int] = {}  # approval -> the step whose call executed it
    for effect_step, named in (
        SideEffect.objects.filter(run_id=run_id)
        .exclude(status=SideEffect.Status.NOT_COMMITTED)
        .values_list("step_id", "snapshot__human_decision")
    ):
        if isinstance(named, dict) and isinstance(named.get("approval"), int):
            executed.setdefault(named["approval"], effect_step)
    decisions = {
        d.approval_id: d
        for d in HumanDecision.objects.filter(
            approval__in=[a.pk for a in approvals], verb__in=APPROVE_VERBS
        )
        .select_related("user")
        .order_by("id")
    }
    found = []
    for approval in approvals:
        if approval.step.kind != "approval" and approval.step_id != step_id:
            continue  # asked by the gate for another step's call
        if executed.get(approval.pk, step_id) != step_id:
            continue  # another step's call executed it
        decision = decisions.get(approval.pk)
        reference = decision.reference() if decision is not None else {}
        found.append(
            Grant(
                approval=approval.pk,
                params=approved_params(approval),
                params_digest=digest(approved_params(approval)),
                approvers=approvers_of(approval),
                decision=reference,
                conditions=tuple(approval.conditions or ()),
                by=approval.decided_by.get_username() if approval.decided_by else "",
            )
        )
    return found

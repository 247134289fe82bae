"""The one gate in front of every side effect.

Whatever path leads to a call — the first execution, an approval with edits, a retry with
edited parameters, a bulk retry, a resume after a takeover, the API — the call meets this check
where its intent is written (runs.engine.ledger.write_intent, and the hot path's statement that
writes the intent with the claim, runs.engine.inline):

1. How many distinct people must approve a call of this tool with exactly these parameters
   (`people().requirement`): the workflow's own approval of the tool, and the approval rules,
   evaluated on the parameters that will be sent.
2. None: the call goes ahead.
3. Otherwise an approval in force must cover it: decided, for this tool, for exactly these
   parameters (their digest), by at least that many distinct authenticated people, and not
   executed by another step's call (`people().grants`). The snapshot names it, with who
   approved and how many were required, so an auditor can check the coverage offline.
4. No such approval: nothing is written and nothing is called; the step goes to a person for
   approval of what will actually be sent (an AskApproval outcome on the step itself). Once
   they approve, the step runs again with the approved parameters and meets this gate again.

The console, the API and bulk actions never decide this: they record decisions; this gate reads
them. approvals/gate.py is the people's side (rules, currencies, which approvals exist).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.utils import timezone

from runs.engine.claim import Claim
from runs.engine.outcomes import AskApproval
from runs.models import Step, StepKind, digest, shown
from runs.people import Approval, Grant, Requirement, people
from runs.tools import Tool


@dataclass(frozen=True)
class Cleared:
    """The call may be made: nothing asks for approval, or `grant` covers it."""

    requirement: Requirement
    grant: Grant | None = None

    def decision(self) -> dict:
        """What the snapshot names: the decision executed, the approval, who approved which
        parameters, and how many people the rules required (verify_audit checks it)."""
        if self.grant is None:
            return {}
        return {
            **self.grant.decision,
            "approval": self.grant.approval,
            "approvers": list(self.grant.approvers),
            "params_digest": self.grant.params_digest,
            **self.requirement.record(),
            **({"conditions": list(self.grant.conditions)} if self.grant.conditions else {}),
        }


def tools_of(tool: Tool, fallback_of: str = "") -> tuple[str, ...]:
    """The tools an approval of this call may name: the tool, and the one it stands in for."""
    return (tool.name, fallback_of) if fallback_of else (tool.name,)


def declared_approval(claim: Claim, tools: tuple[str, ...]) -> str:
    """The approval step by which the workflow put this call behind a person: the latest
    approval step of the tool before this step — unless it found no approval needed (its
    `when`), recorded by the engine itself. "" when there is none."""
    position = claim.step.position
    for earlier in sorted(claim.steps, key=lambda s: s.position, reverse=True):
        if earlier.position >= position or earlier.kind != StepKind.APPROVAL:
            continue
        if earlier.tool not in tools:
            continue
        result = earlier.result if isinstance(earlier.result, dict) else {}
        if earlier.status in Step.DONE and result.get("decision") == "not_required":
            return ""
        return earlier.name
    return ""


def requirement(
    claim: Claim, tool: Tool, params: dict, *, fallback_of: str = "", cached: bool = False
) -> Requirement:
    if claim.step.spec.get("compensates"):
        # Undoing a committed effect (a person's reject or cancel, or a rule, started it):
        # asking for approval to undo would leave in place what the run must take back.
        return Requirement()
    return people().requirement(
        workflow=claim.run.workflow,
        step=claim.step.name,
        tool=tool,
        params=params,
        declared=declared_approval(claim, tools_of(tool, fallback_of)),
        cached=cached,
    )


def cleared_by_cached_rules(claim: Claim, tool: Tool, params: dict) -> Requirement | None:
    """The hot path's question, without a query: the requirement by the rules as this process
    last read them when it asks for nobody — the statement that writes the intent must then
    check its `guard` (those are still the rules in force). None: the gate decides on the
    ordinary path, under the run's lock."""
    if declared_approval(claim, tools_of(tool)):
        return None
    need = requirement(claim, tool, params, cached=True)
    return need if need.approvers == 0 else None


def check(claim: Claim, tool: Tool, params: dict, *, fallback_of: str = ""):
    """Cleared, or the AskApproval outcome that hands the call to a person (see the module
    docstring). Called in the transaction that writes the intent, under the run's lock."""
    need = requirement(claim, tool, params, fallback_of=fallback_of)
    if need.approvers == 0:
        return Cleared(need)
    wanted = digest(params)
    earlier = people().grants(claim.run.pk, tools_of(tool, fallback_of), claim.step.pk)
    for grant in earlier:
        if grant.params_digest == wanted and len(grant.approvers) >= need.approvers:
            return Cleared(need, grant)
    return AskApproval(
        Approval(
            queue=need.queue,
            reason=_why(tool, need, params, earlier),
            risk=tool.risk,
            tool=tool.name,
            proposed_params=params,
            due_at=timezone.now() + timedelta(seconds=need.sla_seconds)
            if need.sla_seconds
            else None,
            approvals_required=need.approvers,
            because=need.rules,
        )
    )


def _why(tool: Tool, need: Requirement, params: dict, earlier: list[Grant]) -> str:
    people_needed = "one person" if need.approvers == 1 else f"{need.approvers} different people"
    because = "; ".join(need.reasons)
    wanted = digest(params)
    same = [g for g in earlier if g.params_digest == wanted]
    if same:
        what = f"only {', '.join(same[0].approvers)} approved them"
    elif earlier:
        what = (
            f"they differ from what {', '.join(earlier[0].approvers)} approved: "
            + params_change(earlier[0].params, params)
        )
    else:
        what = "nobody has approved them yet"
    return (
        f"{tool.name} is called only once {people_needed} approve exactly these parameters "
        f"({because}); {what}."
    )[:2000]


def params_change(before, after) -> str:
    """What changed between two sets of parameters: "amount 240 → 200, currency …"."""
    before = before if isinstance(before, dict) else {}
    changed = [
        f"{name} {shown(before.get(name), 40)} → {shown(after.get(name), 40)}"
        for name in sorted(set(before) | set(after))
        if before.get(name) != after.get(name)
    ]
    return ", ".join(changed[:5]) + (", …" if len(changed) > 5 else "")

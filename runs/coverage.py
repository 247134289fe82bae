"""Approval coverage, proved from a run's timeline alone (verify_audit, in the database and on an
export): every committed side effect that the workflow or a rule put behind approval names the
approval that covered exactly its parameters, and that approval's own events — in the same hash
chain — show it approved those parameters (their digest) by at least the number of distinct
people the call required.

What the chain holds for this (runs.engine.gate writes it):
- `approval.requested` — a person was asked (by the workflow's approval step, or by the gate for
  a call: then it carries `routing`);
- `approval.first_approved` / `approval.approved` / `approval.approved_with_edits` — who
  approved which parameters (`params`), the first approver of two named on the second's event;
- `snapshot.written` — for a call the gate cleared by an approval, its `approval`: the approval,
  the digest of the parameters it was cleared for, the approvers and how many were required;
- `side_effect.committed` — the call happened.

What is named: a call committed under an approval the timeline does not show approved; one whose
parameters are not those approved; one with fewer distinct approvers than it required; and one
committed right after the workflow asked a person about its tool, without any approval.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from runs.models import digest

APPROVED = ("approval.approved", "approval.approved_with_edits")


@dataclass
class _Approval:
    tool: str = ""
    decided: bool = False
    params_digest: str = ""
    approvers: set[str] = field(default_factory=set)


@dataclass
class Coverage:
    """Feed one run's events in order (`feed`), then read `problems`: (seq, message)."""

    problems: list[tuple[int, str]] = field(default_factory=list)
    checked: int = 0
    _approvals: dict[int, _Approval] = field(default_factory=dict)
    _snapshots: dict[str, dict] = field(default_factory=dict)
    # Tools the workflow asked a person about since their last committed call.
    _asked: dict[str, int] = field(default_factory=dict)
    _pruned: bool = False

    def feed(self, seq: int, verb: str, data: Any, actor: str, *, pruned: bool = False) -> None:
        if pruned or not isinstance(data, dict):
            # A payload dropped by retention: what it said cannot be checked any more.
            self._pruned = self._pruned or verb in _READ
            return
        if verb == "approval.requested":
            self._requested(seq, data)
        elif verb == "approval.first_approved":
            found = self._approvals.setdefault(_id(data.get("approval")), _Approval())
            found.approvers.add(str(data.get("by", "")))
        elif verb in APPROVED:
            found = self._approvals.setdefault(_id(data.get("approval")), _Approval())
            found.decided = True
            found.params_digest = digest(data.get("params"))
            found.approvers.add(actor.removeprefix("user:"))
            if data.get("first_approved_by"):
                found.approvers.add(str(data["first_approved_by"]))
        elif verb == "snapshot.written":
            self._snapshots[str(data.get("key", ""))] = {**data, "seq": seq}
        elif verb == "side_effect.committed":
            self._committed(seq, data)

    def _requested(self, seq: int, data: dict) -> None:
        approval = self._approvals.setdefault(_id(data.get("approval")), _Approval())
        approval.tool = str(data.get("tool", ""))
        if not data.get("routing") and approval.tool:  # the workflow's approval step asked
            self._asked[approval.tool] = seq

    def _committed(self, seq: int, data: dict) -> None:
        snapshot = self._snapshots.get(str(data.get("key", "")))
        if snapshot is None:
            return
        tool = str(snapshot.get("tool", ""))
        named = snapshot.get("approval")
        asked = self._asked.pop(tool, None)
        self.checked += 1
        where = f"{tool} (key {data.get('key')})"
        if not isinstance(named, dict):
            if asked is not None:
                self._name(
                    seq,
                    f"{where} was committed without an approval, although a person was asked "
                    f"about {tool} at seq {asked}",
                )
            return
        approval = self._approvals.get(_id(named.get("id")))
        if approval is None or not approval.decided:
            self._name(
                seq,
                f"{where} was committed under approval {named.get('id')}, which this timeline "
                "does not show approved",
            )
            return
        if approval.params_digest != named.get("params_digest"):
            self._name(
                seq,
                f"{where} was committed under approval {named.get('id')}, which approved other "
                f"parameters (digest {approval.params_digest[:12]}…, the call's "
                f"{str(named.get('params_digest'))[:12]}…)",
            )
            return
        required = max(int(named.get("required") or 0), 1)
        people = sorted(name for name in approval.approvers if name)
        if len(people) < required:
            self._name(
                seq,
                f"{where} required {required} distinct approvers; approval {named.get('id')} "
                f"has {len(people)} ({', '.join(people) or 'nobody'})",
            )

    def _name(self, seq: int, message: str) -> None:
        if not self._pruned:
            self.problems.append((seq, message))


# The events whose payload the check reads: once one is pruned, the run cannot be checked.
_READ = {
    "approval.requested",
    "approval.first_approved",
    *APPROVED,
    "snapshot.written",
    "side_effect.committed",
}


def _id(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return -1


def check_events(events) -> list[tuple[int, str]]:
    """Problems in one run's events (objects with seq, verb, data, actor, pruned), in order."""
    coverage = Coverage()
    for event in events:
        coverage.feed(event.seq, event.verb, event.data, event.actor, pruned=event.pruned)
    return coverage.problems

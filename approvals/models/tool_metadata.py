"""Local decisions over tools' own metadata (risk, side effect, dedupes by key)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import connection, models, transaction
from django.db.models import Q
from django.utils import timezone

from runs import tools as tool_registry
from runs.models import (
    Risk,
)
from runs.seal import SealedModel

# --------------------------------------------------------------------------------------------
# Local decisions over tools' own metadata (issue 17)


# The metadata an admin may decide locally, over what the tool's code (or its MCP server's
# annotations) says. Everything else about a tool (its lookup, verification, compensation...)
# is code and stays code.
OVERRIDABLE = ("risk", "side_effect", "dedupes_by_key")
RISK_ORDER = {Risk.LOW: 0, Risk.MEDIUM: 1, Risk.HIGH: 2}


def metadata_of(tool: tool_registry.Tool) -> dict[str, Any]:
    """The overridable metadata of a tool, as a plain dict."""
    return {name: getattr(tool, name) for name in OVERRIDABLE}


def loosened(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """The fields where `after` makes the engine less careful than `before`: a side effect
    treated as a read (no snapshot, no key, retried as a read), a tool said to dedupe by key
    (an unknown outcome is sent again), a lower risk (rules for the higher one stop matching)."""
    found = []
    if before.get("side_effect") and after.get("side_effect") is False:
        found.append("side_effect")
    if before.get("dedupes_by_key") is False and after.get("dedupes_by_key"):
        found.append("dedupes_by_key")
    if RISK_ORDER.get(after.get("risk"), 2) < RISK_ORDER.get(before.get("risk"), 0):
        found.append("risk")
    return found


class MetadataConflict(Exception):
    """Someone else changed the tool's local decision since the form was loaded."""

    def __init__(self, current: ToolMetadataOverride | None):
        self.current = current
        super().__init__(current)


class MetadataLoosened(Exception):
    """The change makes the engine less careful and was not confirmed; nothing was written."""

    def __init__(self, fields: list[str], before: dict[str, Any], after: dict[str, Any]):
        self.fields, self.before, self.after = fields, before, after
        super().__init__(", ".join(fields))


class ToolMetadataOverride(SealedModel):
    """An admin's decision over a tool's own metadata (risk, side effect, dedupes by key).

    Every change is a new row and no row ever changes (a trigger refuses UPDATE and DELETE): the
    newest row of a tool is the decision in force, the older ones are its history. A field left
    empty (`risk` "", the booleans None) keeps the tool's own value, so a row with none set
    clears the decision: the tool's own metadata applies again. Each row also keeps the tool's
    own metadata and what was in force just before it, so it reads as old → new on its own.
    The engine sees the decisions through runs.tools.get (approvals.local_metadata). Each row
    is sealed on the records chain as it is written.
    """

    append_only = True
    # decide()'s writers queue on this transaction-level advisory lock ("tool").
    HISTORY_LOCK = 0x746F6F6C

    tool = models.CharField(max_length=150)
    risk = models.CharField(max_length=10, choices=Risk.choices, blank=True, default="")
    side_effect = models.BooleanField(null=True, blank=True)
    dedupes_by_key = models.BooleanField(null=True, blank=True)
    reason = models.TextField()
    # The tool's own metadata when the decision was made (code, or MCP annotations and config).
    tool_metadata = models.JSONField(default=dict)
    # The metadata in force just before this change (the previous decision over tool_metadata).
    before = models.JSONField(default=dict)
    # The fields where this change made the engine less careful, which the admin confirmed.
    loosened = ArrayField(models.CharField(max_length=20), default=list, blank=True)
    changed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    changed_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(risk="") | Q(risk__in=Risk.values), name="tool_override_risk_valid"
            ),
            models.CheckConstraint(
                condition=Q(reason__regex=r"\S"), name="tool_override_reason_given"
            ),
        ]
        indexes = [
            # The newest row per tool (the decisions in force) and a tool's history.
            models.Index(fields=["tool", "-id"], name="tool_override_newest_idx")
        ]

    def __str__(self) -> str:
        return f"metadata of {self.tool}: {self.overrides() or 'cleared'}"

    def overrides(self) -> dict[str, Any]:
        """What this decision sets (a field it leaves empty keeps the tool's own value)."""
        found: dict[str, Any] = {}
        if self.risk:
            found["risk"] = self.risk
        for name in ("side_effect", "dedupes_by_key"):
            if getattr(self, name) is not None:
                found[name] = getattr(self, name)
        return found

    @property
    def clears(self) -> bool:
        return not self.overrides()

    @property
    def after(self) -> dict[str, Any]:
        """The metadata in force from this change on."""
        return {**self.tool_metadata, **self.overrides()}

    @property
    def changes(self) -> list[tuple[str, Any, Any]]:
        """(field, before, after) for every field this change moved."""
        after = self.after
        return [
            (name, self.before.get(name), after.get(name))
            for name in OVERRIDABLE
            if self.before.get(name) != after.get(name)
        ]

    @classmethod
    def in_force(cls, tool: str) -> ToolMetadataOverride | None:
        """The tool's newest row (a clear, too), or None when it never had a decision."""
        return cls.objects.filter(tool=tool).order_by("-id").first()

    @classmethod
    def decide(
        cls,
        tool: tool_registry.Tool,
        user,
        reason: str,
        *,
        risk: str = "",
        side_effect: bool | None = None,
        dedupes_by_key: bool | None = None,
        expected: int | None = None,
        confirmed: bool = False,
    ) -> tuple[ToolMetadataOverride | None, bool]:
        """Record an admin's decision over `tool` (as its code registered it); all fields
        empty clears the decision. Returns (decision in force, changed).

        1. Lock the history against other writers (an advisory lock every writer takes;
           readers are not blocked), so `before` is what was really in force and the stamp the
           engine's caches compare only grows.
        2. `expected` (the id of the decision the admin's form showed, 0 for none) must still
           be the newest row: MetadataConflict otherwise.
        3. The same decision again writes nothing (a repeated POST changes nothing).
        4. A change that makes the engine less careful than what is in force needs
           `confirmed`: MetadataLoosened otherwise, and nothing is written.
        5. Write the row; this process's cache reloads at once, the others within
           approvals.local_metadata.REFRESH_SECONDS of the commit.
        """
        from approvals import local_metadata

        reason = (reason or "").strip()
        if not reason:
            raise ValueError("a decision over a tool's metadata needs a reason")
        if risk and risk not in Risk.values:
            raise ValueError(f"risk must be one of {Risk.values}")
        own = metadata_of(tool)
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [cls.HISTORY_LOCK])
            current = cls.in_force(tool.name)
            if expected is not None and (current.pk if current else 0) != expected:
                raise MetadataConflict(current)
            wanted = cls(
                tool=tool.name, risk=risk, side_effect=side_effect, dedupes_by_key=dedupes_by_key
            )
            previous = current.overrides() if current else {}
            if wanted.overrides() == previous:
                return current, False
            before = {**own, **previous}
            after = {**own, **wanted.overrides()}
            looser = loosened(before, after)
            if looser and not confirmed:
                raise MetadataLoosened(looser, before, after)
            wanted.reason = reason
            wanted.tool_metadata = own
            wanted.before = before
            wanted.loosened = looser
            wanted.changed_by = user
            wanted.save()
            local_metadata.changed()
        return wanted, True

from __future__ import annotations

from django.contrib import admin

from approvals.models import (
    ApprovalRequest,
    EscalationRule,
    HumanDecision,
    Takeover,
    ToolMetadataOverride,
)
from runs.admin import ReadOnlyAdmin


@admin.register(ApprovalRequest)
class ApprovalRequestAdmin(admin.ModelAdmin):
    list_display = ["id", "run", "queue", "risk", "status", "decision", "due_at", "decided_by"]
    list_filter = ["status", "decision", "queue", "risk"]
    raw_id_fields = ["run", "step", "decided_by"]


@admin.register(Takeover)
class TakeoverAdmin(admin.ModelAdmin):
    list_display = ["id", "run", "user", "started_at", "ended_at"]
    raw_id_fields = ["run", "user"]


@admin.register(HumanDecision)
class HumanDecisionAdmin(ReadOnlyAdmin):
    list_display = ["id", "run", "user", "verb", "created_at"]
    list_filter = ["verb"]


@admin.register(EscalationRule)
class EscalationRuleAdmin(admin.ModelAdmin):
    list_display = ["position", "name", "enabled", "failure_class", "tool", "action", "queue"]
    list_editable = ["enabled"]
    list_display_links = ["name"]


@admin.register(ToolMetadataOverride)
class ToolMetadataOverrideAdmin(ReadOnlyAdmin):
    """The history of local decisions over tools' metadata (made on the console's tools page;
    rows never change)."""

    list_display = [
        "id",
        "tool",
        "risk",
        "side_effect",
        "dedupes_by_key",
        "changed_by",
        "changed_at",
    ]
    list_filter = ["tool"]

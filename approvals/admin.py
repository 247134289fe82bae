from __future__ import annotations

from django.contrib import admin

from approvals.models import (
    ApprovalRequest,
    EscalationRule,
    HumanDecision,
    SlackIdentity,
    Takeover,
    ToolMetadataOverride,
)
from runs.admin import ReadOnlyAdmin

# Approval requests, takeovers and rules are sealed (runs/seal.py): they change only through
# their verbs (the console, the API, the engine), which seal each change. Here they are read.


@admin.register(ApprovalRequest)
class ApprovalRequestAdmin(ReadOnlyAdmin):
    list_display = ["id", "run", "queue", "risk", "status", "decision", "due_at", "decided_by"]
    list_filter = ["status", "decision", "queue", "risk"]


@admin.register(Takeover)
class TakeoverAdmin(ReadOnlyAdmin):
    list_display = ["id", "run", "user", "started_at", "ended_at"]


@admin.register(HumanDecision)
class HumanDecisionAdmin(ReadOnlyAdmin):
    list_display = ["id", "run", "user", "verb", "created_at"]
    list_filter = ["verb"]


@admin.register(EscalationRule)
class EscalationRuleAdmin(ReadOnlyAdmin):
    """Edited on the console's rules page, where every change is versioned and sealed."""

    list_display = ["position", "name", "enabled", "failure_class", "tool", "action", "queue"]


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


@admin.register(SlackIdentity)
class SlackIdentityAdmin(admin.ModelAdmin):
    """Which Slack user decides as which TaskPilots user (approvals/slack_views.py)."""

    list_display = ("user", "team_id", "slack_user_id", "linked_at", "linked_by")
    search_fields = ("user__username", "team_id", "slack_user_id")
    autocomplete_fields = ("user",)
    readonly_fields = ("linked_at", "linked_by")

    def save_model(self, request, obj, form, change):
        obj.linked_by = f"admin:{request.user.get_username()}"
        super().save_model(request, obj, form, change)

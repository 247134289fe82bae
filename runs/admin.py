from __future__ import annotations

from django.contrib import admin

from runs.api import admin as api_admin  # noqa: F401  (registers the API client admin)
from runs.models import InboundEvent, Run, SideEffect, Snapshot, Step, TimelineEvent, Wait


class ReadOnlyAdmin(admin.ModelAdmin):
    """Immutable records: visible to staff, never editable from the admin."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class StepInline(admin.TabularInline):
    model = Step
    extra = 0
    fields = ["position", "name", "iteration", "kind", "status", "attempts", "error_class"]
    readonly_fields = fields
    can_delete = False
    show_change_link = True


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ["id", "workflow", "workflow_version", "status", "stage", "queue", "created_at"]
    list_filter = ["status", "workflow", "queue"]
    search_fields = ["id", "business_key"]
    readonly_fields = ["id", "event_seq", "event_hash", "lock_version", "input_digest"]
    inlines = [StepInline]
    list_select_related = False
    show_full_result_count = False


@admin.register(Step)
class StepAdmin(admin.ModelAdmin):
    list_display = ["id", "run", "name", "iteration", "kind", "status", "attempts", "error_class"]
    list_filter = ["status", "kind", "error_class"]
    search_fields = ["run__id", "name", "tool", "idempotency_key"]
    raw_id_fields = ["run"]
    show_full_result_count = False


@admin.register(SideEffect)
class SideEffectAdmin(admin.ModelAdmin):
    list_display = ["idempotency_key", "tool", "status", "external_id", "confirmed_by"]
    list_filter = ["status", "tool"]
    search_fields = ["idempotency_key", "external_id", "run__id"]
    raw_id_fields = ["run", "step", "snapshot"]
    show_full_result_count = False


@admin.register(Wait)
class WaitAdmin(admin.ModelAdmin):
    list_display = ["id", "run", "kind", "event_type", "correlation_key", "due_at", "status"]
    list_filter = ["kind", "status"]
    raw_id_fields = ["run", "step"]
    show_full_result_count = False


@admin.register(InboundEvent)
class InboundEventAdmin(ReadOnlyAdmin):
    list_display = ["event_id", "event_type", "correlation_key", "received_at", "matched_wait"]


@admin.register(Snapshot)
class SnapshotAdmin(ReadOnlyAdmin):
    list_display = ["id", "run", "tool", "idempotency_key", "attempt", "created_at"]
    search_fields = ["idempotency_key", "run__id"]
    show_full_result_count = False


@admin.register(TimelineEvent)
class TimelineEventAdmin(ReadOnlyAdmin):
    list_display = ["run", "seq", "at", "actor", "verb"]
    list_filter = ["verb"]
    search_fields = ["run__id"]
    show_full_result_count = False

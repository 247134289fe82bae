"""Admin pages of the console: escalation rules (list, create, edit, reorder, enable/disable,
history), the rule tester, tool pauses and local decisions over tools' metadata, and
notification channels.

Admins only (others get a 403); thin views over approvals/rules.py and approvals/notifications.py.
"""

from __future__ import annotations

import logging

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import path, reverse
from django.utils.translation import gettext as _
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from approvals import notifications, rules, rules_history, tool_metadata
from approvals.forms import ToolPauseForm, ToolResumeForm, first_error
from approvals.htmx import htmx_partial
from approvals.models import (
    EscalationRule,
    MetadataConflict,
    MetadataLoosened,
    NotificationChannel,
    NotificationDelivery,
)
from approvals.permissions import ADMINISTER, require_role

logger = logging.getLogger("taskpilots.console")


# Login required, then the admin role.
admin_view = require_role(ADMINISTER)


# --------------------------------------------------------------------------------------------
# Rules and the tester


def _tester(request: HttpRequest) -> dict:
    form = rules.TesterForm(request.GET or None, failures=rules.recent_failures())
    query = form.query() if form.is_bound else None
    if not query:
        return {"tester": form, "verdict": None, "query": query, "tested": []}
    verdict = rules.which_rule(**query)
    return {"tester": form, "verdict": verdict, "query": query, "tested": rules.tested(query)}


@require_GET
@never_cache
@admin_view
def rule_list(request: HttpRequest) -> HttpResponse:
    context = {"rules": list(EscalationRule.objects.order_by("position", "id")), **_tester(request)}
    template = htmx_partial(request, "console/rules.html", "tester-result")
    return render(request, template, context)


def _form_page(request, form: rules.RuleForm, *, status: int = 200, error: str = ""):
    rule = form.instance if form.instance.pk else None
    versions = (
        list(rule.versions.select_related("changed_by").order_by("-version")[:50]) if rule else []
    )
    context = {
        "form": form,
        "rule": rule,
        "versions": versions,
        "error": error,
        "known_tools": sorted(rules.known_tools()),
        "known_workflows": sorted(rules.known_workflows()),
    }
    return render(request, "console/rules_form.html", context, status=status)


@require_http_methods(["GET", "POST"])
@never_cache
@admin_view
def rule_create(request: HttpRequest) -> HttpResponse:
    if request.method == "GET":
        return _form_page(request, rules.RuleForm(initial={"position": 100, "queue": "ops"}))
    form = rules.RuleForm(request.POST)
    if not form.is_valid():
        return _form_page(request, form, status=422, error=_("Check the form."))
    rule, _changed = rules.save_rule(form, request.user)
    logger.info("rule %s created by %s", rule.pk, request.user.get_username())
    messages.success(request, _("Rule “%(name)s” created (version 1).") % {"name": rule.name})
    return redirect("console:rule-list")


@require_http_methods(["GET", "POST"])
@never_cache
@admin_view
def rule_edit(request: HttpRequest, rule_id: int) -> HttpResponse:
    rule = get_object_or_404(EscalationRule, pk=rule_id)
    if request.method == "GET":
        return _form_page(request, rules.RuleForm(instance=rule))
    form = rules.RuleForm(request.POST, instance=rule)
    if not form.is_valid():
        return _form_page(request, form, status=422, error=_("Check the form."))
    try:
        rule, changed = rules.save_rule(form, request.user)
    except rules.RuleConflict as exc:
        fresh = EscalationRule.objects.get(pk=rule_id)
        return _form_page(request, rules.RuleForm(instance=fresh), status=409, error=str(exc))
    if changed:
        logger.info("rule %s v%s saved by %s", rule.pk, rule.version, request.user.get_username())
        messages.success(
            request,
            _("Rule “%(name)s” saved as version %(version)s. It routes the next failure.")
            % {"name": rule.name, "version": rule.version},
        )
    else:
        messages.info(request, _("Nothing changed."))
    return redirect("console:rule-list")


@require_POST
@never_cache
@admin_view
def rule_preview(request: HttpRequest, rule_id: int | None = None) -> HttpResponse:
    """The form's current values tested against the last 7 or 30 days of failures (htmx
    fragment); nothing is saved. An invalid form answers with its errors instead."""
    rule = get_object_or_404(EscalationRule, pk=rule_id) if rule_id is not None else None
    form = rules.RuleForm(request.POST, instance=rule)
    try:
        days = int(request.POST.get("days", ""))
    except ValueError:
        days = rules_history.WINDOWS[0]
    if days not in rules_history.WINDOWS:
        days = rules_history.WINDOWS[0]
    context = {"form": form, "rule": rule, "days": days, "previewing": True}
    template = "console/rules_form.html#history-preview"
    if not form.is_valid():
        return render(request, template, context, status=422)
    # is_valid() put the form's values on the instance, in memory only.
    context["comparison"] = rules_history.preview(form.instance, days)
    context["cap"] = rules_history.SCAN_CAP
    return render(request, template, context)


@require_POST
@admin_view
def rule_toggle(request: HttpRequest, rule_id: int) -> HttpResponse:
    rule = get_object_or_404(EscalationRule, pk=rule_id)
    enabled = request.POST.get("enabled") == "1"
    rule = rules.set_enabled(rule.pk, enabled, request.user)
    messages.success(
        request,
        (_("Rule “%(name)s” enabled.") if enabled else _("Rule “%(name)s” disabled."))
        % {"name": rule.name},
    )
    return redirect("console:rule-list")


@require_POST
@admin_view
def rule_move(request: HttpRequest, rule_id: int, direction: str) -> HttpResponse:
    rule = get_object_or_404(EscalationRule, pk=rule_id)
    rules.move_rule(rule.pk, direction, request.user)
    return redirect("console:rule-list")


# --------------------------------------------------------------------------------------------
# Tool pauses


def _tools_page(
    request: HttpRequest,
    *,
    status: int = 200,
    error: str = "",
    failed_tool: str = "",
    focus: str = "",
    **outcome,
) -> HttpResponse:
    """The tools page; for htmx only its main part (`#tools-main`). `error` is a pause's;
    `outcome` (bound, error, success, warnings) is shown in the entry of the tool `focus`."""
    if "metadata_error" in outcome:
        outcome["error"] = outcome.pop("metadata_error")
    context = tool_metadata.page_context(focus=focus, **outcome)
    context.update(error=error, failed_tool=failed_tool)
    template = htmx_partial(request, "console/rules_tools.html", always="tools-main")
    return render(request, template, context, status=status)


@require_GET
@never_cache
@admin_view
def tool_list(request: HttpRequest) -> HttpResponse:
    return _tools_page(request)


@require_POST
@admin_view
def tool_pause(request: HttpRequest) -> HttpResponse:
    form = ToolPauseForm(request.POST)
    if not form.is_valid():  # a NUL or an invisible character: refused before any query
        error, _field = first_error(form)
        return _tools_page(request, status=422, error=error)
    tool = form.cleaned_data["tool"]
    try:
        pause, created = rules.pause_tool(tool, request.user, form.cleaned_data["reason"])
    except rules.PauseError as exc:
        return _tools_page(request, status=422, error=str(exc), failed_tool=tool)
    if created:
        logger.warning("tool %s paused by %s", tool, request.user.get_username())
        messages.success(
            request, _("%(tool)s is paused: steps that call it wait.") % {"tool": tool}
        )
    return redirect("console:tool-list")


@require_POST
@admin_view
def tool_resume(request: HttpRequest) -> HttpResponse:
    form = ToolResumeForm(request.POST)
    if not form.is_valid():
        error, _field = first_error(form)
        return _tools_page(request, status=422, error=error)
    tool = form.cleaned_data["tool"]
    pause, woken = rules.resume_tool(tool, request.user)
    if pause is not None:
        logger.warning("tool %s resumed by %s", tool, request.user.get_username())
        messages.success(
            request,
            _("%(tool)s is resumed; %(count)s waiting steps go on.")
            % {"tool": tool, "count": woken},
        )
    return redirect("console:tool-list")


@require_POST
@admin_view
def tool_metadata_decide(request: HttpRequest) -> HttpResponse:
    """Set or clear the local decision over a tool's metadata (approvals/tool_metadata.py).

    A bad form, an unknown tool or an unconfirmed loosening answers 422 and writes nothing; a
    decision someone else changed since the form was loaded answers 409 with what is in force.
    """
    name = request.POST.get("tool", "")[:150]
    try:
        own = tool_metadata.registered(name)
    except tool_metadata.MetadataRefused as exc:
        return _tools_page(request, status=422, error=str(exc))
    form = tool_metadata.form_for(name, own, data=request.POST)
    if not form.is_valid():
        return _tools_page(
            request, status=422, bound=form, focus=name, metadata_error=_("Check the form.")
        )
    try:
        decision, changed = tool_metadata.decide(form, request.user)
    except MetadataLoosened as exc:
        warnings = tool_metadata.loosening_warnings(name, exc)
        return _tools_page(
            request,
            status=422,
            bound=form,
            focus=name,
            warnings=warnings,
            metadata_error=_(
                "This makes the engine less careful: tick the confirmation to save it."
            ),
        )
    except MetadataConflict as exc:
        return _tools_page(
            request,
            status=409,
            focus=name,
            metadata_error=tool_metadata.conflict_message(name, exc.current),
        )
    message = tool_metadata.saved_message(name, decision, changed)
    if changed:
        logger.warning(
            "tool %s metadata %s by %s: %s",
            name,
            "cleared" if decision.clears else decision.overrides(),
            request.user.get_username(),
            decision.changes,
        )
    if request.htmx:
        return _tools_page(request, focus=name, success=message)
    messages.success(request, message)
    return redirect(reverse("console:tool-list") + "#" + tool_metadata.anchor_of(name))


# --------------------------------------------------------------------------------------------
# Notification channels


def _channels_page(request, form, *, status=200):
    context = {
        "form": form,
        "channels": list(NotificationChannel.objects.order_by("queue", "id")),
        "deliveries": list(
            NotificationDelivery.objects.select_related("channel").order_by("-id")[:30]
        ),
    }
    return render(request, "console/channels.html", context, status=status)


@require_http_methods(["GET", "POST"])
@never_cache
@admin_view
def channel_list(request: HttpRequest) -> HttpResponse:
    if request.method == "GET":
        return _channels_page(request, notifications.ChannelForm())
    form = notifications.ChannelForm(request.POST)
    if not form.is_valid():
        return _channels_page(request, form, status=422)
    channel = form.save(commit=False)
    channel.created_by = request.user
    channel.save()
    messages.success(
        request,
        _("Queue “%(queue)s” now notifies %(target)s.")
        % {"queue": channel.queue, "target": channel.target},
    )
    return redirect("console:channel-list")


@require_POST
@admin_view
def channel_toggle(request: HttpRequest, channel_id: int) -> HttpResponse:
    channel = get_object_or_404(NotificationChannel, pk=channel_id)
    enabled = request.POST.get("enabled") == "1"
    NotificationChannel.objects.filter(pk=channel.pk).update(enabled=enabled)
    return redirect("console:channel-list")


# Included by approvals/urls.py under the console namespace.
urlpatterns = [
    path("rules/", rule_list, name="rule-list"),
    path("rules/new/", rule_create, name="rule-create"),
    path("rules/<int:rule_id>/", rule_edit, name="rule-edit"),
    path("rules/new/preview/", rule_preview, name="rule-preview-new"),
    path("rules/<int:rule_id>/preview/", rule_preview, name="rule-preview"),
    path("rules/<int:rule_id>/toggle/", rule_toggle, name="rule-toggle"),
    path("rules/<int:rule_id>/move/<str:direction>/", rule_move, name="rule-move"),
    path("rules/tools/", tool_list, name="tool-list"),
    path("rules/tools/pause/", tool_pause, name="tool-pause"),
    path("rules/tools/resume/", tool_resume, name="tool-resume"),
    path("rules/tools/metadata/", tool_metadata_decide, name="tool-metadata"),
    path("rules/channels/", channel_list, name="channel-list"),
    path("rules/channels/<int:channel_id>/toggle/", channel_toggle, name="channel-toggle"),
]

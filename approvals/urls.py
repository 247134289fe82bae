from __future__ import annotations

from django.urls import path

from approvals import audit_views, metrics_views, views

app_name = "console"

urlpatterns = [
    path("", views.inbox, name="inbox"),
    path("runs/", views.run_list, name="run-list"),
    path("metrics/", metrics_views.metrics_page, name="metrics"),
    path("metrics.json", metrics_views.metrics_json, name="metrics-json"),
    path("runs/<uuid:run_id>/", views.run_detail, name="run-detail"),
    path("runs/<uuid:run_id>/raw/<slug:part>/", views.run_raw, name="run-raw"),
    path("runs/<uuid:run_id>/raw/<slug:part>/<int:ident>/", views.run_raw, name="run-raw-item"),
    path("runs/<uuid:run_id>/actions/<slug:action>/", views.run_action, name="run-action"),
    # Audit (auditors and admins): approvals/audit_views.py
    path("runs/<uuid:run_id>/timeline/", audit_views.run_timeline, name="run-timeline"),
    path(
        "runs/<uuid:run_id>/timeline/events/<int:seq>/",
        audit_views.run_timeline_event,
        name="run-timeline-event",
    ),
    path(
        "runs/<uuid:run_id>/timeline/range/",
        audit_views.run_timeline_range,
        name="run-timeline-range",
    ),
    path(
        "runs/<uuid:run_id>/timeline/export.<slug:fmt>",
        audit_views.run_export,
        name="run-timeline-export",
    ),
    path("audit/", audit_views.audit_search, name="audit"),
    path("audit/export.<slug:fmt>", audit_views.search_export, name="audit-export"),
]

# Admin pages: escalation rules, tool pauses, notification channels.
from approvals.rules_views import urlpatterns as rules_urlpatterns  # noqa: E402

urlpatterns += rules_urlpatterns

# Side effects their systems no longer show as recorded (the consistency check).
from approvals.mismatch_views import urlpatterns as mismatch_urlpatterns  # noqa: E402

urlpatterns += mismatch_urlpatterns

# The live console (approvals/live_views.py): conditional polls, presence, soft claims.
from approvals import live_views  # noqa: E402

urlpatterns += [
    path("live/inbox/", live_views.inbox_live, name="inbox-live"),
    path("runs/<uuid:run_id>/live/", live_views.run_live, name="run-live"),
    path("runs/<uuid:run_id>/live/main/", live_views.run_main_live, name="run-main-live"),
    path("runs/<uuid:run_id>/claim/<slug:verb>/", live_views.run_claim, name="run-claim"),
]

# Bulk actions on the filtered runs (approvals/bulk_views.py).
from approvals.bulk_views import urlpatterns as bulk_urlpatterns  # noqa: E402

urlpatterns += bulk_urlpatterns

# A person's own API tokens and delegations (approvals/token_views.py).
from approvals.token_views import urlpatterns as token_urlpatterns  # noqa: E402

urlpatterns += token_urlpatterns

# Approve / Reject links in a queue's mail: a confirmation page, then the console's action
# (approvals/mail_views.py).
from approvals.mail_views import urlpatterns as mail_urlpatterns  # noqa: E402

urlpatterns += mail_urlpatterns

# A person links their own Slack account from the link a press in Slack answers them with, and
# unlinks it from their tokens page (approvals/slack_link.py).
from approvals.slack_link import urlpatterns as slack_link_urlpatterns  # noqa: E402

urlpatterns += slack_link_urlpatterns

"""`user|can_audit`: whether to show the Audit entry (auditors and admins)."""

from __future__ import annotations

from django import template

from approvals import console

register = template.Library()


@register.filter
def can_audit(user) -> bool:
    return bool(console.roles_of(user) & {console.AUDITOR, console.ADMIN})

from __future__ import annotations

from django import template

from approvals import console

register = template.Library()


@register.filter
def is_console_admin(user) -> bool:
    return console.is_admin(user)

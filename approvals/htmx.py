"""The one way a view answers an htmx request with part of its page: the page's template, or
one of its partials (`template#name`, Django's template partials) when the request targets it.
A page that is reloaded, or reached by a plain link, gets the whole template."""

from __future__ import annotations

from django.http import HttpRequest


def htmx_partial(request: HttpRequest, template: str, *targets: str, always: str = "") -> str:
    """`template`, or `template#<target>` when an htmx request's target is one of `targets`
    (the element id the partial renders), or `template#<always>` for any htmx request."""
    htmx = getattr(request, "htmx", None)
    if not htmx:
        return template
    if always:
        return f"{template}#{always}"
    if htmx.target in targets:
        return f"{template}#{htmx.target}"
    return template

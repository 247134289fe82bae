"""A readable, self-contained docs page for the API, rendered on the server from the OpenAPI
schema. No JavaScript and no CDN, so it works under the project's CSP (ninja's Swagger UI pulls
its assets from a CDN when ninja is not an installed app, and would not load)."""

from __future__ import annotations

import json
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from ninja.openapi.docs import DocsBase

from runs.invisible import escape_json_fully

METHODS = ("get", "post", "put", "patch", "delete")


def _pretty(value: Any) -> str:
    # The identifier pattern lists the invisible characters it refuses: shown as \uXXXX escapes
    # (the same JSON), or the page would carry bidi overrides and blanks into the reader's view.
    return escape_json_fully(json.dumps(value, indent=2, sort_keys=False, ensure_ascii=False))


def _operations(schema: dict) -> list[dict]:
    out = []
    for path, item in schema.get("paths", {}).items():
        for method in METHODS:
            op = item.get(method)
            if op is None:
                continue
            body = (
                op.get("requestBody", {})
                .get("content", {})
                .get("application/json", {})
                .get("schema")
            )
            out.append(
                {
                    "method": method.upper(),
                    "path": path,
                    "anchor": f"{method}-{path}".replace("/", "-").strip("-"),
                    "summary": op.get("summary", ""),
                    "description": op.get("description", ""),
                    "security": sorted({name for req in op.get("security", []) for name in req}),
                    "parameters": [
                        {
                            "name": p["name"],
                            "in": p["in"],
                            "required": p.get("required", False),
                            "schema": _pretty(p.get("schema", {})),
                            "description": p.get("description", ""),
                        }
                        for p in op.get("parameters", [])
                    ],
                    "body": _pretty(body) if body else "",
                    "responses": [
                        {
                            "status": status,
                            "description": response.get("description", ""),
                            "schema": _pretty(
                                response.get("content", {})
                                .get("application/json", {})
                                .get("schema", {})
                            ),
                        }
                        for status, response in op.get("responses", {}).items()
                    ],
                }
            )
    return out


class ReadableDocs(DocsBase):
    def render_page(self, request: HttpRequest, api, **kwargs: Any) -> HttpResponse:
        schema = api.get_openapi_schema(path_params=kwargs)
        components = schema.get("components", {})
        return TemplateResponse(
            request,
            "api/docs.html",
            {
                "info": schema.get("info", {}),
                "openapi_url": self.get_openapi_url(api, kwargs),
                "operations": _operations(schema),
                "schemas": [
                    {"name": name, "schema": _pretty(value)}
                    for name, value in components.get("schemas", {}).items()
                ],
                "security_schemes": [
                    {"name": name, "scheme": _pretty(value)}
                    for name, value in components.get("securitySchemes", {}).items()
                ],
            },
        )

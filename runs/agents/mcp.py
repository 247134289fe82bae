"""MCP servers' tools as TaskPilots tools.

    sandbox = McpServer("sandbox", command=[sys.executable, "servers/sandbox.py"])
    tools = register_mcp_tools(sandbox, config={
        "send_mail": McpToolConfig(lookup_tool="find_by_key",
                                   lookup_arguments=lambda key: {"system": "mail",
                                                                 "idempotency_key": key}),
        "refund_payment": McpToolConfig(needs_approval=True),
    })
    # tools == {"send_mail": <Tool mcp.sandbox.send_mail>, ...}; give them to an SDK agent with
    # mcp_function_tools(tools).

Metadata. The tool's MCP annotations give the defaults — `readOnlyHint` → a read, otherwise a
side effect; risk high when `destructiveHint` (the MCP default for a non-read-only tool), medium
when not destructive but `openWorldHint` (default), low otherwise; `idempotentHint` → the tool
dedupes by key (resending the same call changes nothing more). Annotations are the server's
claims, not proof: `McpToolConfig` overrides any of them per tool.

Lazy, per process. Registering connects nowhere: without a manifest, a server's tools are
listed on first use in each process (McpToolset), so importing a module, a `manage.py` command
or a web process starts no server. Calls run in Celery workers (sync code): a stdio server is
started on the first call in a worker process and kept for the next ones, and closed when the
worker shuts down; streamable HTTP opens a session per call (runs.agents.mcp_session holds
McpServer, the sessions and call_tool). Each call runs under the tool's hard timeout. The
idempotency key always travels in the request's `_meta` (`taskpilots/idempotency-key`, with
`taskpilots/run`, `taskpilots/step`, `taskpilots/attempt`); `key_argument` also passes it as a
tool argument, for servers that only read arguments.

Reconciliation. A server with a lookup-by-key tool names it (`lookup_tool`). One without can
still say with its read tools whether a call's effect is there (`McpVerification`: read the
file, list the commits); after a crash the engine verifies before resending or asking a person
(runs.tools.Verification, runs.engine.ledger).

Failures map onto TaskPilots classes: the server cannot be started or reached → outage (nothing
was sent); a timeout or a broken connection after the request went out → unknown outcome for a
side effect (transient for a read); JSON-RPC invalid params / unknown tool → invalid input; an
`isError` result → the class the server names in `_meta["taskpilots/failure-class"]`, else the
tool's configured `error_class`, else unknown outcome for a side effect (the tool ran; how far is
unknown) and transient for a read. Arguments are checked against the tool's input schema before
anything is sent.

Results are normalised to one shape whatever the server: `{"result": structuredContent, or the
text parsed as JSON, or the text; "content": [non-text blocks, described]; "server", "tool"}`;
the external id (commit proof) is what the tool's `external_id` extractor finds in the result,
else `_meta["taskpilots/external-id"]`, else `result.id`.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runs import tools as tool_registry
from runs.agents import AgentToolInfo, flat_schema, set_tool_info
from runs.agents.mcp_session import McpServer, McpSetupError, _run, call_tool
from runs.agents.mcp_session import close_connections as close_connections  # re-exported
from runs.models import FailureClass, Risk
from runs.tools import (
    CallContext,
    LookupResult,
    Tool,
    ToolError,
    ToolResult,
    Verification,
    about_to_send,
)

META_KEY = "taskpilots/idempotency-key"
META_RUN = "taskpilots/run"
META_STEP = "taskpilots/step"
META_ATTEMPT = "taskpilots/attempt"
META_FAILURE_CLASS = "taskpilots/failure-class"
META_EXTERNAL_ID = "taskpilots/external-id"
# On a read made to verify a call (it carries that call's key): not the call itself.
META_PURPOSE = "taskpilots/purpose"


@dataclass(frozen=True)
class McpToolConfig:
    """Overrides for one MCP tool (None / empty: keep the default from its annotations)."""

    name: str = ""  # the TaskPilots tool name; default mcp.<server>.<tool>
    side_effect: bool | None = None
    risk: str | None = None
    dedupes_by_key: bool | None = None
    # An MCP tool on the same server that says whether a keyed call happened; it must answer
    # {"found": bool, "id": ..., "response": ...}.
    lookup_tool: str = ""
    lookup_arguments: Callable[[str], dict] | None = None
    key_argument: str = ""
    target: Callable[[dict], str] | None = None
    scope: str = ""
    timeout: float | None = None
    needs_approval: bool | Callable[[dict], bool] = False
    approval_reason: str = ""
    queue: str = "support"
    error_class: str = ""
    compensating_tool: str = ""
    compensation_params: Callable[[dict, dict], dict] | None = None
    fallback_tool: str = ""
    # For a tool that cannot be asked by key: how a read of the same server tells whether a
    # call's effect is there (reconciliation by verification, see McpVerification).
    verification: McpVerification | None = None
    # The commit proof from the call's own answer: (params, the normalised result value) → the
    # external id (a commit hash in the reply text, a file's path and digest). Default:
    # `_meta["taskpilots/external-id"]`, else the result's `id`.
    external_id: Callable[[dict, Any], str] | None = None
    # How long after a call the server may still apply it (runs.tools.Tool.settle_seconds).
    settle_seconds: float | None = None


@dataclass(frozen=True)
class McpRead:
    """What a read tool answered, as a verification sees it."""

    ok: bool  # False for an isError answer (a file that is not there): an answer, not a failure
    result: Any  # the normalised result (structuredContent, the text parsed as JSON, or the text)
    text: str  # the text blocks, joined


@dataclass(frozen=True)
class McpVerification:
    """How to tell, with a read tool of the same server, whether a call's effect is there.

    `arguments(params)` are the read's arguments from the call's parameters; `recognise(params,
    observed, baseline)` answers True (the effect is there), False (it is not) or None (cannot
    tell), where `observed` is the McpRead after the crash and `baseline` the McpRead taken just
    before the first call when `baseline=True` (else None). `external_id(params, observed,
    baseline)` is the commit proof. See runs.tools.Verification for what the engine does with it.
    """

    tool: str
    arguments: Callable[[dict], dict]
    recognise: Callable[[dict, McpRead, McpRead | None], bool | None]
    baseline: bool = False
    external_id: Callable[[dict, McpRead, McpRead | None], str] | None = None
    description: str = ""


@dataclass
class McpTool(Tool):
    """A TaskPilots tool backed by an MCP tool; arguments are checked against its schema."""

    server: str = ""
    mcp_name: str = ""
    input_schema: dict = field(default_factory=dict)
    # The server's own annotations (its claims: readOnlyHint, destructiveHint, ...), as listed.
    annotations: dict = field(default_factory=dict)

    def validate(self, params: Any) -> dict:
        params = super().validate(params)
        if self.input_schema:
            import jsonschema

            validator = jsonschema.validators.validator_for(self.input_schema)(self.input_schema)
            errors = sorted(validator.iter_errors(params), key=lambda e: list(e.path))
            if errors:
                where = ".".join(str(p) for p in errors[0].path) or "arguments"
                raise ToolError(FailureClass.INVALID_INPUT, f"{where}: {errors[0].message}")
        return params


# --------------------------------------------------------------------------------------------
# Metadata


def metadata_from_annotations(annotations: Mapping[str, Any] | None) -> dict:
    """Default TaskPilots metadata from MCP tool annotations (with the MCP spec's defaults)."""
    annotations = annotations or {}
    if annotations.get("readOnlyHint", False):
        return {"side_effect": False, "risk": Risk.LOW, "dedupes_by_key": False}
    destructive = annotations.get("destructiveHint", True)
    open_world = annotations.get("openWorldHint", True)
    risk = Risk.HIGH if destructive else Risk.MEDIUM if open_world else Risk.LOW
    return {
        "side_effect": True,
        "risk": risk,
        "dedupes_by_key": bool(annotations.get("idempotentHint", False)),
    }


def _model_schema(input_schema: dict, key_argument: str) -> dict:
    # The key is ours to fill in, not the model's.
    if not key_argument:
        return input_schema
    schema = dict(input_schema)
    schema["properties"] = {
        k: v for k, v in (schema.get("properties") or {}).items() if k != key_argument
    }
    schema["required"] = [r for r in schema.get("required") or () if r != key_argument]
    return schema


# --------------------------------------------------------------------------------------------
# Calling


def normalise(result, *, server: str, tool: str) -> dict:
    """One response shape for every server (see the module docstring)."""
    texts, others = [], []
    for block in result.content or ():
        if getattr(block, "type", "") == "text":
            texts.append(block.text)
        else:
            described = {"type": getattr(block, "type", "unknown")}
            for attr, key in (("mime_type", "mimeType"), ("uri", "uri"), ("name", "name")):
                if getattr(block, attr, None):
                    described[key] = str(getattr(block, attr))
            others.append(described)
    value = result.structured_content
    if value is None and len(texts) == 1:
        try:
            value = json.loads(texts[0])
        except ValueError:
            value = texts[0]
    elif value is None and texts:
        value = "\n".join(texts)
    out = {"result": value, "server": server, "tool": tool}
    if others:
        out["content"] = others
    return out


def _error_text(result) -> str:
    text = " ".join(b.text for b in result.content or () if getattr(b, "type", "") == "text")
    return text[:1000] or "the tool reported an error"


def _external_id(result, value: Any) -> str:
    meta = result.meta or {}
    if meta.get(META_EXTERNAL_ID):
        return str(meta[META_EXTERNAL_ID])
    if isinstance(value, dict):
        for key in ("external_id", "id"):
            if value.get(key) not in (None, ""):
                return str(value[key])
    return ""


def _meta(ctx: CallContext) -> dict:
    return {
        META_KEY: ctx.idempotency_key,
        META_RUN: ctx.run_id,
        META_STEP: ctx.step,
        META_ATTEMPT: ctx.attempt,
    }


def _invoker(server: McpServer, mcp_name: str, write: bool, config: McpToolConfig):
    def invoke(params: dict, ctx: CallContext) -> ToolResult:
        arguments = dict(params)
        if config.key_argument:
            arguments[config.key_argument] = ctx.idempotency_key
        about_to_send()
        result = call_tool(
            server, mcp_name, arguments, meta=_meta(ctx), timeout=ctx.timeout, write=write
        )
        if result.is_error:
            named = (result.meta or {}).get(META_FAILURE_CLASS)
            cls = (named if named in FailureClass.values else config.error_class) or (
                FailureClass.UNKNOWN_OUTCOME if write else FailureClass.TRANSIENT
            )
            raise ToolError(
                cls, f"MCP {server.name}/{mcp_name}: {_error_text(result)}", answered=True
            )
        response = normalise(result, server=server.name, tool=mcp_name)
        if config.external_id is not None:
            try:
                external_id = str(config.external_id(params, response["result"]) or "")
            except Exception:  # the proof is not where the extractor looks: none, not a failure
                external_id = ""
        else:
            external_id = _external_id(result, response["result"])
        return ToolResult(response=response, external_id=external_id)

    return invoke


def _lookup(server: McpServer, config: McpToolConfig):
    if not config.lookup_tool:
        return None
    make_arguments = config.lookup_arguments or (lambda key: {"idempotency_key": key})

    def lookup(key: str, ctx: CallContext) -> LookupResult:
        result = call_tool(
            server,
            config.lookup_tool,
            make_arguments(key),
            meta=_meta(ctx),
            timeout=ctx.timeout,
            write=False,
        )
        value = normalise(result, server=server.name, tool=config.lookup_tool)["result"]
        if result.is_error or not isinstance(value, dict) or "found" not in value:
            raise ToolError(FailureClass.TRANSIENT, f"lookup by key answered: {str(value)[:300]}")
        return LookupResult(
            found=bool(value["found"]),
            external_id=str(value.get("id") or value.get("external_id") or ""),
            response=value.get("response"),
        )

    return lookup


def _verification(server: McpServer, config: McpToolConfig) -> Verification | None:
    """runs.tools.Verification for an McpVerification: the read tool's answers as McpRead,
    kept as JSON in the snapshot and the receipt."""
    spec = config.verification
    if spec is None:
        return None

    def read(params: dict, ctx: CallContext) -> dict:
        result = call_tool(
            server,
            spec.tool,
            spec.arguments(params),
            meta={**_meta(ctx), META_PURPOSE: "verification"},
            timeout=ctx.timeout,
            write=False,
        )
        value = normalise(result, server=server.name, tool=spec.tool)["result"]
        text = "\n".join(b.text for b in result.content or () if getattr(b, "type", "") == "text")
        return {"ok": not result.is_error, "result": value, "text": text}

    def as_read(value: Any) -> McpRead | None:
        if not isinstance(value, dict):
            return None
        return McpRead(bool(value.get("ok")), value.get("result"), str(value.get("text") or ""))

    def recognise(params: dict, observed: Any, baseline: Any) -> bool | None:
        return spec.recognise(params, as_read(observed), as_read(baseline))

    external_id = None
    if spec.external_id is not None:

        def external_id(params: dict, observed: Any, baseline: Any) -> str:
            return spec.external_id(params, as_read(observed), as_read(baseline))

    return Verification(
        read=read,
        recognise=recognise,
        baseline=read if spec.baseline else None,
        external_id=external_id,
        description=spec.description or f"MCP {server.name}/{spec.tool}",
    )


# --------------------------------------------------------------------------------------------
# Discovery and registration


def list_tools(server: McpServer) -> list[dict]:
    """The server's tools as MCP JSON (name, description, inputSchema, annotations)."""

    async def fetch(client):
        found, cursor = [], None
        while True:
            page = await client.list_tools(cursor=cursor)
            found.extend(t.model_dump(by_alias=True, exclude_none=True) for t in page.tools)
            cursor = page.next_cursor
            if not cursor:
                return found

    try:
        return _run(server, fetch, server.timeout)
    except Exception as exc:
        raise McpSetupError(
            f"cannot list the tools of MCP server {server.name!r}: {type(exc).__name__}: {exc}"
        ) from None


def register_mcp_tools(
    server: McpServer,
    *,
    include: Sequence[str] | None = None,
    config: Mapping[str, McpToolConfig] | None = None,
    manifest: Sequence[Mapping[str, Any]] | None = None,
) -> McpToolset:
    """Register the server's tools (all, or `include`) as TaskPilots tools.

    Nothing connects here: with a `manifest` (what list_tools returned, e.g. kept in a file) the
    tools are registered at once; without one, on first use in each process — the first
    `runs.tools.get` of one of their names, or the first look into the returned mapping — the
    server is asked for its tools (McpToolset). Returns {MCP tool name: registered tool}.
    """
    toolset = McpToolset(server, include=include, config=config, manifest=manifest)
    if manifest is not None:
        toolset.resolve(connect=False)
    for prefix in toolset.prefixes():
        tool_registry.register_source(prefix, toolset.resolve)
    return toolset


class McpToolset(Mapping):
    """An MCP server's tools as registered TaskPilots tools, listed on first use in a process.

    `resolve(connect=True)` (a worker about to call one, or anyone looking into the mapping)
    lists them from the server and keeps the listing in a cache file (settings.VAR_DIR/mcp);
    `resolve(connect=False)` (a web process showing the tools page) uses a manifest or that cache
    file only. A server that cannot be reached while nothing is cached is an outage for the call
    that asked (runs.tools.ToolError), not an unknown tool.
    """

    def __init__(self, server, *, include=None, config=None, manifest=None):
        self.server = server
        self.include = list(include) if include is not None else None
        self.config = dict(config or {})
        self.manifest = list(manifest) if manifest is not None else None
        self._tools: dict[str, McpTool] | None = None
        self._lock = threading.Lock()

    def prefixes(self) -> list[str]:
        names = {cfg.name for cfg in self.config.values() if cfg.name}
        return [f"mcp.{self.server.name}.", *sorted(names)]

    def resolve(self, connect: bool = True) -> dict[str, McpTool]:
        if self._tools is not None:
            return self._tools
        with self._lock:
            if self._tools is None:
                listing = self._listing(connect)
                if listing is None:
                    return {}
                self._tools = _register_listing(self.server, listing, self.include, self.config)
        return self._tools

    def _listing(self, connect: bool) -> list[dict] | None:
        if self.manifest is not None:
            return self.manifest
        cached = _read_listing_cache(self.server)
        if not connect:
            return cached
        try:
            listing = list_tools(self.server)
        except McpSetupError as exc:
            if cached is not None:
                return cached  # the call itself will say what is wrong with the server
            raise ToolError(FailureClass.OUTAGE, str(exc)) from None
        _write_listing_cache(self.server, listing)
        return listing

    def __getitem__(self, name: str) -> McpTool:
        return self.resolve()[name]

    def __iter__(self):
        return iter(self.resolve())

    def __len__(self) -> int:
        return len(self.resolve())


def _listing_cache_path(server: McpServer):
    from django.conf import settings

    identity = json.dumps([server.name, list(server.command), server.url, server.cwd or ""])
    digest = hashlib.sha256(identity.encode()).hexdigest()[:16]
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in server.name)[:60]
    return Path(settings.VAR_DIR) / "mcp" / f"{safe}-{digest}.tools.json"


def _read_listing_cache(server: McpServer) -> list[dict] | None:
    try:
        listing = json.loads(_listing_cache_path(server).read_text())
    except (OSError, ValueError):
        return None
    return listing if isinstance(listing, list) else None


def _write_listing_cache(server: McpServer, listing: list[dict]) -> None:
    path = _listing_cache_path(server)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}")
        partial.write_text(json.dumps(listing, indent=1, sort_keys=True))
        partial.replace(path)  # readers see the old listing or the new one, never half
    except OSError:
        pass  # a cache: the next process lists again


def _register_listing(
    server: McpServer,
    listing: Sequence[Mapping[str, Any]],
    include: Sequence[str] | None,
    config: Mapping[str, McpToolConfig],
) -> dict[str, McpTool]:
    offered = {t["name"]: t for t in listing}
    wanted = list(include) if include is not None else list(offered)
    named = {cfg.verification.tool for cfg in config.values() if cfg.verification} | {
        cfg.lookup_tool for cfg in config.values() if cfg.lookup_tool
    }
    unknown = sorted((set(wanted) | set(config) | named) - set(offered))
    if unknown:
        raise McpSetupError(f"MCP server {server.name!r} has no tools named {unknown}")
    return {name: _register_one(server, offered[name], config.get(name)) for name in wanted}


def _register_one(server: McpServer, spec: Mapping[str, Any], cfg: McpToolConfig | None):
    cfg = cfg or McpToolConfig()
    mcp_name = spec["name"]
    meta = metadata_from_annotations(spec.get("annotations"))
    if cfg.verification is not None:
        # A server's idempotentHint is a claim; with a verification the read decides, and an
        # undecided read goes to a person rather than to a blind resend.
        meta["dedupes_by_key"] = False
    for key in ("side_effect", "risk", "dedupes_by_key"):
        if getattr(cfg, key) is not None:
            meta[key] = getattr(cfg, key)
    name = cfg.name or f"mcp.{server.name}.{mcp_name}"
    schema = _model_schema(spec.get("inputSchema") or {"type": "object"}, cfg.key_argument)
    description = spec.get("description") or spec.get("title") or ""
    tool = McpTool(
        name=name,
        invoke=_invoker(server, mcp_name, meta["side_effect"], cfg),
        lookup=_lookup(server, cfg),
        verification=_verification(server, cfg),
        settle_seconds=cfg.settle_seconds,
        target=cfg.target or (lambda params, _n=mcp_name: f"mcp:{server.name}/{_n}"),
        scope=cfg.scope,
        timeout=cfg.timeout,
        compensating_tool=cfg.compensating_tool,
        compensation_params=cfg.compensation_params,
        fallback_tool=cfg.fallback_tool,
        params_schema=flat_schema(schema),
        description=description,
        server=server.name,
        mcp_name=mcp_name,
        input_schema=schema,
        annotations=dict(spec.get("annotations") or {}),
        **meta,
    )
    tool_registry.register(tool, replace=True)
    set_tool_info(
        name,
        AgentToolInfo(
            input_schema=schema,
            description=description,
            needs_approval=cfg.needs_approval,
            approval_reason=cfg.approval_reason,
            queue=cfg.queue,
        ),
    )
    return tool


def server_from_sdk(sdk_server: Any, *, timeout: float | None = None) -> McpServer:
    """TaskPilots' McpServer for an OpenAI Agents SDK MCP server (`MCPServerStdio`,
    `MCPServerStreamableHttp`), so its tools are called through the engine's protocol. The
    server's name, made safe for tool names, names its tools: mcp.<name>.<tool>."""
    if type(sdk_server).__name__ == "MCPServerSse":  # its params carry a url too
        raise McpSetupError(
            f"MCP server {sdk_server.name!r}: the SSE transport is not supported under "
            "TaskPilots; use MCPServerStreamableHttp or MCPServerStdio"
        )
    name = "".join(c if c.isalnum() or c in "-_" else "_" for c in sdk_server.name).strip("_")
    name = name[:60] or "server"
    params = getattr(sdk_server, "params", None)
    limit = timeout or float(getattr(sdk_server, "client_session_timeout_seconds", 0) or 0) or 30.0
    command = getattr(params, "command", None)
    if command:
        return McpServer(
            name,
            command=[command, *(params.args or [])],
            env=dict(params.env) if params.env else None,
            cwd=str(params.cwd) if params.cwd else None,
            timeout=max(limit, 30.0),
        )
    if isinstance(params, Mapping) and params.get("url"):
        if params.get("headers") or params.get("httpx_client_factory"):
            raise McpSetupError(
                f"MCP server {sdk_server.name!r}: custom headers or HTTP clients are not "
                "supported under TaskPilots yet; put the credentials in the server's URL "
                "handling or run it over stdio"
            )
        return McpServer(name, url=str(params["url"]), timeout=max(limit, 30.0))
    raise McpSetupError(
        f"MCP server {sdk_server.name!r} ({type(sdk_server).__name__}) is not supported under "
        "TaskPilots: use MCPServerStdio or MCPServerStreamableHttp"
    )


def mcp_function_tools(registered: Mapping[str, Tool]) -> list:
    """SDK function tools (named as on the MCP server) for tools from register_mcp_tools."""
    from runs.agents.function_tools import function_tool_for

    return [function_tool_for(tool.name, name=mcp_name) for mcp_name, tool in registered.items()]


def python_command(script: str) -> list[str]:
    """A stdio command running `script` with this interpreter (the worker's virtualenv)."""
    return [sys.executable, script]

"""MCP sessions are lazy and per process: registering a server starts nothing; its tools are
listed on first use (and cached in a file, for processes that must not connect, such as the
console); a stdio session is reused across calls and closed at shutdown."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time

import pytest
from django.conf import settings

from runs import tools as tool_registry
from runs.agents import mcp
from runs.agents.mcp import McpServer, McpToolConfig, McpToolset, register_mcp_tools
from runs.tools import CallContext, ToolError
from taskpilots.demo import agent as demo


def call_context(key="k-lazy"):
    return CallContext(idempotency_key=key, run_id="r-1", step="s", attempt=1, timeout=20.0)


def counting_server(tmp_path, name: str) -> tuple[McpServer, object]:
    """The demo's MCP server behind a wrapper that notes each start in a file."""
    starts = tmp_path / f"{name}.starts"
    wrapper = tmp_path / f"{name}.py"
    wrapper.write_text(
        "import os, runpy, sys\n"
        f"open({str(starts)!r}, 'a').write(str(os.getpid()) + '\\n')\n"
        f"sys.argv = [{str(demo.SERVER_SCRIPT)!r}]\n"
        f"runpy.run_path({str(demo.SERVER_SCRIPT)!r}, run_name='__main__')\n"
    )
    server = McpServer(
        name,
        command=[sys.executable, str(wrapper)],
        env=lambda: {"TASKPILOTS_SANDBOX_URL": settings.TASKPILOTS["SANDBOX_URL"]},
        timeout=20,
    )
    return server, starts


def started(starts) -> list[int]:
    return [int(line) for line in starts.read_text().split()] if starts.exists() else []


@pytest.fixture
def var_dir(tmp_path, settings):
    settings.VAR_DIR = tmp_path / "var"
    return settings.VAR_DIR


def test_registering_starts_no_server_and_the_first_use_lists_once(tmp_path, var_dir, sandbox):
    server, starts = counting_server(tmp_path, "lazy_a")
    tools = register_mcp_tools(
        server,
        include=["crm_lookup", "update_ticket"],
        config={"update_ticket": McpToolConfig(target=lambda p: f"ticket:{p['ticket_id']}")},
    )
    assert isinstance(tools, McpToolset)
    assert started(starts) == []  # nothing connected at registration
    assert "mcp.lazy_a.crm_lookup" not in tool_registry.all_tools()  # nothing cached yet
    # The first get of one of its names lists the tools, in this process.
    ticket = tool_registry.get("mcp.lazy_a.update_ticket")
    assert ticket.mcp_name == "update_ticket" and ticket.annotations is not None
    result = ticket.invoke({"ticket_id": "T-7", "status": "solved"}, call_context("k-lazy-1"))
    assert result.external_id
    tool_registry.get("mcp.lazy_a.crm_lookup").invoke({"email": "ann@example.com"}, call_context())
    # One server process for the listing and both calls: the session is kept.
    assert len(started(starts)) == 1
    assert sorted(tools) == ["crm_lookup", "update_ticket"]
    assert list((var_dir / "mcp").glob("lazy_a-*.tools.json"))
    assert mcp.close_connections() >= 1


def test_a_process_that_must_not_connect_uses_the_cached_listing(tmp_path, var_dir, sandbox):
    server, starts = counting_server(tmp_path, "lazy_b")
    register_mcp_tools(server, include=["crm_lookup"]).resolve()  # a worker listed them
    mcp.close_connections()
    assert len(started(starts)) == 1
    # Another process (here: a fresh toolset for the same server), e.g. the console.
    again = McpToolset(server, include=["crm_lookup"])
    assert list(again.resolve(connect=False)) == ["crm_lookup"]
    assert len(started(starts)) == 1


def test_an_unreachable_server_is_an_outage_for_the_call_that_asked(var_dir):
    gone = McpServer("lazy_gone", command=["/nonexistent/mcp-server"], timeout=5)
    register_mcp_tools(gone)
    with pytest.raises(ToolError) as outage:
        tool_registry.get("mcp.lazy_gone.anything")
    assert outage.value.failure_class == "outage"
    assert "cannot list the tools" in outage.value.message


def test_closing_the_sessions_stops_the_stdio_server(tmp_path, var_dir, sandbox):
    mcp.close_connections()  # sessions other tests left open in this process
    server, starts = counting_server(tmp_path, "lazy_c")
    tool = register_mcp_tools(server, include=["crm_lookup"])["crm_lookup"]
    tool.invoke({"email": "ann@example.com"}, call_context())
    (pid,) = started(starts)
    os.kill(pid, 0)  # running
    assert mcp.close_connections() == 1
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        with contextlib.suppress(ChildProcessError):  # reap it if it is our child
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.1)
    else:
        pytest.fail(f"the MCP server {pid} still runs after close_connections()")


def test_a_call_made_while_this_thread_runs_an_event_loop_still_works(sandbox):
    # Async code calling in (or a library keeping a loop running in this thread, as
    # Playwright's sync API does) must not break a session opened per call.
    import asyncio

    server = McpServer(
        "lazy_loop",
        command=[sys.executable, str(demo.SERVER_SCRIPT)],
        env=lambda: {"TASKPILOTS_SANDBOX_URL": settings.TASKPILOTS["SANDBOX_URL"]},
        keep_alive=False,
        timeout=20,
    )

    async def inside_a_loop():
        return mcp.list_tools(server)

    # In a thread of its own: this one may already run a loop (Playwright's, in the full suite).
    found: dict = {}
    thread = threading.Thread(target=lambda: found.update(listing=asyncio.run(inside_a_loop())))
    thread.start()
    thread.join(60)
    assert "crm_lookup" in {t["name"] for t in found["listing"]}

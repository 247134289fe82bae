"""The third-party MCP servers the peer drills and tests run against, as installed here.

- `@modelcontextprotocol/server-filesystem` (npm): pinned by `package.json` and
  `package-lock.json` beside this file; `make peers` (and so `make test`) installs it with
  `npm ci` into var/peers (TASKPILOTS_PEERS_DIR elsewhere), outside git. It runs with node, never
  npx: nothing is fetched at run time.
- `mcp-server-git` (PyPI): in pyproject's `dev` extra, pinned in constraints.txt; it runs with
  this interpreter (`python -m mcp_server_git`).

A peer that is not installed raises `PeerMissing` with the command that installs it: a test that
needs one fails with that message, never skips.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FILESYSTEM_PACKAGE = "@modelcontextprotocol/server-filesystem"


class PeerMissing(RuntimeError):
    pass


def peers_dir() -> Path:
    return Path(os.environ.get("TASKPILOTS_PEERS_DIR") or ROOT / "var" / "peers")


def filesystem_command() -> list[str]:
    """The command that starts the filesystem server (its allowed directories go after it)."""
    script = peers_dir() / "node_modules" / FILESYSTEM_PACKAGE / "dist" / "index.js"
    node = shutil.which("node")
    if not script.is_file() or node is None:
        what = "node is not on PATH" if node is None else f"{script} is missing"
        raise PeerMissing(
            f"The MCP filesystem server ({FILESYSTEM_PACKAGE}) is not installed: {what}. "
            "Run `make peers` (make test does it), which installs it with npm ci from "
            "taskpilots/peers/package-lock.json into var/peers."
        )
    return [node, str(script)]


def git_command() -> list[str]:
    """The command that starts the git server (`--repository <repo>` goes after it)."""
    if importlib.util.find_spec("mcp_server_git") is None:
        raise PeerMissing(
            "The MCP git server (mcp-server-git) is not installed in this virtualenv. Run "
            "`make install` (make test does it), or pip install -c constraints.txt '.[dev]'."
        )
    return [sys.executable, "-m", "mcp_server_git"]

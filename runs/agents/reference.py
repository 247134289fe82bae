"""Reference configurations for two third-party MCP servers: the worked examples of
reconciliation by verification (docs/agents.md).

    from runs.agents.mcp import mcp_function_tools, register_mcp_tools
    from runs.agents.reference import FILESYSTEM_CONFIG, GIT_CONFIG, filesystem_server, git_server

    files = register_mcp_tools(filesystem_server("/srv/notes"),
                               include=["read_text_file", "write_file", "edit_file"],
                               config=FILESYSTEM_CONFIG)
    repo = register_mcp_tools(git_server("/srv/site"),
                              include=["git_status", "git_add", "git_commit"], config=GIT_CONFIG)
    agent = Agent(..., tools=[*mcp_function_tools(files), *mcp_function_tools(repo)])

The servers are the reference filesystem server (`@modelcontextprotocol/server-filesystem`,
npm, version FILESYSTEM_VERSION) and the reference git server (`mcp-server-git`, PyPI). Neither
has a tool that says whether a keyed call happened, and neither reads our idempotency key: a
worker that dies after the intent is written and before the receipt leaves a call nobody can
ask about. Each side-effecting tool below therefore declares a verification — a read tool of the
same server, and a function that recognises the call's effect in what it answers — so that after
a crash the engine reads instead of guessing: True, the effect is there (recorded with the read
as its commit proof, nothing is sent again); False, it is not (once the settle window has passed
the call is made again under the same key); None, the read cannot tell (a person decides, with
the read in the timeline). What makes each answer sound:

write_file (`read_text_file` of the path; baseline: the same read just before the first call)
- True when the file holds exactly the content the call wrote. That is sound even if the content
  was already there, or someone else wrote the same bytes: the effect a write asks for is "this
  file has this content", and writing identical content again would change nothing, so taking
  it as done can never lose or double anything.
- False only when the file is as the baseline saw it just before the call (the same content, or
  missing then and now: ENOENT is an answer, not a failed read). The server writes an existing
  file to a temporary file and renames it over the old one (atomic), so a file that is unchanged
  has not been written.
- None otherwise: the file changed, but not to our content (another writer, or a new file
  written only in part: the server's first write of a new file is not atomic), or the read
  failed for another reason (access denied, not a regular file). Resending then could overwrite
  someone else's change, so a person decides. The server's `idempotentHint` would have the
  engine resend blindly; `dedupes_by_key=False` here lets the verification decide instead.
- Commit proof: `<path>@sha256:<hex>` of the content (from the parameters on an answered call,
  from what the read saw after a crash: the same bytes).

edit_file (`read_text_file`; baseline as for write_file)
- The server applies each edit to the file with its line endings normalised to LF, replacing
  the first exact occurrence of `oldText` (a whitespace-tolerant line match when there is
  none). From the baseline the expected result is computed the same way for exact matches:
  True when the file now holds it; False when the file is still as the baseline saw it (an edit
  that changes nothing is True first); None otherwise — an edit the server would have matched
  loosely is not predicted, and a file that changed in another way is not ours to overwrite.
  Resending an applied edit is not harmless (its `oldText` may be gone, or match again), which
  is why the read decides. A dry run changes nothing: it is False, and resent.
- Commit proof: after a crash `<path>@sha256:<hex>` of the file the read saw; on an answered
  call the server reports the diff and not the content, so `<path>@diff-sha256:<hex>` of it.

git_commit (`git_log` of the current branch, 50 entries; baseline: the same log before the call)
- The commit's effect is a new commit on the current branch with the model's message, so True
  when the log shows, above the baseline's HEAD, a commit whose message is exactly the
  parameters' message. The idempotency key is not written into the message (a trailer would
  make the match exact, but the commit is the model's and a person's to read, and its message
  must stay as asked); the baseline makes up for it: a commit older than the call with the same
  message is not taken for this one. Only another writer committing the same message in the
  window between the baseline and the check could be mistaken for it.
- False when no commit above the baseline's HEAD has that message (HEAD unmoved, or moved by
  other commits only). Resending is then what the call would have done; the server refuses a
  commit with nothing staged, so even a resend after a commit the log did not show could not
  commit the same changes twice.
- None when the baseline's HEAD is not in the log any more (history rewritten, a branch
  switched, or more than 50 commits since), when a log cannot be read, or when there was no
  baseline.
- Commit proof: the commit hash (from the answer's text, "... with hash <sha>", or from the log).

git_add: staging the same paths again stages the working tree as it is, nothing more, so it
is declared to dedupe (the server says `idempotentHint` too): after a crash it is resent.
"""

from __future__ import annotations

import hashlib
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from runs.agents.mcp import McpRead, McpServer, McpToolConfig, McpVerification

FILESYSTEM_PACKAGE = "@modelcontextprotocol/server-filesystem"
# The version whose behaviour the verifications above were checked against (atomic rename of an
# existing file, the edit algorithm, ENOENT wording, the git log format of mcp-server-git
# 2026.10.19); tests/agents/test_real_peers.py runs them against the pinned servers.
FILESYSTEM_VERSION = "2026.8.31"
GIT_LOG_ENTRIES = 50


def filesystem_server(
    root: str | Path,
    *,
    name: str = "fs",
    command: Sequence[str] = ("npx", "-y", f"{FILESYSTEM_PACKAGE}@{FILESYSTEM_VERSION}"),
    **options: Any,
) -> McpServer:
    """The filesystem server confined to `root` (its allowed directory, appended to `command`).
    `command` starts the server: e.g. `("node", ".../server-filesystem/dist/index.js")` for an
    installed copy. `options` go to McpServer (timeout, env, keep_alive)."""
    return McpServer(name, command=[*command, str(root)], cwd=str(root), **options)


def git_server(
    repo: str | Path,
    *,
    name: str = "git",
    command: Sequence[str] = (sys.executable, "-m", "mcp_server_git"),
    **options: Any,
) -> McpServer:
    """The git server confined to the repository `repo` (`--repository`, appended to `command`;
    the default runs the mcp-server-git installed beside TaskPilots)."""
    return McpServer(name, command=[*command, "--repository", str(repo)], cwd=str(repo), **options)


# --------------------------------------------------------------------------------------------
# Files


def content_digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def file_proof(path: str, text: str) -> str:
    """The commit proof of a file's content: `<path>@sha256:<hex>`."""
    return f"{path}@sha256:{content_digest(text)}"


_MISSING = object()  # a read that says the file is not there
_UNKNOWN = object()  # a read that says nothing about the file


def _file_state(read: McpRead | None):
    """The file's text, _MISSING (the server answered ENOENT) or _UNKNOWN."""
    if read is None:
        return _UNKNOWN
    if read.ok:
        if isinstance(read.result, Mapping) and isinstance(read.result.get("content"), str):
            return read.result["content"]
        return read.text
    return _MISSING if "ENOENT" in read.text else _UNKNOWN


def _read_path(params: dict) -> dict:
    return {"path": params["path"]}


def recognise_write(params: dict, observed: McpRead, baseline: McpRead | None) -> bool | None:
    now = _file_state(observed)
    if now == params["content"]:
        return True
    before = _file_state(baseline)
    if now is _UNKNOWN or before is _UNKNOWN:
        return None
    if now == before:  # as it was just before the call (both missing, or the same text)
        return False
    return None  # changed, not to our content: resending could overwrite someone else's change


def normalise_line_endings(text: str) -> str:
    return text.replace("\r\n", "\n")


def expected_after_edits(text: str, edits: Sequence[Mapping[str, str]]) -> str | None:
    """What edit_file leaves of `text`, for edits that match exactly (the server's first rule);
    None when one would need the server's whitespace-tolerant match (not predicted here)."""
    result = normalise_line_endings(text)
    for edit in edits:
        old = normalise_line_endings(edit["oldText"])
        if old not in result:
            return None
        result = result.replace(old, normalise_line_endings(edit["newText"]), 1)
    return result


def recognise_edit(params: dict, observed: McpRead, baseline: McpRead | None) -> bool | None:
    if params.get("dryRun"):
        return False  # a dry run changes nothing: making it again is harmless
    before, now = _file_state(baseline), _file_state(observed)
    if not isinstance(before, str):
        # The file could not be edited as it was (missing: the server refuses the edit).
        return False if before is _MISSING and now is _MISSING else None
    if not isinstance(now, str):
        return None
    if now == expected_after_edits(before, params["edits"]):
        return True
    if now == before:
        return False
    return None


def _proof_from_read(params: dict, observed: McpRead, baseline: McpRead | None) -> str:
    state = _file_state(observed)
    return file_proof(params["path"], state) if isinstance(state, str) else ""


def _edit_proof(params: dict, value: Any) -> str:
    diff = value.get("content") if isinstance(value, Mapping) else value
    return f"{params['path']}@diff-sha256:{content_digest(str(diff))}"


def _file_target(params: dict) -> str:
    return f"file:{params['path']}"


def filesystem_config() -> dict[str, McpToolConfig]:
    """{tool: McpToolConfig} for the filesystem server's write tools (see the module
    docstring). Other tools keep what their annotations say."""
    return {
        "write_file": McpToolConfig(
            dedupes_by_key=False,  # the server's idempotentHint, but the read decides
            target=_file_target,
            verification=McpVerification(
                tool="read_text_file",
                arguments=_read_path,
                recognise=recognise_write,
                baseline=True,
                external_id=_proof_from_read,
                description="read_text_file: the file holds the written content",
            ),
            external_id=lambda params, value: file_proof(params["path"], params["content"]),
        ),
        "edit_file": McpToolConfig(
            dedupes_by_key=False,
            target=_file_target,
            verification=McpVerification(
                tool="read_text_file",
                arguments=_read_path,
                recognise=recognise_edit,
                baseline=True,
                external_id=_proof_from_read,
                description="read_text_file: the file holds the baseline with the edits applied",
            ),
            external_id=_edit_proof,
        ),
    }


FILESYSTEM_CONFIG = filesystem_config()


# --------------------------------------------------------------------------------------------
# Git

_ENTRY = re.compile(r"^Commit: ([0-9a-f]{40})\nAuthor: [^\n]*\nDate: [^\n]*\nMessage: ", re.M)
_COMMIT_HASH = re.compile(r"\bhash ([0-9a-f]{40})\b")


def _log_head(read: McpRead | None):
    """The newest commit of a git_log answer: its hash, "" for a branch with no commit yet (the
    server answers that the branch's reference does not exist), or None (cannot tell)."""
    if read is None:
        return None
    if not read.ok:
        return "" if re.search(r"Reference at '[^']*' does not exist", read.text) else None
    first = _ENTRY.search(read.text)
    return first.group(1) if first else None


def _new_commit_with(text: str, message: str, base: str):
    """The hash of a commit above `base` ("" for none: every commit is new) whose message is
    exactly `message`, "" when there is none, None when `base` is not in the log.

    The log renders each entry as "Commit: <sha>\\nAuthor: ..\\nDate: ..\\nMessage: <message>\\n",
    entries joined by a blank line. The message is matched where an entry's header puts it and
    must end the entry, so a message quoting a log entry of its own cannot pass for another."""
    headers = list(_ENTRY.finditer(text))
    base_at = next((h.start() for h in headers if h.group(1) == base), None) if base else len(text)
    if base_at is None:
        return None
    for header in headers:
        if header.start() >= base_at:
            break
        rest = text[header.end() :]
        if rest == message + "\n" or (
            rest.startswith(message + "\n\n") and _ENTRY.match(rest, len(message) + 2)
        ):
            return header.group(1)
    return ""


def recognise_commit(params: dict, observed: McpRead, baseline: McpRead | None) -> bool | None:
    base, head = _log_head(baseline), _log_head(observed)
    if base is None or head is None:
        return None
    if head == "":  # no commit on the branch now
        return False if base == "" else None
    found = _new_commit_with(observed.text, params["message"], base)
    return None if found is None else bool(found)


def _commit_from_log(params: dict, observed: McpRead, baseline: McpRead | None) -> str:
    base = _log_head(baseline)
    return _new_commit_with(observed.text, params["message"], base or "") or ""


def _commit_from_answer(params: dict, value: Any) -> str:
    found = _COMMIT_HASH.search(str(value))
    return found.group(1) if found else ""


def _git_log(params: dict) -> dict:
    return {"repo_path": params["repo_path"], "max_count": GIT_LOG_ENTRIES}


def git_config() -> dict[str, McpToolConfig]:
    """{tool: McpToolConfig} for the git server's git_commit and git_add (see the module
    docstring)."""
    return {
        "git_commit": McpToolConfig(
            dedupes_by_key=False,
            target=lambda params: f"git:{params['repo_path']}",
            verification=McpVerification(
                tool="git_log",
                arguments=_git_log,
                recognise=recognise_commit,
                baseline=True,
                external_id=_commit_from_log,
                description="git_log: a commit above the baseline's HEAD with this message",
            ),
            external_id=_commit_from_answer,
        ),
        "git_add": McpToolConfig(
            dedupes_by_key=True,  # staging the same paths again adds nothing more
            target=lambda params: f"git:{params['repo_path']}",
        ),
    }


GIT_CONFIG = git_config()

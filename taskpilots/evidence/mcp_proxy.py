"""A stdio MCP proxy that counts, on the receiving side, the tool calls that reached a server.

    python -m taskpilots.evidence.mcp_proxy --log calls.jsonl [--hold write_file] -- node fs.js /srv

It starts the server command after `--`, forwards every line between its own stdin/stdout and
the server's byte for byte (MCP's stdio transport is one JSON-RPC message a line), and appends
to the log, one JSON object a line:

- `{"dir": "request", "tool", "key", "id", "arguments_sha256", …}` for each `tools/call`
  request, once it has been written to the server's stdin: the request reached the server;
- `{"dir": "answer", "tool", "key", "id", "is_error", "text", "held", …}` for the server's answer
  to it, before that answer is forwarded. With `--hold TOOL` (repeatable) the answers to calls
  of that tool are logged and never forwarded: the client waits, as for a server that took the
  request and then went quiet. It is the accomplice of the during-call crash
  (taskpilots/evidence/faults.py), which kills the worker once the answer is held.

`key` is the call's TaskPilots idempotency key (`_meta["taskpilots/idempotency-key"]`), so a
log tells which run's call reached the server, and how often. The proxy changes nothing it
forwards: what the server sees and what the client gets are what they would have been without
it, so "the proxy logged no request" proves nothing was sent.

When the client goes away (its end of stdin closes, e.g. its worker was SIGKILLed), the proxy
closes the server's stdin and keeps logging what the server still answers until it exits.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

META_KEY = "taskpilots/idempotency-key"
# How long the server may take to exit once its client is gone.
EXIT_GRACE_SECONDS = 10.0


class CallLog:
    """The proxy's log: appended one line per write (O_APPEND), so the proxies of several
    worker processes can share one file."""

    def __init__(self, path: Path):
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def append(self, entry: dict) -> None:
        line = json.dumps({"t": time.time(), "pid": os.getpid(), **entry}, default=str) + "\n"
        os.write(self.fd, line.encode())


def read_log(path: Path | str) -> list[dict]:
    """Every entry of a proxy log (none when it does not exist yet)."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return []
    entries = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            entries.append(json.loads(line))
    return entries


def requests(path: Path | str, tool: str | None = None, key: str | None = None) -> list[dict]:
    """The tools/call requests that reached the server (of `tool`, with idempotency `key`)."""
    return [
        e
        for e in read_log(path)
        if e.get("dir") == "request"
        and (tool is None or e.get("tool") == tool)
        and (key is None or e.get("key") == key)
    ]


def answers(path: Path | str, key: str) -> int:
    """How many calls carrying this idempotency key the server answered (held or forwarded):
    the write, and the verification reads made for it, which carry its key too."""
    return sum(1 for e in read_log(path) if e.get("dir") == "answer" and e.get("key") == key)


class Proxy:
    def __init__(self, command: list[str], log: CallLog, hold: frozenset[str]):
        self.log = log
        self.hold = hold
        self.pending: dict[str, dict] = {}  # JSON-RPC id -> the call it answers
        self.lock = threading.Lock()
        self.server = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.out = sys.stdout.buffer

    def client_to_server(self) -> None:
        assert self.server.stdin is not None
        try:
            for line in sys.stdin.buffer:
                calls = self._calls_in(line)
                self.server.stdin.write(line)
                self.server.stdin.flush()
                for call in calls:
                    self.log.append({"dir": "request", **call})
        except (BrokenPipeError, OSError):
            pass  # the server went away; its end is logged by the other direction
        finally:
            with contextlib.suppress(OSError):
                self.server.stdin.close()

    def server_to_client(self) -> None:
        assert self.server.stdout is not None
        forwarding = True
        for line in self.server.stdout:
            held = False
            for call, answer in self._answers_in(line):
                held = held or call["tool"] in self.hold
                self.log.append(
                    {
                        "dir": "answer",
                        **call,
                        "is_error": bool(answer.get("error"))
                        or bool((answer.get("result") or {}).get("isError")),
                        "text": _answer_text(answer)[:500],
                        "held": call["tool"] in self.hold,
                    }
                )
            if held or not forwarding:
                continue
            try:
                self.out.write(line)
                self.out.flush()
            except (BrokenPipeError, OSError):
                forwarding = False  # the client is gone: keep logging what the server says

    def _calls_in(self, line: bytes) -> list[dict]:
        found = []
        for message in _messages(line):
            if message.get("method") != "tools/call" or "id" not in message:
                continue
            params = message.get("params") or {}
            arguments = params.get("arguments") or {}
            call = {
                "id": message["id"],
                "tool": params.get("name", ""),
                "key": (params.get("_meta") or {}).get(META_KEY, ""),
                "arguments_sha256": hashlib.sha256(
                    json.dumps(arguments, sort_keys=True).encode()
                ).hexdigest(),
            }
            with self.lock:
                self.pending[json.dumps(message["id"])] = call
            found.append(call)
        return found

    def _answers_in(self, line: bytes) -> list[tuple[dict, dict]]:
        found = []
        for message in _messages(line):
            if "id" not in message or not ("result" in message or "error" in message):
                continue
            with self.lock:
                call = self.pending.pop(json.dumps(message["id"]), None)
            if call is not None:
                found.append((call, message))
        return found

    def run(self) -> int:
        feeder = threading.Thread(target=self.client_to_server, daemon=True, name="to-server")
        feeder.start()
        self.server_to_client()  # until the server closes its stdout
        try:
            return self.server.wait(EXIT_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            self.server.kill()
            return self.server.wait()


def _messages(line: bytes) -> list[dict]:
    try:
        parsed = json.loads(line)
    except ValueError:
        return []
    items = parsed if isinstance(parsed, list) else [parsed]
    return [m for m in items if isinstance(m, dict)]


def _answer_text(answer: dict) -> str:
    if answer.get("error"):
        return str(answer["error"].get("message", ""))
    content = (answer.get("result") or {}).get("content") or []
    return " ".join(b.get("text", "") for b in content if isinstance(b, dict))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--log", required=True, type=Path, help="append the calls here")
    parser.add_argument(
        "--hold", action="append", default=[], help="never forward this tool's answers"
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the server's command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the server's command after --")
    hold = frozenset(t for item in args.hold for t in item.split(",") if t)
    return Proxy(command, CallLog(args.log), hold).run()


if __name__ == "__main__":
    sys.exit(main())

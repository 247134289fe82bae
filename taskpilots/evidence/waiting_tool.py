"""The waiting tool of `bench io`: an HTTP server that answers every call after L ms, counting on
the receiving side what the callers cannot see for themselves.

    python -m taskpilots.evidence.waiting_tool --latency-ms 500 [--port 0]

Prints `listening on <port>` once ready. Without Django, on asyncio, so thousands of waiting calls
cost no threads here and the figures are the callers'. Per side (`taskpilots`, `dbos`, anything
else a caller names in the path) it counts calls in flight and their peak, and every idempotency
key it received, so a key received twice is a duplicate effect.

    POST /call/<side>        Idempotency-Key header; answers {"id": "w-<key>"} after L ms
    GET  /lookup/<side>?key= 200 {"found": true, "id": ...} when the key arrived, else 404
    GET  /_stats             every side's counters (with ?keys=1 the keys received)
    POST /_reset/<side>      forget a side (after a warm-up)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

MAX_HEADER_BYTES = 16 * 1024
MAX_BODY_BYTES = 256 * 1024


@dataclass
class Side:
    in_flight: int = 0
    peak_in_flight: int = 0
    calls: int = 0
    answered: int = 0
    without_key: int = 0
    keys: Counter = field(default_factory=Counter)
    first_call_at: float | None = None
    last_answer_at: float | None = None

    def summary(self, with_keys: bool) -> dict:
        duplicates = {key: count for key, count in self.keys.items() if count > 1}
        summary = {
            "in_flight": self.in_flight,
            "peak_in_flight": self.peak_in_flight,
            "calls": self.calls,
            "answered": self.answered,
            "without_key": self.without_key,
            "distinct_keys": len(self.keys),
            "duplicate_keys": len(duplicates),
            "duplicate_examples": sorted(duplicates)[:5],
            "first_call_at": self.first_call_at,
            "last_answer_at": self.last_answer_at,
        }
        if with_keys:
            summary["keys"] = sorted(self.keys)
        return summary


class WaitingTool:
    def __init__(self, latency_ms: float):
        self.latency = latency_ms / 1000
        self.sides: dict[str, Side] = {}

    def side(self, name: str) -> Side:
        return self.sides.setdefault(name, Side())

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                request = await _read_request(reader)
                if request is None:
                    break
                method, target, headers, _body = request
                status, payload = await self.answer(method, target, headers)
                keep_alive = headers.get("connection", "").lower() != "close"
                await _write_response(writer, status, payload, keep_alive)
                if not keep_alive:
                    break
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            writer.close()

    async def answer(self, method: str, target: str, headers: dict) -> tuple[int, dict]:
        url = urlsplit(target)
        parts = [part for part in url.path.split("/") if part]
        if method == "POST" and len(parts) == 2 and parts[0] == "call":
            return await self.call(self.side(parts[1]), headers.get("idempotency-key", ""))
        if method == "GET" and len(parts) == 2 and parts[0] == "lookup":
            key = parse_qs(url.query).get("key", [""])[0]
            if key and key in self.side(parts[1]).keys:
                return 200, {"found": True, "id": f"w-{key}"}
            return 404, {"found": False}
        if method == "GET" and parts == ["_stats"]:
            with_keys = parse_qs(url.query).get("keys") == ["1"]
            return 200, {name: s.summary(with_keys) for name, s in self.sides.items()}
        if method == "POST" and len(parts) == 2 and parts[0] == "_reset":
            self.sides.pop(parts[1], None)
            return 200, {"reset": parts[1]}
        return 404, {"error": f"no such endpoint: {method} {url.path}"}

    async def call(self, side: Side, key: str) -> tuple[int, dict]:
        # Counted on arrival: from here on the effect has landed, whatever the caller hears.
        side.calls += 1
        side.in_flight += 1
        side.peak_in_flight = max(side.peak_in_flight, side.in_flight)
        if side.first_call_at is None:
            side.first_call_at = time.time()
        if key:
            side.keys[key] += 1
        else:
            side.without_key += 1
        try:
            await asyncio.sleep(self.latency)
        finally:
            side.in_flight -= 1
        side.answered += 1
        side.last_answer_at = time.time()
        return 200, {"id": f"w-{key}"}


async def _read_request(reader: asyncio.StreamReader):
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None  # the caller closed an idle keep-alive connection
    except asyncio.LimitOverrunError:
        raise ValueError("request head too large") from None
    lines = head.decode("latin-1").split("\r\n")
    method, target, _version = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0") or 0)
    if length > MAX_BODY_BYTES:
        raise ValueError("request body too large")
    body = await reader.readexactly(length) if length else b""
    return method, target, headers, body


async def _write_response(writer, status: int, payload: dict, keep_alive: bool) -> None:
    body = json.dumps(payload, separators=(",", ":")).encode()
    reason = {200: "OK", 404: "Not Found"}.get(status, "Error")
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: {'keep-alive' if keep_alive else 'close'}"
        "\r\n\r\n"
    )
    writer.write(head.encode() + body)
    await writer.drain()


async def serve(latency_ms: float, port: int) -> None:
    tool = WaitingTool(latency_ms)
    server = await asyncio.start_server(
        tool.handle, "127.0.0.1", port, backlog=4096, limit=MAX_HEADER_BYTES
    )
    print(f"listening on {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--latency-ms", type=float, required=True)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.latency_ms, args.port))


if __name__ == "__main__":
    main()

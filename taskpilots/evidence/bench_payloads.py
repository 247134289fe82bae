"""The payloads of `bench engine`, the same on both sides: run inputs and step results of 1–16 KB
(what agent runs carry: a message thread, a retrieved document, a created record), their size
drawn from the run's number so every measurement of every system gets the same ones."""

from __future__ import annotations

_TEXT = (
    "refund order customer ticket invoice shipment account billing support agent reply "
    "subscription renewal delivery address payment receipt escalation priority summary"
)
_WORDS = _TEXT.split()


def size_bytes(n: int, low_kb: int, high_kb: int) -> int:
    """Between low_kb and high_kb KiB, spread evenly over the run numbers (Knuth's hash)."""
    span = max(0, high_kb - low_kb) * 1024
    return low_kb * 1024 + ((n * 2654435761) % (span + 1) if span else 0)


def document(n: int, low_kb: int = 1, high_kb: int = 16) -> str:
    """Text of size_bytes(n, …): words, so it escapes as real text does. It does not compress as
    real text does: twenty words in a short cycle compress about fifty-fold (zlib), where prose
    compresses two- to threefold, so PostgreSQL stores these documents inline and cheaply."""
    size = size_bytes(n, low_kb, high_kb)
    if size <= 0:
        return ""
    words, total, i = [], 0, abs(n)
    while total < size:
        word = _WORDS[i % len(_WORDS)]
        words.append(word)
        total += len(word) + 1
        i = i * 31 + 7
    return " ".join(words)[:size]

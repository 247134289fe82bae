"""The benchmark's documents: the sizes asked for, the same in every process, different from run
to run, and compressing as prose does (not as a cycle of a few words, which costs nothing to
store)."""

from __future__ import annotations

import zlib

from taskpilots.evidence.bench_payloads import document, size_bytes


def test_documents_have_the_size_their_run_number_gives():
    for n in (-3, 0, 1, 7, 12_345, 10**9):
        doc = document(n)
        assert len(doc) == size_bytes(n, 1, 16)
        assert 1024 <= len(doc) <= 16 * 1024
    assert len(document(5, 12, 12)) == 12 * 1024
    assert document(5, 0, 0) == ""


def test_documents_are_the_same_every_time_and_differ_between_runs():
    assert document(42) == document(42)
    firsts = {document(n)[:64] for n in range(500)}
    assert len(firsts) == 500
    # Text: words and sentences, nothing JSON would need to escape beyond what prose has.
    assert all(ch.isprintable() for ch in document(99))
    assert ". " in document(99) or "? " in document(99) or "! " in document(99)


def test_documents_compress_as_prose_does():
    docs = [document(n).encode() for n in range(200)]
    raw = sum(map(len, docs))
    ratio = raw / sum(len(zlib.compress(doc, 6)) for doc in docs)
    # Prose: two- to threefold. The cycle of twenty words before 2026-12-07: about fifty-fold.
    assert 1.8 < ratio < 3.5, ratio

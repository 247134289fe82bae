"""The payloads of `bench engine`, the same on both sides: run inputs and step results of 1–16 KB
(what agent runs carry: a message thread, a retrieved document, a created record), their size
drawn from the run's number so every measurement of every system gets the same ones.

The text reads and compresses as a support thread does: sentences of words drawn from three
hundred, with order numbers, amounts and dates, which zlib compresses a little over twofold
(tests/taskpilots/test_bench_payloads.py) and PostgreSQL's lz4 and pglz by a third to a half, as
prose; so a document still over about 2 KB once compressed is stored out of line (TOAST) on both
sides, as a real one would be. (Until 2026-12-07 the documents cycled through twenty words and
compressed about fifty-fold, stored inline at almost no cost: the records before then were made
with those.) Each document is a slice of one corpus drawn once per process from a fixed seed."""

from __future__ import annotations

import functools
import random

_WORDS = """
a about account actually added address after again agent all also am an and answer any
anything app apply approved are as ask asked at available back balance bank be because been
before being below best bill billing both box but by call called can cancel cancelled card
case change charge charged check checked city close code confirm confirmed contact copy could
credit current customer date day days delay delivered delivery details did do does done double
due each email end error even every expected explain extra failed fee few file find first fix
fixed for form found free from full further get getting give go good got had has have help her
here him his hold how i if in info invoice is issue it item items just keep know last late
let like line link list look looks made make manager many may me message method might missing
month more most my name need needed never new next no not note now number of off on once one
online only open or order orders other our out over paid part password pay payment payments
people per phone plan please policy possible price problem process processed product provide
purchase quick rate really reason receipt received refund refunded regarding related reply
request requested return returned review right said same saw see sent service set shipment
shipped shipping should since so some soon still subscription summary support sure system
take team than thank thanks that the their them then there these they thing this through
ticket time to today told total tracking transfer tried two under understand until up update
updated us use used user via wait waiting want was we week were what when where which while
who why will with within without work would wrong year yes yesterday you your
"""
_VOCABULARY = tuple(_WORDS.split())

_CORPUS_CHARS = 1 << 20  # 1 MiB: every document is a slice of it
_SEED = 20261207


@functools.cache
def _corpus() -> str:
    """One megabyte of support-thread text, the same in every process (a fixed seed)."""
    draw = random.Random(_SEED)
    sentences, total = [], 0
    while total < _CORPUS_CHARS:
        words = draw.choices(_VOCABULARY, k=draw.randint(6, 18))
        for _ in range(draw.randint(0, 2)):  # an order, an amount or a date in some sentences
            kind = draw.randrange(3)
            words.insert(
                draw.randrange(len(words) + 1),
                (
                    f"#{draw.randint(10_000, 99_999_999)}",
                    f"${draw.randint(1, 4_999)}.{draw.randint(0, 99):02d}",
                    f"2026-{draw.randint(1, 12):02d}-{draw.randint(1, 28):02d}",
                )[kind],
            )
        sentence = " ".join(words)
        sentence = sentence[0].upper() + sentence[1:] + draw.choice(".....?!")
        sentences.append(sentence)
        total += len(sentence) + 1
    return " ".join(sentences)


def size_bytes(n: int, low_kb: int, high_kb: int) -> int:
    """Between low_kb and high_kb KiB, spread evenly over the run numbers (Knuth's hash)."""
    span = max(0, high_kb - low_kb) * 1024
    return low_kb * 1024 + ((n * 2654435761) % (span + 1) if span else 0)


def document(n: int, low_kb: int = 1, high_kb: int = 16) -> str:
    """Text of size_bytes(n, …): the slice of the corpus that starts where the run's number
    says, so documents of different runs differ."""
    size = size_bytes(n, low_kb, high_kb)
    if size <= 0:
        return ""
    corpus = _corpus()
    start = (abs(n) * 40503 * 4099) % (len(corpus) - size)
    return corpus[start : start + size]

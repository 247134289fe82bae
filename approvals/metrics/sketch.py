"""Durations as mergeable sketches: how many values fell in each logarithmic bucket.

Bucket `b` holds the values in (γ^(b-1), γ^b], with γ = (1 + α) / (1 − α) and α = 1 %, and
stands for 2γ^b / (γ + 1): within 1 % of every value in it (a DDSketch with fixed buckets).
Values ≤ MIN_VALUE (zero, or a clock's rounding below it) share bucket ZERO_BIN, which stands for
0. Two sketches add up bucket by bucket, so the day and hour rows keep a sketch each and a
window's statistics come from the sum of a few thousand bucket counts instead of from every
duration of every run.

Every median, p95 and mean on the dashboard is read from a sketch, whether its runs were
stored or computed live, so they are the same either way and within 1 % of the exact value.
Medians and p95 interpolate between the two ranks around q·(n − 1), as PostgreSQL's
`percentile_cont` does over the exact values.

SQL puts values in buckets (bin_sql: the rollup for the day and hour rows, the dashboard for
the runs it reads one by one); Python reads the statistics from the sketches added up
(statistics(): a few bisections per sketch, where SQL would sort and scan every bucket row).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from itertools import accumulate
from operator import mul

ACCURACY = 0.01
GAMMA = (1 + ACCURACY) / (1 - ACCURACY)
LN_GAMMA = math.log(GAMMA)
MIN_VALUE = 1e-6
ZERO_BIN = -32768
QUANTILES = {"p50": 0.5, "p90": 0.9, "p95": 0.95}


def bin_sql(value: str) -> str:
    """The bucket of the float8 `value` (an SQL expression)."""
    return (
        f"(CASE WHEN {value} <= {MIN_VALUE!r} THEN {ZERO_BIN} "
        f"ELSE ceil(ln({value}) / {LN_GAMMA!r})::int END)"
    )


def value_sql(bucket: str) -> str:
    """The value that the bucket `bucket` (an SQL expression) stands for."""
    return (
        f"(CASE WHEN {bucket} = {ZERO_BIN} THEN 0::float8 "
        f"ELSE {2 / (GAMMA + 1)!r} * power({GAMMA!r}, {bucket}) END)"
    )


# --------------------------------------------------------------------------------------------
# Reading sketches


@dataclass(frozen=True)
class Part:
    """One kind of duration of one sketch: its buckets in order, how many values fell in each
    of them and in it or below, and the sum of the values they stand for (for the mean)."""

    bins: list[int]
    counts: list[int]
    upto: list[int]
    weighted: float

    @classmethod
    def of(cls, bins: list[int], counts: list[int]) -> Part:
        weighted = sum(map(mul, counts, map(value_of, bins)))
        return cls(bins, counts, list(accumulate(counts)), weighted)

    @classmethod
    def merged(cls, parts: list[Part]) -> Part:
        """One part for the values of all of them."""
        total: dict[int, int] = {}
        for part in parts:
            for bucket, n in zip(part.bins, part.counts, strict=True):
                total[bucket] = total.get(bucket, 0) + n
        bins = sorted(total)
        counts = [total[bucket] for bucket in bins]
        return cls(bins, counts, list(accumulate(counts)), sum(p.weighted for p in parts))

    @property
    def n(self) -> int:
        return self.upto[-1]

    def below_or_in(self, bucket: int) -> int:
        at = bisect_right(self.bins, bucket)
        return self.upto[at - 1] if at else 0


# Above this many sketches, statistics() adds them up first rather than bisecting each.
_MERGE_ABOVE = 4


def parts(kinds: list[int], bins: list[int], counts: list[int]) -> dict[int, Part]:
    """A stored sketch (three parallel arrays sorted by kind and bucket) by kind."""
    found: dict[int, Part] = {}
    start = 0
    while start < len(kinds):
        kind = kinds[start]
        end = bisect_right(kinds, kind, lo=start)
        found[kind] = Part.of(bins[start:end], counts[start:end])
        start = end
    return found


def added(sketches: list[dict[int, Part]]) -> dict[int, Part]:
    """Sketches (by kind, as parts() gives them) added up into one."""
    kinds = sorted({kind for found in sketches for kind in found})
    return {kind: Part.merged([s[kind] for s in sketches if kind in s]) for kind in kinds}


def _kth(sketches: list[Part], k: int) -> int:
    """The bucket of the k-th smallest value (from 0) of the sketches added up."""
    if len(sketches) == 1:
        only = sketches[0]
        return only.bins[bisect_right(only.upto, k)]
    low, high = min(p.bins[0] for p in sketches), max(p.bins[-1] for p in sketches)
    while low < high:  # the first bucket with more than k values in it or below
        middle = (low + high) // 2
        if sum(p.below_or_in(middle) for p in sketches) > k:
            high = middle
        else:
            low = middle + 1
    return low


def statistics(sketches: list[Part]) -> dict[str, float | int | None]:
    """n, mean, p50 and p95 of the values of `sketches` added up (one kind of duration)."""
    sketches = [p for p in sketches if p.bins]
    if len(sketches) > _MERGE_ABOVE:
        sketches = [Part.merged(sketches)]
    n = sum(p.n for p in sketches)
    if not n:
        return {"n": 0, "mean": None, **dict.fromkeys(QUANTILES)}
    found: dict[str, float | int | None] = {"n": n}
    found["mean"] = sum(p.weighted for p in sketches) / n
    for name, q in QUANTILES.items():
        rank = q * (n - 1)
        low = value_of(_kth(sketches, math.floor(rank)))
        high = value_of(_kth(sketches, math.ceil(rank)))
        found[name] = low + (rank - math.floor(rank)) * (high - low)
    return found


# --------------------------------------------------------------------------------------------
# The same for a list of values (the tests state their expected values with these)


def bin_of(value: float) -> int:
    if value <= MIN_VALUE:
        return ZERO_BIN
    return math.ceil(math.log(value) / LN_GAMMA)


@cache
def value_of(bucket: int) -> float:
    return 0.0 if bucket == ZERO_BIN else 2 / (GAMMA + 1) * GAMMA**bucket


def quantile(values: Iterable[float], q: float) -> float | None:
    """What the dashboard shows as the q-quantile of `values`."""
    ordered = sorted(value_of(bin_of(v)) for v in values)
    if not ordered:
        return None
    rank = q * (len(ordered) - 1)
    low, high = ordered[math.floor(rank)], ordered[math.ceil(rank)]
    return low + (rank - math.floor(rank)) * (high - low)


def mean(values: Iterable[float]) -> float | None:
    represented = [value_of(bin_of(v)) for v in values]
    return sum(represented) / len(represented) if represented else None

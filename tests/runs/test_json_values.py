"""to_json_value's copy of plain JSON and summarize's cut strings give exactly what encoding the
whole value gives (runs.models, runs.engine.context)."""

from __future__ import annotations

import datetime
import decimal
import random
import uuid

import pytest

from runs.engine.context import summarize
from runs.models import canonical_json, digest, from_canonical_json, text_digest, to_json_value


def _round_trip(value):
    return from_canonical_json(canonical_json(value))


def _random_value(rng: random.Random, depth: int = 0):
    kinds = ["str", "int", "float", "bool", "none", "long"]
    if depth < 4:
        kinds += ["dict", "list", "dict"]
    kind = rng.choice(kinds)
    if kind == "str":
        return "".join(rng.choice('ab "\\\n\t退✓\x00/<>') for _ in range(rng.randint(0, 12)))
    if kind == "long":
        return 'x"é\\' * rng.randint(80, 400)
    if kind == "int":
        return rng.choice([0, -1, 2**70, rng.randint(-(10**9), 10**9)])
    if kind == "float":
        return rng.choice([0.1, -0.0, 1e300, 3.0, rng.random()])
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "none":
        return None
    if kind == "list":
        return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    keys = ["b", "a", "z", "é", "", "Z", "a1"]
    return {rng.choice(keys): _random_value(rng, depth + 1) for _ in range(rng.randint(0, 5))}


@pytest.mark.parametrize("seed", range(300))
def test_the_copy_of_plain_json_is_what_the_round_trip_gives(seed):
    value = _random_value(random.Random(seed))
    copied, expected = to_json_value(value), _round_trip(value)
    assert copied == expected
    assert canonical_json(copied) == canonical_json(expected) == canonical_json(value)
    # key order as the round trip's (sorted), and a copy: nothing shared that can change
    assert repr(copied) == repr(expected)
    if isinstance(value, dict | list) and value:
        assert copied is not value
    assert digest(value) == text_digest(canonical_json(copied))


@pytest.mark.parametrize(
    "value",
    [
        (1, 2),
        {1: "a", 2: (3,)},
        {"when": datetime.datetime(2026, 12, 6, 12, 0, tzinfo=datetime.UTC)},
        {"amount": decimal.Decimal("12.50"), "id": uuid.UUID(int=7)},
        {"nan": float("nan")},
        {"inf": [float("inf")]},
        [True, {"n": 1}, ("t",)],
    ],
)
def test_anything_else_takes_the_round_trip(value):
    assert canonical_json(to_json_value(value)) == canonical_json(_round_trip(value))


@pytest.mark.parametrize("seed", range(200))
@pytest.mark.parametrize("limit", [1, 5, 40, 300])
def test_a_summary_of_cut_strings_is_the_summary_of_the_whole(seed, limit):
    value = _random_value(random.Random(seed))
    text = canonical_json(value)
    whole = text if len(text) <= limit else text[: limit - 1] + "…"
    assert summarize(value, limit) == whole

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


# --- canonical_json's orjson path writes exactly what the Python encoder (the definition) writes


def _python_canonical(value):
    from runs.models.values import _CANONICAL

    return _CANONICAL.encode(value)


def _random_float(rng: random.Random) -> float:
    import struct

    while True:
        value = struct.unpack("d", struct.pack("Q", rng.getrandbits(64)))[0]
        if value == value:
            return value


def test_every_character_is_written_alike():
    every = "".join(chr(c) for c in range(0xD800)) + "".join(chr(c) for c in range(0xE000, 0x10000))
    text = every + "\U0001f600\U0010ffff"
    assert canonical_json(text) == _python_canonical(text)
    assert canonical_json({text: [text]}) == _python_canonical({text: [text]})


def test_floats_are_written_alike_or_left_to_python():
    rng = random.Random(20261207)
    floats = [_random_float(rng) for _ in range(20000)]
    floats += [1e-4, 1e-5, -1e-5, 9.99e-5, 5e-324, 1e16, 1e22, 1.7976931348623157e308, -0.0]
    floats += [float("nan"), float("inf"), float("-inf")]
    for value in floats:
        assert canonical_json([value]) == _python_canonical([value]), value


@pytest.mark.parametrize("seed", range(300))
def test_random_values_are_written_alike(seed):
    rng = random.Random(seed)
    value = _random_value(rng)
    assert canonical_json(value) == _python_canonical(value)


def test_what_runs_carry_takes_the_fast_path():
    from runs.models import orjson_encodes_alike

    document = {"document": "word " * 2000, "n": 1, "f": 0.5, "tags": ["a", "b"], "none": None}
    assert orjson_encodes_alike(document)
    assert orjson_encodes_alike([1, "x", (2, 3), {"k": {"k": [True]}}])
    assert not orjson_encodes_alike({"f": 1e-5})
    assert not orjson_encodes_alike({1: "x"})
    assert not orjson_encodes_alike({"when": datetime.datetime(2026, 12, 7)})


@pytest.mark.parametrize(
    "value",
    [
        2**64,  # beyond orjson's 64 bits
        [1, {"a": -(2**63) - 1}],
        "lone \ud800 surrogate",
        {"a": {1: "int key", 2: "b"}},
        (1, 2, [3, (4,)]),
        {"when": datetime.datetime(2026, 12, 7, 4, 30, 1, 123456, tzinfo=datetime.UTC)},
        {"amount": decimal.Decimal("12.30"), "id": uuid.UUID(int=7)},
        {"flag": True, "nothing": None, "zero": 0.0, "tiny": 1e-7},
    ],
)
def test_what_orjson_refuses_or_writes_otherwise_goes_to_python(value):
    assert canonical_json(value) == _python_canonical(value)


def test_deeper_than_orjson_goes_to_python():
    value: list = ["deep"]
    for _ in range(300):
        value = [value]
    assert canonical_json(value) == _python_canonical(value)


def test_rows_are_written_as_before():
    from runs.batch import _python_row_json, _row_json

    when = datetime.datetime(2026, 12, 7, 4, 30, 1, 123456, tzinfo=datetime.UTC)
    rows = [
        {"id": uuid.UUID(int=5), "at": when, "data": {"doc": "é\n\x00" * 3000}, "n": 3},
        {"at": when.replace(microsecond=0), "data": None, "f": 1e-5, "nan": float("nan")},
        {"amount": decimal.Decimal("1.5"), "big": 2**70},
    ]
    for row in rows[:2]:
        assert _row_json(row) == _python_row_json(row)
    with pytest.raises(TypeError):
        _row_json(rows[2])  # a Decimal column was never written; still refused the same way


def test_choices_and_other_str_subclasses_are_written_alike():
    import enum

    from django.db import models

    from runs.models import RunStatus, StepKind, orjson_encodes_alike

    class Odd(enum.StrEnum):  # an Enum whose value is not its characters
        A = "a"

        def __new__(cls, value):
            member = str.__new__(cls, "characters")
            member._value_ = value
            return member

    class Label(models.TextChoices):
        X = 'x\n"', "label"

    class Plain(str):
        pass

    values = [RunStatus.RUNNING, StepKind.SIDE_EFFECT, Label.X, Plain("p\x01"), Odd.A]
    for value in values:
        assert canonical_json({"v": value}) == _python_canonical({"v": value}), value
    assert orjson_encodes_alike({"v": RunStatus.RUNNING})
    assert not orjson_encodes_alike(Odd.A)


# -- reading: runs.models.json_loads gives what Python's decoder gives ---------------------------


def _same(a, b) -> bool:
    """Equal values of the same types all the way down (-0.0 is not 0.0, 1 is not 1.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return repr(a) == repr(b)
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _loads_alike(text: str) -> None:
    import json

    from runs.models import json_loads

    assert _same(json_loads(text), json.loads(text)), text
    assert _same(json_loads(text.encode()), json.loads(text)), text


def test_numbers_are_read_alike_as_postgresql_writes_them():
    # jsonb keeps numbers as numeric and writes them without an exponent: a float written as
    # 1e300 comes back as 301 digits, an integer beyond 64 bits (orjson refuses it).
    rng = random.Random(20261208)
    for _ in range(20000):
        value = _random_float(rng)
        if value != value or value in (float("inf"), float("-inf")):
            continue
        _loads_alike(f"[{value!r}]")
        _loads_alike(f"[{decimal.Decimal(repr(value)):f}]")
    for text in ["0", "-0", "-0.0", "1.0", "2e3", "1E-7", "1e400", "-1e400", str(2**63 - 1),
                 str(2**63), str(2**64), str(-(2**63) - 1), str(10**300), "0.30000000000000004",
                 "123456789012345678901234567890.5", "4.9406564584124654e-324"]:  # fmt: skip
        _loads_alike(f"[{text}]")


@pytest.mark.parametrize("seed", range(300))
def test_random_values_are_read_alike(seed):
    _loads_alike(canonical_json(_random_value(random.Random(seed))))


def test_text_orjson_refuses_is_read_by_python():
    for text in ['"\\ud800"', '{"a": "\\udfff x"}', '{"a": 1, "a": 2}', " [1, 2] "]:
        _loads_alike(text)


def test_long_integers_are_found_among_any_characters():
    # The digit runs are found on the text's bytes: characters beyond ASCII (several bytes
    # each), digits of other scripts and digits in strings beside the integer change nothing.
    big = str(2**64 + 7)
    for text in [
        f'{{"a":"ü€𝄞","n":{big}}}',
        f'{{"a":"٣٤٥٦٧٨٩٠١٢٣٤٥٦٧٨٩٠١٢","n":{big}}}',
        f'[{big},"{"9" * 18}x"]',
        f'["{"9" * 30}"]',
        f"[-{big}]",
    ]:
        _loads_alike(text)

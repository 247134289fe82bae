"""JSON values and their digests: canonical JSON, the copy of plain JSON, the timeline's chain
hash, read records and short renderings of untrusted values."""

from __future__ import annotations

import functools
import hashlib
import json
import math
import re
from enum import Enum
from typing import Any

import orjson
from django.core.serializers.json import DjangoJSONEncoder


def chain_hash(seq: int, at_iso: str, actor: str, verb: str, data_digest: str, prev: str) -> str:
    """An event's hash over its place in the chain and its content (the one definition: the
    append, the verifier and the offline export check all use it): sha256 of the canonical JSON
    of [seq, at, actor, verb, data digest, previous hash]. Built directly (the hot path hashes
    every event): the time and the digests are ASCII without anything JSON escapes, actor and
    verb are encoded as canonical_json encodes strings (tests/runs/test_audit_verify.py)."""
    if _PLAIN.fullmatch(at_iso) and _PLAIN.fullmatch(data_digest) and _PLAIN.fullmatch(prev):
        actor_json, verb_json = json_string(actor), json_string(verb)
        return plain_chain_hash(seq, at_iso, actor_json, verb_json, data_digest, prev)
    # e.g. an export someone edited: whatever it holds is encoded, never spliced in
    material = canonical_json([seq, at_iso, actor, verb, data_digest, prev])
    return hashlib.sha256(material.encode()).hexdigest()


def plain_chain_hash(
    seq: int, at_iso: str, actor_json: str, verb_json: str, data_digest: str, prev: str
) -> str:
    """`chain_hash` of parts that need no escaping, actor and verb already JSON-encoded
    (json_string): what the engine hashes for the events it writes itself (its own times,
    digests and hashes)."""
    material = f'[{int(seq)},"{at_iso}",{actor_json},{verb_json},"{data_digest}","{prev}"]'
    return hashlib.sha256(material.encode()).hexdigest()


_json_string = json.JSONEncoder(ensure_ascii=False).encode


@functools.lru_cache(maxsize=4096)
def json_string(text: str) -> str:
    """A string as canonical_json encodes it. Actors and verbs repeat on every event: each is
    encoded once."""
    return _json_string(text)


# What a time, a digest or a hash holds: nothing JSON would escape.
_PLAIN = re.compile(r"[0-9A-Za-z:+.\-]*")

# One encoder for every call (json.dumps would build one each time). The hot path encodes every
# event, row and result through it. No circular-reference markers (a dict of ids kept for every
# container): a value that holds itself ends in RecursionError instead of ValueError.
_CANONICAL = DjangoJSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, check_circular=False
)


def canonical_json(value: Any) -> str:
    """The one serialisation used for checksums and hashes: sorted keys, no spaces, UTF-8.

    The definition is `_CANONICAL`'s output (every hash recorded so far was taken over it). A
    value orjson encodes to the same text (`orjson_encodes_alike`) is encoded by orjson, about
    thirty times faster for the documents agent runs carry (a 9 KB text: 3 µs against 110 µs);
    anything else, or anything orjson refuses (an integer beyond 64 bits, a lone surrogate, a
    value nested past 254 levels), by `_CANONICAL`. tests/runs/test_json_values.py holds the
    two to the same text over every character and random values."""
    if orjson_encodes_alike(value):
        try:
            return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
        except orjson.JSONEncodeError:
            pass
    return _CANONICAL.encode(value)


# orjson writes floats below 1e-4 as 0.00001 and 1e-5 where Python writes 1e-05, and NaN and
# the infinities as null where Python writes NaN and Infinity; every other float alike.
_SMALLEST_ALIKE = 1e-4


def orjson_encodes_alike(value: Any) -> bool:
    """Whether orjson encodes `value` (sorted keys) to the text Python's encoder gives it: plain
    JSON types exactly (the two treat subclasses of the containers and numbers differently; of
    str, see below), str keys, floats that both write alike. Strings are alike for every
    character (the escapes of `"`, `\\` and the control characters are the same, the rest
    written as is).

    Every value the engine writes goes through this (a row's columns, each event's data): the
    leaves are told apart where they stand, without a call of their own for each."""
    kind = type(value)
    if kind in ALIKE_LEAVES:
        return True
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str:
                return False
            if type(item) not in ALIKE_LEAVES and not orjson_encodes_alike(item):
                return False
        return True
    if kind is list or kind is tuple:
        for item in value:
            if type(item) not in ALIKE_LEAVES and not orjson_encodes_alike(item):
                return False
        return True
    if kind is float:
        return value == 0.0 or _SMALLEST_ALIKE <= abs(value) < math.inf
    if isinstance(value, str):
        # A subclass (a model's choices): Python's encoder writes its characters, orjson its
        # characters too, or an Enum's value: alike where the two are the same.
        return not isinstance(value, Enum) or value._value_ == str.__str__(value)
    return False


# The types orjson and Python's encoder write alike whatever their value (exactly these: bool
# is not taken for int, a subclass of either is not either).
ALIKE_LEAVES = frozenset({str, int, bool, type(None)})


def to_json_value(value: Any) -> Any:
    """Normalise to plain JSON types so the stored value and its hash agree after a round trip:
    a copy, as decoding the value's canonical JSON would give it (keys sorted, tuples as lists,
    other key types as strings, what the encoder's default makes of dates, decimals, uuids).

    A value that is plain JSON already — exactly dict with str keys, list, str, int, float,
    bool, None, as tools and workflows return — is copied without encoding it (a payload of
    16 KB costs about 25 µs to encode and decode, its copy about 1 µs); anything else takes
    the round trip."""
    try:
        return _plain_copy(value)
    except _NotPlain:
        return from_canonical_json(canonical_json(value))


class _NotPlain(Exception):
    pass


def _plain_copy(value: Any) -> Any:
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return value
    if kind is dict:
        for key in value:
            if type(key) is not str:
                raise _NotPlain
        return {key: _plain_copy(value[key]) for key in sorted(value)}
    if kind is list:
        return [_plain_copy(item) for item in value]
    if kind is float and math.isfinite(value):
        return value
    raise _NotPlain


# raw_decode, not json.loads: canonical JSON has no whitespace around its one value to skip
# (json.loads matches it twice with a regular expression).
_DECODER = json.JSONDecoder()


def from_canonical_json(text: str) -> Any:
    """The value of a text canonical_json produced."""
    return _DECODER.raw_decode(text)[0]


# 19 digits in a row: a number that may not fit 64 bits (orjson reads such an integer as a
# float, where Python's decoder keeps every digit), or a digit run inside a string. Found by
# mapping every byte to one of two (a digit or not) and looking for the run: a regular
# expression took about 110 µs over an 8 KB document, this about 5 µs (orjson reads it in 2).
_DIGIT_OR_NOT = bytes(0x30 if 0x30 <= byte <= 0x39 else 0x78 for byte in range(256))
_LONG_DIGITS = b"0" * 19


def _long_digits(text: str | bytes) -> bool:
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    return _LONG_DIGITS in data.translate(_DIGIT_OR_NOT)


def json_loads(text: str | bytes) -> Any:
    """The value of JSON text as PostgreSQL returns it (json, jsonb), as Python's decoder reads
    it: by orjson (a payload of kilobytes several times faster) unless the text has 19 digits in
    a row (an integer orjson would read as a float) or orjson refuses it (a lone surrogate), then
    by Python's. tests/runs/test_json_values.py holds the two to the same values."""
    if not _long_digits(text):
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            pass
    return json.loads(text)


def digest(value: Any) -> str:
    return text_digest(canonical_json(value))


def text_digest(text: str) -> str:
    """`digest` of a value whose canonical JSON is `text` (encoded once for both)."""
    return hashlib.sha256(text.encode()).hexdigest()


# How much of a read's input and response its step keeps (Step.read_record).
READ_PARAMS_MAX_CHARS = 4000
READ_PREVIEW_CHARS = 200


def read_record(params: Any, response: Any) -> dict:
    """What a read step keeps of its call: the parameters (whole up to READ_PARAMS_MAX_CHARS
    of JSON, else a digest and the first characters) and a summary of the response — its JSON
    type, length (keys, items or characters), size, digest and the first characters. Bounded,
    so a large response costs a few hundred bytes on the step row."""
    params = to_json_value(params)
    params_json = canonical_json(params)
    if len(params_json) > READ_PARAMS_MAX_CHARS:
        params = {
            "truncated": True,
            "sha256": text_digest(params_json),
            "preview": params_json[:READ_PREVIEW_CHARS],
        }
    response = to_json_value(response)
    text = canonical_json(response)
    kind = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    output = {
        "type": kind.get(type(response), "number"),
        "size": len(text),
        "sha256": text_digest(text),
        "preview": text[:READ_PREVIEW_CHARS],
    }
    if isinstance(response, dict | list | str):
        output["length"] = len(response)
    return {"params": params, "output": output}


# How much of an untrusted value an event or a page shows (its digest stands for all of it).
SHOWN_CHARS = 300


def shown(value: Any, limit: int = SHOWN_CHARS) -> str:
    """A short rendering of an untrusted value for an event: canonical JSON, cut at `limit`
    characters (rendered escaped wherever it is shown)."""
    text = canonical_json(to_json_value(value))
    return text if len(text) <= limit else text[: limit - 1] + "…"

"""The storability rule of aggregates.values, without a runtime: each kind of bad value."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from aggregates import Usage
from aggregates.values import (
    MAX_JSON_DEPTH,
    MAX_JSON_INT,
    NotJsonError,
    UnstorableError,
    check_json,
    check_json_depth,
    describe_error,
    json_size,
    limit_size,
    parse_json_text,
    safe_text,
    truncated,
    unstorable,
    usage_problem,
)


def nested(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


class BrokenStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text")


@pytest.mark.parametrize(
    "value",
    [None, True, 0, -(2**63), MAX_JSON_INT, 1.5, "é ✓ 😀", {"a": [1, {"b": None}]}, []],
)
def test_plain_json_values_are_storable(value: Any) -> None:
    assert check_json(value) is None


@pytest.mark.parametrize(
    ("value", "where"),
    [
        (math.nan, "the value: nan is not a finite number"),
        ({"a": [1, math.inf]}, "a.1: inf is not a finite number"),
        ({"a": -math.inf}, "a: -inf is not a finite number"),
        ({"x": "ok\ud800"}, "x: the string holds a lone surrogate U+D800"),
        ({"\udcff": 1}, "\\udcff: the key holds a lone surrogate U+DCFF"),
        ({"n": 2**63}, "n: an integer outside the signed 64-bit range"),
        ({"s": {1, 2}}, "s: a set is not a JSON value"),
        ({"b": b"bytes"}, "b: a bytes is not a JSON value"),
        ({"t": (1, 2)}, "t: a tuple is not a JSON value"),
        ({1: "int key"}, "the value: a key of type int is not a string"),
        ({"o": object()}, "o: a object is not a JSON value"),
    ],
)
def test_each_unstorable_value_is_named_where_it_is(value: Any, where: str) -> None:
    """Tried: NaN, ±Infinity, lone surrogates in values and keys, 2**63, sets, bytes,
    tuples, int keys, arbitrary objects."""
    problem = check_json(value)
    assert problem is not None
    assert problem.startswith(where)


def test_nesting_is_capped_and_any_depth_or_cycle_is_refused_without_recursion() -> None:
    """Tried: depth 64 (allowed), 65, 100000 (iterative: no RecursionError), a cycle."""
    assert check_json(nested(MAX_JSON_DEPTH - 1)) is None
    assert "nested deeper than 64 levels" in (check_json(nested(MAX_JSON_DEPTH + 1)) or "")
    assert check_json(nested(100_000)) is not None
    cycle: list[Any] = []
    cycle.append(cycle)
    assert check_json(cycle) is not None


@pytest.mark.parametrize("depth", [65, 1_000, 100_000])
def test_deep_json_text_is_refused_before_it_is_parsed(depth: int) -> None:
    """Tried: [[[...]]] at 65, 1000 and 100000 levels: an UnstorableError, never RecursionError."""
    text = "[" * depth + "]" * depth
    with pytest.raises(UnstorableError, match="nested deeper than 64"):
        parse_json_text(text)


def test_brackets_inside_strings_do_not_count_as_nesting() -> None:
    text = json.dumps({"a": "[" * 500 + '\\"{' * 100})
    assert check_json_depth(text) is None
    assert parse_json_text(text) == json.loads(text)


@pytest.mark.parametrize(
    "text", ["[NaN]", '{"a": Infinity}', "-Infinity", "1e400", '"\\ud800"', '{"\\udc80": 1}']
)
def test_json_text_with_unstorable_values_is_refused(text: str) -> None:
    """Tried: NaN, ±Infinity literals, 1e400 (parses to inf), escaped lone surrogates."""
    with pytest.raises(UnstorableError):
        parse_json_text(text)


def test_text_that_is_not_json_is_told_apart_from_unstorable_json() -> None:
    with pytest.raises(NotJsonError):
        parse_json_text("hello")
    with pytest.raises(UnstorableError, match="not UTF-8"):
        parse_json_text(b"\xff\xfe")


def test_a_value_over_the_limit_becomes_a_visible_stand_in_with_size_and_digest() -> None:
    value = {"rows": ["x" * 100] * 100}
    kept, cut = limit_size(value, max_bytes=20_000)
    assert (kept, cut) == (value, False)
    stand_in, cut = limit_size(value, max_bytes=1_000)
    assert cut
    text = json.dumps(value, separators=(",", ":"))
    assert stand_in["truncated"] is True
    assert stand_in["size"] == json_size(value) == len(text)
    assert len(stand_in["sha256"]) == 64
    assert text.startswith(stand_in["head"])
    assert len(stand_in["head"]) == 1_000 // 8
    assert check_json(stand_in) is None


def test_a_stand_in_without_head_keeps_only_size_and_digest() -> None:
    marker = truncated(b"secret text", max_bytes=1_000, head=False)
    assert set(marker) == {"truncated", "size", "sha256"}


def test_an_unstorable_value_is_stored_as_a_bounded_repr_never_as_null() -> None:
    """Tried: NaN, a 100000-deep list, an object whose __repr__ raises."""

    class BadRepr:
        def __repr__(self) -> str:
            raise KeyboardInterrupt

    for value in ({"a": math.nan}, nested(100_000), BadRepr()):
        substitute = unstorable(value, "because")
        assert substitute["unstorable"] is True
        assert substitute["problem"] == "because"
        assert check_json(substitute) is None
        assert len(substitute["repr"]) <= 2_100
    assert "nan" in unstorable({"a": math.nan}, "p")["repr"]
    assert "repr" not in unstorable("t\ud800", "p", show=False)


def test_error_texts_survive_a_broken_str_and_lone_surrogates() -> None:
    """Tried: __str__ raising, lone surrogates, a 100000-character message."""
    assert describe_error(BrokenStr()) == "BrokenStr: <str() raised RuntimeError>"
    assert check_json(safe_text("bad \udc80 name")) is None
    assert "\\udc80" in safe_text("bad \udc80 name")
    long = safe_text("x" * 100_000)
    assert len(long) < 4_100
    assert long.endswith("(100000 characters)")


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"cost": math.nan}, "cost must be a finite number"),
        ({"latency_ms": math.inf}, "latency_ms must be a finite number"),
        ({"cost": -0.5}, "cost must be a finite number"),
        ({"output_tokens": -600}, "output_tokens must be an integer"),
        ({"input_tokens": 2**60}, "input_tokens must be an integer"),
        ({"attempts": -1}, "attempts must be a positive integer"),
    ],
)
def test_usage_that_cannot_be_recorded_is_named(fields: dict[str, Any], problem: str) -> None:
    """Tried: NaN and ±Infinity cost/latency, negative cost and tokens, absurd tokens."""
    usage = Usage.model_construct(**{**Usage().model_dump(), **fields})
    assert problem in (usage_problem(usage) or "")


def test_ordinary_usage_is_recorded() -> None:
    assert usage_problem(Usage(input_tokens=10, output_tokens=5, cost=0.01)) is None

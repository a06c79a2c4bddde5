"""The one-pass storability check and size bound of aggregates.values (what skips encoding).

``storable_bound`` must refuse exactly what ``check_json`` refuses, and, for what it
accepts, never say less than the real size: a value whose bound is within a limit
is stored whole without being encoded, so a bound below the size would let a value
over the limit through.
"""

from __future__ import annotations

import enum
import json
import math
import sys
from collections import OrderedDict
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregates.values import (
    FLOAT_BOUND,
    INT_BOUND,
    MAX_JSON_DEPTH,
    MAX_JSON_INT,
    check_json,
    json_size,
    limit_size,
    storable_bound,
)

# Any JSON-ish value, storable or not: every scalar the rule knows, the characters
# that escape longest (controls, quotes, backslashes, lone surrogates, astral ones).
_TEXT = st.text(
    alphabet=st.sampled_from(
        ["a", '"', "\\", "\x00", "\x1f", "\x7f", "é", "\u2028", "😀", "\ud800"]
    )
)
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**64), max_value=2**64)
    | st.floats(allow_nan=True, allow_infinity=True)
    | _TEXT
)
_VALUES = st.recursive(
    _SCALARS,
    lambda children: (
        st.lists(children, max_size=5)
        | st.dictionaries(_TEXT, children, max_size=5)
        | st.tuples(children)
    ),
    max_leaves=30,
)


@settings(max_examples=400, deadline=None)
@given(_VALUES)
def test_the_bound_refuses_what_check_json_refuses_and_is_never_below_the_size(
    value: Any,
) -> None:
    """Tried: NaN, ±Infinity, lone surrogates in keys and values, integers past 64 bits,
    tuples, control characters, quotes and backslashes (the longest escapes)."""
    bound = storable_bound(value)
    assert (bound is None) == (check_json(value) is not None)
    if bound is not None:
        assert bound >= json_size(value)


@pytest.mark.parametrize(
    "value",
    [
        -(2**63),
        MAX_JSON_INT,
        -sys.float_info.min,
        -sys.float_info.max,
        -2.2250738585072014e-308,
        -1.2345678901234567e-300,
        "\x00" * 50,
        {"\x1f" * 7: ["\\" * 3, '"']},
        [[[]]],
        {},
        "😀" * 9,
    ],
)
def test_the_bound_holds_at_the_longest_scalars_and_escapes(value: Any) -> None:
    """Tried: the longest integers and float reprs, strings of control characters (six
    bytes each), astral characters, empty containers."""
    bound = storable_bound(value)
    assert bound is not None
    assert bound >= json_size(value)
    assert len(json.dumps(-(2**63))) == INT_BOUND
    assert len(repr(-2.2250738585072014e-308)) == FLOAT_BOUND


class Colour(enum.IntEnum):
    RED = 1


class Name(str):
    pass


@pytest.mark.parametrize(
    "value",
    [
        math.nan,
        {"x": [math.inf]},
        2**63,
        "\udfff",
        {"\ud800": 1},
        {1: "int key"},
        (1, 2),
        {"t": (1,)},
        {1, 2},
        b"bytes",
        Colour.RED,
        {"c": Colour.RED},
        Name("text"),
        OrderedDict(a=1),
        [object()],
    ],
)
def test_the_bound_keeps_the_exact_types_of_the_rule(value: Any) -> None:
    """Tried: NaN, Infinity, 2**63, lone surrogates, int keys, tuples, sets, bytes, an
    IntEnum, a str subclass, an OrderedDict, an object: none gets a bound."""
    assert storable_bound(value) is None
    assert check_json(value) is not None


def test_depth_and_cycles_are_refused_by_the_bound_without_recursion() -> None:
    """Tried: depth 64 (allowed), 65, 100000 and a cycle (no RecursionError)."""

    def nested(depth: int) -> Any:
        value: Any = 1
        for _ in range(depth):
            value = [value]
        return value

    assert storable_bound(nested(MAX_JSON_DEPTH)) is not None
    assert storable_bound(nested(MAX_JSON_DEPTH + 1)) is None
    assert storable_bound(nested(100_000)) is None
    cycle: list[Any] = []
    cycle.append(cycle)
    assert storable_bound(cycle) is None


def test_limit_size_trusts_a_bound_within_the_limit_and_measures_otherwise() -> None:
    """Tried: a value whose bound is within the limit (kept, not encoded), one whose
    bound is over it but whose size is not (kept after measuring), one over (cut)."""
    small = {"k": "v" * 10}
    bound = storable_bound(small)
    assert bound is not None
    assert limit_size(small, max_bytes=bound, bound=bound) == (small, False)
    # The bound counts six bytes a character; the text has one: measured, kept.
    text = {"k": "v" * 100}
    assert limit_size(text, max_bytes=200, bound=storable_bound(text)) == (text, False)
    stored, cut = limit_size(text, max_bytes=50, bound=storable_bound(text))
    assert cut
    assert stored["truncated"] is True
    assert stored["size"] == json_size(text)

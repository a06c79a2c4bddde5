"""The digests the runtime records: ``canonical_json`` is ``json.dumps`` with sorted keys
and no spaces, byte for byte, for any JSON value; what is not JSON is refused as before."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aggregates.digest import canonical_json, digest_of, sha256_hex

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()  # NaN and the infinities too: json.dumps writes them
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4)
    ),
    max_leaves=20,
)


def documented(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


@given(JSON_VALUES)
def test_canonical_json_is_json_dumps_with_sorted_keys_and_no_spaces(value: Any) -> None:
    assert canonical_json(value) == documented(value)
    assert digest_of(value) == sha256_hex(documented(value))


def test_a_value_that_refers_to_itself_is_refused_with_jsons_own_error() -> None:
    looped: list[Any] = [1]
    looped.append({"again": looped})
    with pytest.raises(ValueError, match="Circular reference"):
        canonical_json(looped)
    # and the next value is encoded as ever (the refusal left nothing behind)
    assert canonical_json([1, {"b": 2, "a": 1}]) == '[1,{"a":1,"b":2}]'


def test_a_value_that_is_not_json_is_refused_with_a_type_error() -> None:
    with pytest.raises(TypeError, match="not JSON serializable"):
        canonical_json({"when": object()})
    assert canonical_json({"when": "now"}) == '{"when":"now"}'

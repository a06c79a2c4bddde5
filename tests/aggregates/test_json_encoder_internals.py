"""CPython's C JSON encoder, built once by ``aggregates.json_encoder``, still does what we rely on.

A Python upgrade that changes ``json.encoder.c_make_encoder``'s arguments or its
output fails here, naming the module, instead of changing digests and stored bytes.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from aggregates.json_encoder import ascii_string, c_encoder, plain_string

SAMPLES: list[Any] = [
    {"b": 1, "a": [1.5, -0.0, 1e300, None, True, False], "ü": 'é\u2028\n"\\'},
    [],
    {},
    {"nested": {"z": {"y": [{"x": 2**70}]}}},
    "plain text",
    math.inf,
]


def _unencodable(value: object) -> object:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


@pytest.mark.parametrize("ensure_ascii", [True, False])
@pytest.mark.parametrize("value", SAMPLES, ids=range(len(SAMPLES)))
def test_the_c_encoder_writes_what_the_documented_encoder_writes(
    value: Any, ensure_ascii: bool
) -> None:
    encoder = c_encoder(default=_unencodable, ensure_ascii=ensure_ascii)
    assert encoder is not None, "CPython's json.encoder.c_make_encoder is gone"
    documented = json.JSONEncoder(
        sort_keys=True, separators=(",", ":"), ensure_ascii=ensure_ascii
    ).encode(value)
    if isinstance(value, str):
        # c_make_encoder encodes containers; a top-level str goes through the string encoder.
        made = (ascii_string if ensure_ascii else plain_string)(value)
    else:
        made = "".join(encoder(value, 0))
    assert made == documented, "aggregates/json_encoder.py: the C encoder changed its output"


def test_the_c_encoder_calls_default_for_what_json_cannot_write() -> None:
    """Bad input tried: a set, which JSON has no form for, reaches ``default``."""
    encoder = c_encoder(default=_unencodable, ensure_ascii=True)
    assert encoder is not None
    with pytest.raises(TypeError, match="set is not JSON serializable"):
        "".join(encoder({"a": {1, 2}}, 0))

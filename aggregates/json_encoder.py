"""The one door to CPython's JSON encoder internals: its C encoder, built once.

``json.JSONEncoder.encode`` builds a new C encoder (``json.encoder.c_make_encoder``)
on every call, and ``json.dumps`` with options builds a new ``JSONEncoder`` too; on
the hot paths (every event's digest and canonical record, every stored row's id)
the runtime builds the encoder once and calls it directly. ``c_make_encoder`` and
its nine positional arguments are CPython's, not a documented API: every use goes
through this module, and ``tests/aggregates/test_json_encoder_internals.py`` fails loudly,
naming this module, when a Python upgrade changes them. Without the C accelerator
(another Python implementation) :func:`c_encoder` answers None and callers use the
documented ``JSONEncoder.encode``.
"""

from __future__ import annotations

import json
import json.encoder
from collections.abc import Callable, Iterable
from typing import Any

CEncoder = Callable[[Any, int], Iterable[str]]
"""A C encoder: called with a value and the indent level 0, it yields the JSON text's parts."""

ascii_string: Callable[[str], str] = json.encoder.encode_basestring_ascii
"""A str as a JSON string with ASCII escapes (C; what ``json.dumps`` calls)."""

plain_string: Callable[[str], str] = json.encoder.encode_basestring
"""A str as a JSON string, non-ASCII characters kept (``ensure_ascii=False``)."""


def c_encoder(*, default: Callable[[Any], Any], ensure_ascii: bool) -> CEncoder | None:
    """The C encoder of ``JSONEncoder(sort_keys=True, separators=(",", ":"), ...)``.

    Its output is that encoder's ``encode``, byte for byte, for values without cycles:
    it has no check for cycles (``markers`` is None; a shared dict of markers would
    keep entries after an error), floats are written as ``float.__repr__``, NaN is
    allowed (``allow_nan=True``, as ``JSONEncoder`` does by default). None without
    the C accelerator.
    """
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # pragma: no cover - CPython has it
        return None
    encoder: CEncoder = make(
        None,  # markers: no cycle check
        default,
        ascii_string if ensure_ascii else plain_string,
        None,  # indent
        ":",  # key separator
        ",",  # item separator
        True,  # sort_keys
        False,  # skipkeys
        True,  # allow_nan
    )
    return encoder

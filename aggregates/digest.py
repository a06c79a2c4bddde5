"""The one digest helper: SHA-256 over a canonical JSON text.

Every digest the runtime records (a plan's fingerprint, a failure's signature,
an approved batch, a write's arguments, a tool's schema) is ``digest_of`` of a
JSON value: keys sorted, no spaces, ASCII escapes (``json.dumps`` with
``sort_keys=True, separators=(",", ":")``). The audit chain has its own,
documented canonical form (``aggregates.audit``); it is not a digest of this kind.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from aggregates.json_encoder import c_encoder

_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"))
# json.dumps with options builds a new encoder on every call; this one is built once.


_SHARED = c_encoder(default=_CANONICAL.default, ensure_ascii=True)
"""The C encoder ``_CANONICAL.encode`` makes on every call, made once (None without it).

It has no check for cycles; ``canonical_json`` asks the checking encoder then. Its
output is ``_CANONICAL.encode``'s, byte for byte (a test checks)."""


def canonical_json(value: Any) -> str:
    """``value`` as canonical JSON text (sorted keys, no spaces).

    Raises:
        TypeError: ``value`` is not JSON.
        ValueError: ``value`` refers to itself.
    """
    if _SHARED is None or isinstance(value, str):
        return _CANONICAL.encode(value)
    try:
        return "".join(_SHARED(value, 0))
    except RecursionError:
        # A value that refers to itself (or nests past the recursion limit): the
        # encoder that checks for cycles says which, as it always did.
        return _CANONICAL.encode(value)


def sha256_hex(text: str | bytes) -> str:
    """The SHA-256 of a text (UTF-8) or bytes, in hex."""
    data = text.encode() if isinstance(text, str) else text
    return hashlib.sha256(data).hexdigest()


def digest_of(value: Any) -> str:
    """The SHA-256 (hex) of ``value``'s canonical JSON.

    Raises:
        TypeError: ``value`` is not JSON.
    """
    return sha256_hex(canonical_json(value))

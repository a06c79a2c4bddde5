"""Which strings may name an invocation.

Every aggregate lives in one id space: an invocation's id is the id of its
event stream, its cancel request's stream is ``cancel:{id}``
(:func:`aggregates.requests.cancel_request_id`) and each effect's stream is its
effect key ``eff-…`` (:func:`aggregates.effect.effect_key`). An invocation
named ``cancel:X`` would take the stream of X's cancel request, so ids in those
namespaces are refused. Control characters are refused too: the effect key is a
digest of the id, the step and the call id joined by U+001F, and an id that
contained the separator could give two different calls one key.
"""

from __future__ import annotations

import unicodedata

from aggregates.effect import EFFECT_KEY_PREFIX
from aggregates.requests import CANCEL_REQUEST_PREFIX

RESERVED_ID_PREFIXES = (CANCEL_REQUEST_PREFIX, EFFECT_KEY_PREFIX)
"""Prefixes of the runtime's own streams: no invocation id starts with one."""


def invocation_id_problem(invocation_id: str) -> str | None:
    """Why ``invocation_id`` cannot name an invocation, or None when it can."""
    if not invocation_id:
        return "an invocation id must not be empty"
    for prefix in RESERVED_ID_PREFIXES:
        if invocation_id.startswith(prefix):
            return (
                f"invocation id {invocation_id!r} starts with {prefix!r}, "
                "which names the runtime's own records; choose another id"
            )
    for character in invocation_id:
        if unicodedata.category(character) in ("Cc", "Cf", "Zl", "Zp"):
            return (
                f"invocation id {invocation_id!r} contains the control character "
                f"U+{ord(character):04X}; use printable characters"
            )
    return None

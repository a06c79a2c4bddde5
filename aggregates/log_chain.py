r"""The global log chain: one hash over every stored row, in the store's notification order.

Each stored row (an event of any aggregate) is a leaf:

    leaf = JSON [notification_id, originator_id, originator_version, topic, sha256(state)]

as ``json.dumps(leaf, separators=(",", ":"), ensure_ascii=True)`` (ASCII, no spaces;
``sha256(state)`` in lower-case hex, of the row's state bytes exactly as stored,
encrypted or compressed if the store is). The chain is

    link(0) = GENESIS (64 zeros)
    link(n) = sha256( link(n-1) + "\n" + leaf(n) )

written as 64 lower-case hex digits. ``link(size)`` is the head a checkpoint commits
to. Unlike the per-aggregate chains (:mod:`aggregates.audit`), it covers the order of
rows across aggregates, their topics and their bytes as stored, and, against a saved
checkpoint, how many there were.
"""

from __future__ import annotations

import hashlib
import json

from aggregates.audit import GENESIS


def leaf(notification_id: int, originator_id: str, version: int, topic: str, state: bytes) -> bytes:
    """The bytes of one stored row's leaf."""
    digest = hashlib.sha256(state).hexdigest()
    return json.dumps(
        [notification_id, originator_id, version, topic, digest],
        separators=(",", ":"),
        ensure_ascii=True,
    ).encode()


def next_link(previous: str, leaf_bytes: bytes) -> str:
    """The link after ``previous`` for a leaf."""
    return hashlib.sha256(previous.encode() + b"\n" + leaf_bytes).hexdigest()


__all__ = ["GENESIS", "leaf", "next_link"]

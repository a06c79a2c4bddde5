"""The audit hash chain: every aggregate's events are chained by SHA-256.

Each event carries ``chain_hash``: the SHA-256 of the previous event's hash (hex),
a newline, and this event's canonical form,
where the first event's previous hash is ``GENESIS`` (64 zeros) and the
canonical form is the UTF-8 JSON of

    {"data": {...}, "id": ..., "position": ..., "timestamp": ..., "type": ...}

with keys sorted, no spaces (separators ``,`` and ``:``), non-ASCII kept as is.
``data`` holds the event's fields in their JSON form, leaving out the envelope
(id, version, timestamp, topic, the hash itself) and every field whose value is
null. Event fields added later must therefore be optional with a null default:
old events then keep their canonical form, and their hashes stay valid.
``position`` is the event's place in its aggregate (1, 2, ...), ``type`` its
class name, ``timestamp`` the ISO-8601 UTC time as pydantic writes it
(``2026-11-30T16:52:19.846415Z``).

An edited, deleted, inserted or reordered event breaks the chain from that
position on. The chain proves integrity against anyone who cannot recompute
it; anchor the head hash elsewhere (``loop-actors audit verify --json`` prints
it) to also rule out a rewrite of the whole history.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

GENESIS = "0" * 64
"""The previous hash of an aggregate's first event."""

ENVELOPE = frozenset(
    {"originator_id", "originator_version", "timestamp", "originator_topic", "chain_hash"}
)


_CANONICAL_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
"""``json.dumps`` with these options builds a new encoder on every call; one is enough."""


def _unencodable(value: object) -> object:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _canonical_encoder() -> Any:
    """The C encoder behind ``_CANONICAL_JSON``, built once (``encode`` builds one per call).

    Its output is ``_CANONICAL_JSON.encode``'s, byte for byte (a test checks this);
    without the C accelerator (another Python implementation) that method is used.
    """
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # pragma: no cover - CPython always has it
        return None
    # markers=None: no cycle check (a model dump has no cycles); floats as repr; NaN allowed,
    # exactly as JSONEncoder.encode does with allow_nan=True.
    return make(
        None, _unencodable, json.encoder.encode_basestring, None, ":", ",", True, False, True
    )


_C_CANONICAL = _canonical_encoder()


def canonical_record(event: Any) -> dict[str, Any]:
    """The canonical record of an event, as a JSON-able dict."""
    data = event.model_dump(mode="json", exclude_none=True)
    timestamp = data["timestamp"]
    for key in ENVELOPE:
        data.pop(key, None)
    return {
        "data": data,
        "id": event.originator_id,
        "position": event.originator_version,
        "timestamp": timestamp,
        "type": type(event).__name__,
    }


def canonical_bytes(record: dict[str, Any]) -> bytes:
    """The bytes that are hashed for a canonical record."""
    if _C_CANONICAL is None:  # pragma: no cover
        return _CANONICAL_JSON.encode(record).encode()
    return "".join(_C_CANONICAL(record, 0)).encode()


def link(previous_hash: str, record: dict[str, Any]) -> str:
    """The chain hash of a canonical record that follows ``previous_hash``."""
    return hashlib.sha256(previous_hash.encode() + b"\n" + canonical_bytes(record)).hexdigest()


def chain_hash_of(previous_hash: str, event: Any) -> str:
    """The chain hash an event must carry after ``previous_hash``."""
    return link(previous_hash, canonical_record(event))


class ChainBreak(Exception):
    """Raised (or returned) when a history is not the one that was written: where and why."""

    def __init__(self, position: int, problem: str) -> None:
        super().__init__(f"position {position}: {problem}")
        self.position = position
        self.problem = problem


def verify_chain(entries: Iterable[tuple[int, Any]]) -> tuple[int, str | None, ChainBreak | None]:
    """Check one aggregate's stored events, in stored order.

    ``entries`` are ``(position, event)`` pairs, where the event may be an
    exception if the stored row could not even be decoded.

    Returns the number of events checked, the head hash (None if empty) and the
    first break (None when the chain is whole).
    """
    previous = GENESIS
    expected = 1
    for position, event in entries:
        if position != expected:
            problem = (
                f"position {expected} is missing (next stored is {position})"
                if position > expected
                else f"position {position} comes after {expected - 1}: rows were reordered"
            )
            return expected - 1, None, ChainBreak(expected, problem)
        if isinstance(event, Exception):
            return (
                expected - 1,
                None,
                ChainBreak(position, f"the stored row cannot be read: {event}"),
            )
        if event.chain_hash != chain_hash_of(previous, event):
            return (
                expected - 1,
                None,
                ChainBreak(position, "its hash does not match its content and the previous hash"),
            )
        previous = event.chain_hash
        expected += 1
    return expected - 1, previous if expected > 1 else None, None


def verify_records(records: Iterable[dict[str, Any]]) -> ChainBreak | None:
    """Check exported history records (``loop-actors history ID --json`` lines).

    Each record has ``id``, ``position``, ``type``, ``timestamp``, ``data`` and ``hash``.
    """
    previous = GENESIS
    expected = 1
    for record in records:
        if record.get("position") != expected:
            return ChainBreak(
                expected, f"expected position {expected}, found {record.get('position')}"
            )
        canonical = {key: record[key] for key in ("data", "id", "position", "timestamp", "type")}
        if record.get("hash") != link(previous, canonical):
            return ChainBreak(expected, "its hash does not match its content and the previous hash")
        previous = record["hash"]
        expected += 1
    return None

r"""The audit hash chain: every aggregate's events are chained by SHA-256.

Each event carries ``chain_hash``, over the previous event's hash (hex; ``GENESIS``,
64 zeros, before the first event) and the event. Two audit formats exist; an event
says which it was written in (``audit_format``), and both verify:

**Format 2** (every event written since this format exists): the hash covers the
event's bytes *as stored*, with no re-encoding. The stored state of an event is the
JSON object ``{"chain_hash":"<64 hex>",`` followed by the rest of its *body*, where
the body is the event's fields as pydantic writes them
(``model_dump_json(exclude={"originator_id", "originator_version", "chain_hash"},
exclude_none=True)``, which holds ``"audit_format":2``). Then

    hash = SHA-256( previous + "\n" + header + "\n" + body )

where ``header`` is ``json.dumps([originator_id, originator_version, topic],
separators=(",", ":"), ensure_ascii=True)`` (``topic`` the stored topic, e.g.
``aggregates.invocation:Terminated``) and ``body`` is the stored state with its
first member (``"chain_hash":"…",``) taken out: a verifier cuts 80 bytes and hashes.
In an encrypted or compressed store, the state is the plaintext the cipher gives back.
Most rows hold that JSON state *packed* (:func:`pack_state`): one byte, the hash in 32
bytes, and the body, compressed with a preset dictionary; unpacked, it is the JSON
state byte for byte, so packing changes nothing the hash covers.

**Format 1** (events without ``audit_format``): the hash covers a canonical form,
rebuilt from the decoded event:

    hash = SHA-256( previous + "\n" + canonical(event) )

where ``canonical`` is the UTF-8 JSON of

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

import binascii
import hashlib
import json
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from eventsourcing.utils import get_topic

from aggregates.json_encoder import ascii_string, c_encoder

GENESIS = "0" * 64
"""The previous hash of an aggregate's first event."""

ENVELOPE = frozenset(
    {"originator_id", "originator_version", "timestamp", "originator_topic", "chain_hash"}
)

AUDIT_FORMAT = 2
"""The audit format of the events written now (see the module's docstring)."""

BODY_EXCLUDE = frozenset({"originator_id", "originator_version", "chain_hash"})
"""The fields left out of an event's body (format 2): the row's columns, and the hash."""

_BODY_FILTER = dict.fromkeys(BODY_EXCLUDE, True)
"""``BODY_EXCLUDE`` as pydantic's serializer takes it without converting it on each call."""

STORED_PREFIX = b'{"chain_hash":"'
"""How the stored state of a format-2 event begins: its hash is its first member."""

_HASH_MEMBER = len(STORED_PREFIX) + 64 + 2
"""The bytes of ``{"chain_hash":"<64 hex>",``: a body is ``{`` and what follows them."""

_TOPICS: dict[type, str] = {}


def topic_of(cls: type) -> str:
    """The stored topic of an event class (eventsourcing's ``get_topic``, cached)."""
    topic = _TOPICS.get(cls)
    if topic is None:
        topic = _TOPICS[cls] = get_topic(cls)
    return topic


@dataclass(frozen=True)
class StoredForm:
    """A row as stored: its topic and its state (decrypted and decompressed)."""

    topic: str
    state: bytes


def event_body(event: Any) -> bytes:
    """An event's body (format 2): its fields as pydantic writes them, without id, version, hash."""
    body: bytes = event.__pydantic_serializer__.to_json(
        event, exclude=_BODY_FILTER, exclude_none=True
    )
    return body


def stored_link(
    previous_hash: str, originator_id: str, version: int, topic: str, body: bytes
) -> str:
    """The format-2 hash of a body that follows ``previous_hash``.

    The header is ``json.dumps([originator_id, version, topic], separators=(",", ":"),
    ensure_ascii=True)``, built here from the encoder's own string function (``dumps``
    makes a new encoder on every call; a test checks the two agree).
    """
    header = f"[{ascii_string(originator_id)},{int(version)},{ascii_string(topic)}]"
    return hashlib.sha256(f"{previous_hash}\n{header}\n".encode() + body).hexdigest()


def stored_header(originator_id: str, version: int, topic: str) -> str:
    """The documented header: what :func:`stored_link` builds faster."""
    return json.dumps([originator_id, version, topic], separators=(",", ":"), ensure_ascii=True)


def stored_state(chain_hash: str, body: bytes) -> bytes:
    """The state stored for a format-2 event: its hash as the first member, then its body."""
    return STORED_PREFIX + chain_hash.encode() + b'",' + body[1:]


def split_stored(state: bytes) -> tuple[str, bytes] | None:
    """The hash and body of a format-2 stored state; None when it is not laid out so."""
    if not state.startswith(STORED_PREFIX) or state[_HASH_MEMBER - 2 : _HASH_MEMBER] != b'",':
        return None
    digest = state[len(STORED_PREFIX) : _HASH_MEMBER - 2]
    if not all(c in b"0123456789abcdef" for c in digest):
        return None
    return digest.decode(), b"{" + state[_HASH_MEMBER:]


# The packed layout: a lossless encoding of a format-2 state, for storage.

PACKED_PLAIN = 0x01
"""First byte of a packed state whose body follows its hash as it is."""

PACKED_DEFLATE = 0x02
"""First byte of a packed state whose body is raw DEFLATE with :data:`PACK_DICTIONARY`."""

PACK_DICTIONARY = b"".join(
    (
        # What a body of each event class is made of (its keys, enum values and defaults),
        # the rarest first: DEFLATE reaches the end of a preset dictionary most cheaply.
        # Never change it: the rows packed with it are read with it (a test pins its hash);
        # another dictionary needs another first byte.
        b'"resolution":"committed","receipt":{"by":"","reason":"","attempt":1,',
        b'"worker_id":"","epoch":1,"taken_from":"","dropped_steps":[],"kept_steps":[],',
        b'"size_before":,"size_after":,"evidence":"","note":"","proposal_digest":"',
        b'"reason":"approval_required","question":"","needs_approval":["","denied":"',
        b'"rejection":{"rejection_class":"schema_invalid","problems":["","raw":',
        b'"kind":"request_approval","summary":"","kind":"clarification","question":"',
        b'"kind":"cannot_continue","reason":"","effect_key":"eff-","effect_status":"committed"',
        b'"error":{"error_class":"tool_failed","retryable":false,"message":"","attempts":',
        b'"originator_topic":"aggregates.invocation:Invocation","audit_format":2,"goal":"',
        b'","agent_name":"","agent_version":"1","catalogue_digest":"","task_class":"',
        b'","actor":"","tenant":"","tools":[{"name":"","effect":"write","schema_digest":"',
        b'"},{"name":"","effect":"read","schema_digest":""}],"budget":{"max_steps":20,',
        b'"max_tool_calls":50,"max_repeated_plan":1,"deadline_s":,"max_tokens":,"max_cost":,',
        b'"wind_down_steps":},"settings":{"max_invalid_proposals":2,"max_verification_attempts":2,',
        b'"max_repeated_failures":3,"tool_failure_limits":{},"price":{"input_per_million":',
        b'"output_per_million":},"context_limit":,"keep_recent_turns":4,"wind_down_notice":',
        b'"{steps_left} step(s) left: summarise what you have and stop.","approval_rules":{"',
        b'":"always","":"never"},"max_output_bytes":1000000,"max_proposal_bytes":256000}}',
        b'"reason":"completed","answer":"","detail":"","steps":,"tool_calls":}',
        b'"kind":"final","answer":"","toolu_',
        b'"calls":[{"call_id":"call_","name":"","arguments":{"},"effect":"read"},',
        b'{"call_id":"call_","name":"","arguments":{"},"effect":"read"}],"plan":[["call_","call_"]]}',
        b'"results":[{"call_id":"call_","name":"","output":{"},"duration_ms":0.0',
        b'},{"call_id":"call_","name":"","output":{"},"duration_ms":0.0}]}',
        b'"decision":{"schema_version":1,"kind":"tool_calls","calls":[{"id":"call_","name":"',
        b'","arguments":{""}},{"id":"call_","name":"","arguments":{""}}]},"usage":{"input_tokens":',
        b',"output_tokens":,"cost":0.0,"latency_ms":0.0}}',
        b'{"timestamp":"20-01T00:00:00.000000Z","audit_format":2,"step":',
    )
)
"""The preset dictionary of :data:`PACKED_DEFLATE` states (``zlib``'s ``zdict``)."""

_DIGEST_BYTES = 32
MAX_DEFLATED_BODY = 64 * 1024 * 1024
"""The largest body stored compressed (a larger one is stored as it is): a compressed body
that inflates past this is damaged or forged, and is refused before it fills memory."""
_PLAIN_TAG = bytes((PACKED_PLAIN,))
_DEFLATE_TAG = bytes((PACKED_DEFLATE,))

_PACKER = zlib.compressobj(6, zlib.DEFLATED, -13, 4, zlib.Z_DEFAULT_STRATEGY, PACK_DICTIONARY)
"""A compressor with the dictionary loaded, copied for each row (loading it again costs
more than the copy). An 8 KB window and memLevel 4 instead of zlib's 32 KB and 8: a
body of a few KB compresses as well, and the copy is smaller. Any inflater reads it."""


def pack_state(state: bytes, *, deflate: bool) -> bytes:
    """A format-2 state in the packed layout; another state unchanged.

    The packed layout is one byte (:data:`PACKED_PLAIN` or :data:`PACKED_DEFLATE`),
    the 32 bytes of the hash, and the body: as it is, or compressed when ``deflate``
    and that makes it smaller. :func:`unpack_state` gives the state back byte for byte.
    """
    split = split_stored(state)
    if split is None:
        return state
    packed = pack_body(*split, deflate=deflate)
    assert packed is not None  # split_stored checked the hash
    return packed


def pack_body(chain_hash: str, body: bytes, *, deflate: bool) -> bytes | None:
    """The packed state of ``stored_state(chain_hash, body)``, built from its two parts.

    None when the hash is not 64 lower-case hex digits (the JSON state is stored then).
    """
    try:
        head = bytes.fromhex(chain_hash)
    except ValueError:
        return None
    if len(head) != _DIGEST_BYTES or head.hex() != chain_hash:
        return None
    if deflate and len(body) <= MAX_DEFLATED_BODY:
        compressor = _PACKER.copy()
        packed = compressor.compress(body) + compressor.flush()
        if len(packed) < len(body):
            return _DEFLATE_TAG + head + packed
    return _PLAIN_TAG + head + body


def is_packed(state: bytes) -> bool:
    """Whether a state is in the packed layout (a JSON state begins with ``{``)."""
    return len(state) > _DIGEST_BYTES and state[0] in (PACKED_PLAIN, PACKED_DEFLATE)


class PackedStateError(ValueError):
    """Raised when a packed state cannot be unpacked (its compressed body is damaged)."""


def unpack_state(state: bytes) -> bytes:
    """The format-2 state a packed state encodes; any other state unchanged.

    Raises:
        PackedStateError: the state is packed, and its body does not decompress to the
            end, leaves bytes after its end, or inflates past :data:`MAX_DEFLATED_BODY`
            (a decompression bomb is refused before it fills memory).
    """
    parts = unpack_parts(state)
    if parts is None:
        return state
    digest, body = parts
    return b"".join((STORED_PREFIX, digest, b'",', memoryview(body)[1:]))


def unpack_parts(state: bytes) -> tuple[bytes, bytes] | None:
    """The hash (64 hex digits) and body of a packed state; None for any other state.

    :func:`unpack_state` is ``STORED_PREFIX + hash + b'",' + body[1:]``: a reader that
    builds JSON of its own around the state (the store's mapper) joins the parts once.

    Raises:
        PackedStateError: as :func:`unpack_state`.
    """
    tag = state[0] if len(state) > _DIGEST_BYTES else None
    if tag == PACKED_DEFLATE:
        decompressor = zlib.decompressobj(-15, zdict=PACK_DICTIONARY)
        try:
            body = decompressor.decompress(state[1 + _DIGEST_BYTES :], MAX_DEFLATED_BODY + 1)
        except zlib.error as error:
            raise PackedStateError(f"its packed body does not decompress: {error}") from None
        if len(body) > MAX_DEFLATED_BODY:
            raise PackedStateError(
                f"its packed body inflates past {MAX_DEFLATED_BODY:,} bytes (no body that large"
                " is stored compressed)"
            )
        if not decompressor.eof or decompressor.unused_data:
            raise PackedStateError("its packed body does not end where its row does")
    elif tag == PACKED_PLAIN:
        body = state[1 + _DIGEST_BYTES :]
    else:
        return None
    if body[:1] != b"{":
        raise PackedStateError("its packed body is not a JSON object")
    return binascii.hexlify(state[1 : 1 + _DIGEST_BYTES]), body


_CANONICAL_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
"""``json.dumps`` with these options builds a new encoder on every call; one is enough."""


def _unencodable(value: object) -> object:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


_C_CANONICAL = c_encoder(default=_unencodable, ensure_ascii=False)
"""The C encoder behind ``_CANONICAL_JSON``, built once (``encode`` builds one per call).

Its output is ``_CANONICAL_JSON.encode``'s, byte for byte (a test checks this); a model
dump has no cycles. Without the C accelerator that method is used."""


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
    """The chain hash an event must carry after ``previous_hash``, in its own audit format.

    For format 2 the body is encoded again here, as the store encodes it; a verifier
    of stored rows hashes the stored bytes instead (``verify_chain`` with ``forms``).
    """
    if getattr(event, "audit_format", None) == AUDIT_FORMAT:
        return stored_link(
            previous_hash,
            event.originator_id,
            event.originator_version,
            topic_of(type(event)),
            event_body(event),
        )
    return link(previous_hash, canonical_record(event))


def _stored_problem(previous: str, event: Any, form: StoredForm) -> str | None:
    """Why a format-2 row's stored bytes do not give its hash, or None."""
    split = split_stored(form.state)
    if split is None:
        return "its stored state does not begin with its hash (not audit format 2)"
    digest, body = split
    if digest != event.chain_hash:
        return "its stored hash is not the hash it decodes to (a duplicated member)"
    expected = stored_link(
        previous, event.originator_id, event.originator_version, form.topic, body
    )
    if digest != expected:
        return "its hash does not match its stored bytes and the previous hash"
    return None


class ChainBreak(Exception):
    """Raised (or returned) when a history is not the one that was written: where and why."""

    def __init__(self, position: int, problem: str) -> None:
        super().__init__(f"position {position}: {problem}")
        self.position = position
        self.problem = problem


def verify_chain(
    entries: Iterable[tuple[int, Any]], forms: Mapping[int, StoredForm] | None = None
) -> tuple[int, str | None, ChainBreak | None]:
    """Check one aggregate's stored events, in stored order.

    ``entries`` are ``(position, event)`` pairs, where the event may be an
    exception if the stored row could not even be decoded. ``forms`` are the rows as
    stored, by position: a format-2 event is checked against its stored bytes (else
    against its encoding again); a format-1 event against its canonical form.

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
        form = None if forms is None else forms.get(position)
        if form is not None and getattr(event, "audit_format", None) == AUDIT_FORMAT:
            stored_problem = _stored_problem(previous, event, form)
            if stored_problem is not None:
                return expected - 1, None, ChainBreak(position, stored_problem)
        elif event.chain_hash != chain_hash_of(previous, event):
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

    Each record has ``id``, ``position``, ``type``, ``timestamp``, ``data`` and ``hash``;
    a format-2 record also ``format`` (2), ``topic`` and ``stored``, the body as stored
    (the text that is hashed; ``data`` must be what it holds).
    """
    previous = GENESIS
    expected = 1
    for record in records:
        if record.get("position") != expected:
            return ChainBreak(
                expected, f"expected position {expected}, found {record.get('position')}"
            )
        if record.get("format") == AUDIT_FORMAT:
            body = str(record.get("stored", "")).encode()
            digest = stored_link(previous, record["id"], expected, str(record.get("topic")), body)
            if record_data(json.loads(body)) != (record.get("data"), record.get("timestamp")):
                return ChainBreak(expected, "its data is not what its stored body holds")
        else:
            canonical = {
                key: record[key] for key in ("data", "id", "position", "timestamp", "type")
            }
            digest = link(previous, canonical)
        if record.get("hash") != digest:
            return ChainBreak(expected, "its hash does not match its content and the previous hash")
        previous = record["hash"]
        expected += 1
    return None


def record_data(body: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """The ``data`` and ``timestamp`` of an export record, from a format-2 body."""
    data = {k: v for k, v in body.items() if k not in ENVELOPE and k != "audit_format"}
    return data, body.get("timestamp")

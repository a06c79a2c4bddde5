"""The store's mapper: pydantic events to stored rows and back, with pydantic's own JSON codec."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any, ClassVar, cast

from eventsourcing.persistence import Mapper, StoredEvent, Transcoder
from eventsourcing.utils import get_topic, resolve_topic
from pydantic import ValidationError

import aggregates.topics  # noqa: F401 - registers the persisted topics before a row is read
from aggregates.audit import (
    AUDIT_FORMAT,
    event_body,
    pack_body,
    stored_state,
    topic_of,
    unpack_parts,
    unpack_state,
)
from aggregates.audit_coverage import KINDS, event_classes
from aggregates.effect import EffectPrepared
from aggregates.events import DomainEvent, stored_body
from aggregates.invocation import LAZY_TURNS, InvocationSnapshot
from aggregates.json_encoder import ascii_string
from aggregates.values import describe_error
from loop_actors._errors import UnreadableEventError
from loop_actors._version import __version__

_IN_COLUMNS = {"originator_id", "originator_version"}
_OUR_PACKAGES = frozenset({"aggregates", "loop_actors", "projections"})
"""A topic in one of these names a class of ours: one this version lacks is a newer one's."""
_JSON_ROWS = frozenset({get_topic(EffectPrepared), get_topic(InvocationSnapshot)})
"""Topics whose rows stay JSON: the effect index reads an ``EffectPrepared``'s
``invocation_id`` in SQL; a sealed snapshot (hundreds of KB) is read at every load of
a long history, and compressed it would be inflated each time."""


@cache
def event_topics() -> frozenset[str]:
    """The topics of every loop-actors event class: all a store's event rows may name."""
    return frozenset(topic_of(cls) for cls in event_classes())


@cache
def readable_topics() -> frozenset[str]:
    """The topics a row may have to be decoded: every event class's, and the snapshots'."""
    return event_topics() | {topic_of(InvocationSnapshot)}


_CREATING_TOPICS = frozenset(topic_of(kind.created) for kind in KINDS)
"""The topics of the events that create an aggregate: they name its class."""

_AGGREGATE_TOPICS = frozenset(get_topic(kind.aggregate) for kind in KINDS)
"""The aggregate classes a creating event may name (``originator_topic``)."""


@cache
def _class_of(topic: str) -> type[DomainEvent]:
    """The class of one of :func:`readable_topics` (resolving it imports nothing new)."""
    assert topic in readable_topics()
    return cast("type[DomainEvent]", resolve_topic(topic))


def _unreadable(stored_event: StoredEvent, problem: str) -> UnreadableEventError:
    return UnreadableEventError(
        str(stored_event.originator_id),
        stored_event.originator_version,
        stored_event.topic,
        problem,
    )


NEWER_VERSION_HINT = (
    f"; it may have been written by a newer loop-actors than this one ({__version__}): "
    "read it with that version or a later one"
)
"""Said of a row that fails as a newer version's would: a field, a format or an event
class of ours that this version does not know (nothing of it is guessed or dropped)."""

_NEWER_SIGNS = frozenset({"extra_forbidden", "less_than_equal"})
"""The validation problems a newer version's row shows: a field this version does not
have, an ``audit_format`` above :data:`~aggregates.audit.AUDIT_FORMAT`."""


def _why(error: Exception) -> str:
    """Why a row did not decode, in one line (a validation error's first problems)."""
    if isinstance(error, ValidationError):
        problems = error.errors(include_url=False, include_input=False)
        shown = "; ".join(
            f"{'.'.join(str(part) for part in problem['loc']) or '(the event)'}: {problem['msg']}"
            for problem in problems[:3]
        )
        more = f" and {len(problems) - 3} more" if len(problems) > 3 else ""
        newer = any(problem["type"] in _NEWER_SIGNS for problem in problems)
        return f"it does not decode as {error.title}: {shown}{more}" + (
            NEWER_VERSION_HINT if newer else ""
        )
    return describe_error(error)


def _validator_of(stored_event: StoredEvent) -> Callable[..., Any]:
    """``model_validate_json`` of the row's class, without its Python wrapper.

    Its validator's own ``validate_json``, once the class is built (the wrapper is about
    a third of a small event's decoding).

    Raises:
        UnreadableEventError: the row's topic names no loop-actors event class. It is
            not resolved: resolving a topic imports the module it names.
    """
    topic = stored_event.topic
    found = _VALIDATORS.get(topic)
    if found is None:
        if topic not in readable_topics():
            ours = topic.split(".", 1)[0] in _OUR_PACKAGES
            raise _unreadable(
                stored_event,
                f"its topic {topic!r} names no loop-actors event class (it is not imported)"
                + (NEWER_VERSION_HINT if ours else ""),
            )
        cls = _class_of(topic)
        if not cls.__pydantic_complete__:  # not built yet: pydantic builds it on first use
            return cls.model_validate_json
        found = _VALIDATORS[topic] = cls.__pydantic_validator__.validate_json
    return found


_VALIDATORS: dict[str, Callable[..., Any]] = {}

_SMALL = 1_000
_VERSIONS = tuple(b"%d" % n for n in range(_SMALL))
"""An event's version as JSON, for the versions most events have."""


class PydanticEventMapper(Mapper[str]):
    """Maps pydantic events to stored records with pydantic's own JSON codec.

    Honours eventsourcing's compressor and cipher settings (``COMPRESSOR_TOPIC``,
    ``CIPHER_TOPIC``/``CIPHER_KEY``) exactly as the default mapper does.

    A state of audit format 2 is stored packed (``aggregates.audit.pack_state``: its
    hash in 32 bytes, its body compressed with a preset dictionary), except the rows
    SQL reads as JSON (:data:`_JSON_ROWS`); reading unpacks it back to the JSON state
    its hash is documented over. See docs/reference/audit-format.md.
    """

    def to_stored_event(self, domain_event: Any) -> StoredEvent:
        """Encode one event.

        An event of audit format 2 is stored as its hash, then the body it was hashed
        over, byte for byte (``aggregates.audit``): a new event's body is the one its
        aggregate kept, so it is not encoded twice. Both are packed (the hash in 32
        bytes, the body compressed) but in the rows SQL reads as JSON.
        """
        # The id and version live in their own columns, and every optional field
        # defaults to None (a test checks this), so neither is repeated in the state.
        topic = topic_of(type(domain_event))
        if getattr(domain_event, "audit_format", None) == AUDIT_FORMAT:
            body = stored_body(domain_event) or event_body(domain_event)
            packed = None
            if topic not in _JSON_ROWS:
                # Compressed only where nothing else does it, and never under a cipher
                # (the length of a compressed body says something about its content).
                deflate = not (self.compressor or self.cipher)
                packed = pack_body(domain_event.chain_hash, body, deflate=deflate)
            state = stored_state(domain_event.chain_hash, body) if packed is None else packed
        else:
            state = domain_event.model_dump_json(exclude=_IN_COLUMNS, exclude_none=True).encode()
        if self.compressor:
            state = self.compressor.compress(state)
        if self.cipher:
            state = self.cipher.encrypt(state)
        return StoredEvent(
            originator_id=domain_event.originator_id,
            originator_version=domain_event.originator_version,
            topic=topic,
            state=state,
        )

    def plain_state(self, stored_event: StoredEvent) -> bytes:
        """A row's state decrypted, decompressed and unpacked: the bytes its audit hash covers.

        Raises:
            aggregates.audit.PackedStateError: the row is packed and its body is damaged.
        """
        state = stored_event.state
        if self.cipher:
            state = self.cipher.decrypt(state)
        if self.compressor:
            state = self.compressor.decompress(state)
        return unpack_state(state)

    def to_domain_event(self, stored_event: StoredEvent) -> Any:
        """Decode one event, validating it against its class.

        What ``decode_plain(stored_event, plain_state(stored_event))`` does, with a packed
        state's hash and body joined into the JSON pydantic reads once (not first into
        the plain state, then again).

        Raises:
            UnreadableEventError: the row cannot be read (its topic is not one of ours,
                its state does not decrypt, unpack or validate): the store was changed
                by hand or damaged.
        """
        try:
            state = stored_event.state
            if self.cipher:
                state = self.cipher.decrypt(state)
            if self.compressor:
                state = self.compressor.decompress(state)
            parts = unpack_parts(state)
            if parts is None:
                return self.decode_plain(stored_event, state)
            digest, body = parts
            return self._validate(
                stored_event, b',"chain_hash":"', digest, b'",', memoryview(body)[1:]
            )
        except UnreadableEventError:
            raise
        except Exception as error:  # what a damaged row raises: reported as the row's
            raise _unreadable(stored_event, _why(error)) from error

    def decode_plain(self, stored_event: StoredEvent, state: bytes) -> Any:
        """Decode one event from its :meth:`plain_state` (given), validating it.

        Raises:
            UnreadableEventError: its topic, or a first event's ``originator_topic``,
                names no loop-actors class (neither is resolved: it would be imported).
            pydantic.ValidationError: the state does not validate as its class.
        """
        body = state.strip()
        if len(body) < 64 and body[1:].strip() == b"}":  # an empty object
            return self._validate(stored_event, b"}")
        # One copy of the state (a snapshot's is hundreds of KB: each copy costs).
        return self._validate(stored_event, b",", memoryview(body)[1:])

    def _validate(self, stored_event: StoredEvent, *rest: bytes | memoryview) -> Any:
        """Validate the JSON object of the event's id and version, then ``rest`` (its members).

        The id and version go back at the front of the JSON object, so that pydantic
        parses and validates the whole record in one (Rust) pass. (The object is built
        by hand: json.dumps of a dict cost as much as the parse.)
        """
        version = stored_event.originator_version
        joined = b"".join(
            (
                b'{"originator_id":',
                # JSON with ASCII escapes: what pydantic reads back is the same string.
                ascii_string(str(stored_event.originator_id)).encode(),
                b',"originator_version":',
                _VERSIONS[version] if 0 <= version < _SMALL else b"%d" % version,
                *rest,
            )
        )
        topic = stored_event.topic
        validate = _VALIDATORS.get(topic) or _validator_of(stored_event)
        event = validate(joined, context=self.context)
        if topic in _CREATING_TOPICS and event.originator_topic not in _AGGREGATE_TOPICS:
            # eventsourcing resolves it (imports it) when the aggregate is first built.
            raise _unreadable(
                stored_event,
                f"its originator_topic {event.originator_topic!r} names no loop-actors "
                "aggregate class (it is not imported)",
            )
        return event

    context: ClassVar[str | None] = None
    """The validation context events are decoded with (see ``SnapshotMapper``)."""


class SnapshotMapper(PydanticEventMapper):
    """The mapper of the snapshots an invocation is loaded from: its turns stay as stored.

    Each turn is validated when it is first read (``aggregates.invocation.Turns``);
    everything else is validated now. ``audit verify`` and resume's check read
    snapshots with the application's own mapper, which validates every turn.
    """

    context = LAZY_TURNS


class UnusedTranscoder(Transcoder):
    """The mapper above encodes with pydantic; eventsourcing still wants a transcoder."""

    def encode(self, obj: Any) -> bytes:
        """Never called: the mapper encodes."""
        raise NotImplementedError

    def decode(self, data: bytes) -> Any:
        """Never called: the mapper decodes."""
        raise NotImplementedError

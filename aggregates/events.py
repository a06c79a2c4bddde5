"""The base of every persisted domain event."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, TypeVar

from eventsourcing.domain import BaseAggregate, CanMutateAggregate
from eventsourcing.utils import get_topic
from pydantic import BaseModel, ConfigDict, Field
from pydantic_core import TzInfo

from aggregates.audit import AUDIT_FORMAT, GENESIS, event_body, stored_link, topic_of
from aggregates.pydantic_slots import set_in_place


class DomainEvent(BaseModel, CanMutateAggregate[str]):
    """A frozen, JSON-able fact about one aggregate, applied by the aggregate's ``_evolve``."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    originator_id: str
    originator_version: int
    timestamp: datetime
    chain_hash: str = ""
    """SHA-256 over the previous event's hash and this event (``aggregates.audit``)."""
    audit_format: int | None = Field(default=None, le=AUDIT_FORMAT)
    """2 for events hashed as stored; None (left out) for those of format 1. A higher
    format is a newer loop-actors': refused when read, never misread."""

    __slots__ = ("_sealed_body",)
    # The body the hash was computed over, for the store to write as it is (``seal``).
    # A slot, not a pydantic private attribute: pydantic leaves a slot alone (it is not
    # serialised, compared, copied or pickled), and an event class without private
    # attributes is built and decoded without pydantic's post-init hook (about 1.4 us
    # an event). A copy, a decoded event, or one built any other way has no body.

    def apply(self, aggregate: Any) -> None:
        """Fold this event into the aggregate (eventsourcing's hook)."""
        aggregate._evolve(self)
        aggregate.last_hash = self.chain_hash


def seal(event: Any, previous_hash: str) -> None:
    """Hash an event that was just built (format 2), and put the hash into it.

    The event is frozen for everyone else, and nothing else has seen it yet; writing
    the field in place saves a copy (and a second validation) of every event. Its body
    is kept for the store, which writes it as it was hashed. A snapshot is sealed the
    same way (``InvocationSnapshot.take``): any model with ``originator_id``,
    ``originator_version``, a ``chain_hash`` field and a ``_sealed_body`` slot.
    """
    body = event_body(event)
    chain_hash = stored_link(
        previous_hash, event.originator_id, event.originator_version, topic_of(type(event)), body
    )
    set_in_place(event, "chain_hash", chain_hash)
    object.__setattr__(event, "_sealed_body", body)


def stored_body(event: DomainEvent) -> bytes | None:
    """The body a new event was hashed over (None for an event read from a store or copied)."""
    body: bytes | None = getattr(event, "_sealed_body", None)
    return body


class ChainedAggregate(BaseAggregate[str]):
    """An aggregate whose new events are chained by hash (see ``aggregates.audit``).

    Events are built, hashed, then applied: the same steps as eventsourcing's
    ``trigger_event`` and ``_create``, with the hash put in between.
    """

    last_hash: str = GENESIS

    def take_events(self) -> list[Any]:
        """Remove and return the events not yet saved."""
        return list(self.collect_events())

    @classmethod
    def _create_chained(cls, event_class: type[Any], *, id: str, **fields: Any) -> Any:
        event = event_class(
            originator_topic=get_topic(cls),
            originator_id=id,
            originator_version=cls.INITIAL_VERSION,
            audit_format=AUDIT_FORMAT,
            **fields,
        )
        seal(event, GENESIS)
        aggregate: Any = event.mutate(None)
        aggregate._pending_events.append(event)
        return aggregate

    def trigger_event(self, event_class: type[Any], **fields: Any) -> None:
        """Build the next event, chain it to the last one, apply it and queue it."""
        event = event_class(
            originator_id=self.id,
            originator_version=self.version + 1,
            audit_format=AUDIT_FORMAT,
            **fields,
        )
        seal(event, self.last_hash)
        # eventsourcing's ``mutate`` without its two checks, true by construction here
        # (the event's id is this aggregate's, its version the next): the same steps.
        event.apply(self)
        self.version = event.originator_version
        self.modified_on = event.timestamp
        self._pending_events.append(event)


_Value = TypeVar("_Value")


class ByClass(dict[type, _Value]):
    """What a class maps to, worked out once per class by ``decide``, then looked up.

    For the read models' per-event dispatch: ``isinstance(event, C)`` against a pydantic
    class ``C`` that ``event`` is not exactly an instance of walks the event's MRO and then
    reads its ``__class__`` through ``BaseModel.__getattr__``'s hook (several hundred
    instructions for a failed check, several per event in each read model), where
    ``table[type(event)]`` is one dict lookup. ``decide`` must depend on the class alone
    (``issubclass`` does: pydantic models have no virtual subclasses).
    """

    def __init__(self, decide: Callable[[type], _Value]) -> None:
        super().__init__()
        self._decide = decide

    def __missing__(self, cls: type) -> _Value:
        value = self[cls] = self._decide(cls)
        return value


_TWO_DIGITS = tuple(f"{n:02d}" for n in range(100))
_FIXED_OFFSETS = (timezone, TzInfo)
"""tzinfo classes whose offset is one for every time (pydantic reads ``Z`` as a ``TzInfo``)."""
_ZERO = timedelta(0)
_utc: list[object] = [UTC]
"""The tzinfo last seen to be UTC (pydantic gives every time it reads one and the same)."""


def isoformat(moment: datetime) -> str:
    """``moment.isoformat()``, written without ``sprintf`` for a UTC time.

    ``datetime.isoformat`` formats through ``PyUnicode_FromFormat`` and the C library's
    ``sprintf``, and asks the tzinfo for its offset each time: about 11,700 instructions
    under callgrind, 0.79 us against this one's 0.33. The read models write a time of most
    events. Anything but
    a ``datetime`` in UTC (a fixed offset of zero) of a four-digit year is
    ``moment.isoformat()`` itself.
    """
    zone = moment.tzinfo
    if zone is not _utc[0]:
        if zone is None or type(zone) not in _FIXED_OFFSETS or zone.utcoffset(moment) != _ZERO:
            return moment.isoformat()
        _utc[0] = zone
    year = moment.year
    if year < 1000 or type(moment) is not datetime:
        return moment.isoformat()
    two = _TWO_DIGITS
    day = f"{year}-{two[moment.month]}-{two[moment.day]}"
    clock = f"{two[moment.hour]}:{two[moment.minute]}:{two[moment.second]}"
    micro = moment.microsecond
    if micro:
        return (
            f"{day}T{clock}.{two[micro // 10000]}{two[micro // 100 % 100]}{two[micro % 100]}+00:00"
        )
    return f"{day}T{clock}+00:00"


def fold(aggregate: Any, events: Iterable[DomainEvent]) -> Any:
    """Fold events into an aggregate (a projector for eventsourcing's ``Repository.get``).

    The same loop as eventsourcing's default projector without its per-event
    runtime Protocol check, which costs more than the fold itself.
    """
    for event in events:
        aggregate = event.mutate(aggregate)
    return aggregate

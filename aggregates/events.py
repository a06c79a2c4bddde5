"""The base of every persisted domain event."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from eventsourcing.domain import BaseAggregate, CanMutateAggregate
from eventsourcing.utils import get_topic
from pydantic import BaseModel, ConfigDict

from aggregates.audit import GENESIS, chain_hash_of


class DomainEvent(BaseModel, CanMutateAggregate[str]):
    """A frozen, JSON-able fact about one aggregate, applied by the aggregate's ``_evolve``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    originator_id: str
    originator_version: int
    timestamp: datetime
    chain_hash: str = ""
    """SHA-256 over the previous event's hash and this event's canonical form (``audit``)."""

    def apply(self, aggregate: Any) -> None:
        """Fold this event into the aggregate (eventsourcing's hook)."""
        aggregate._evolve(self)
        aggregate.last_hash = self.chain_hash


def _seal(event: DomainEvent, chain_hash: str) -> None:
    """Put the hash into an event that was just built and that nothing else has seen yet.

    The event is frozen for everyone else; writing the field in place saves a copy
    (and a second validation) of every event.
    """
    event.__dict__["chain_hash"] = chain_hash
    event.__pydantic_fields_set__.add("chain_hash")


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
            **fields,
        )
        _seal(event, chain_hash_of(GENESIS, event))
        aggregate: Any = event.mutate(None)
        aggregate._pending_events.append(event)
        return aggregate

    def trigger_event(self, event_class: type[Any], **fields: Any) -> None:
        """Build the next event, chain it to the last one, apply it and queue it."""
        event = event_class(originator_id=self.id, originator_version=self.version + 1, **fields)
        _seal(event, chain_hash_of(self.last_hash, event))
        event.mutate(self)
        self._pending_events.append(event)


def fold(aggregate: Any, events: Iterable[DomainEvent]) -> Any:
    """Fold events into an aggregate (a projector for eventsourcing's ``Repository.get``).

    The same loop as eventsourcing's default projector without its per-event
    runtime Protocol check, which costs more than the fold itself.
    """
    for event in events:
        aggregate = event.mutate(aggregate)
    return aggregate

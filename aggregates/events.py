"""The base of every persisted domain event."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from eventsourcing.domain import CanMutateAggregate
from pydantic import BaseModel, ConfigDict


class DomainEvent(BaseModel, CanMutateAggregate[str]):
    """A frozen, JSON-able fact about one aggregate, applied by the aggregate's ``_evolve``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    originator_id: str
    originator_version: int
    timestamp: datetime

    def apply(self, aggregate: Any) -> None:
        """Fold this event into the aggregate (eventsourcing's hook)."""
        aggregate._evolve(self)


def fold(aggregate: Any, events: Iterable[DomainEvent]) -> Any:
    """Fold events into an aggregate (a projector for eventsourcing's ``Repository.get``).

    The same loop as eventsourcing's default projector without its per-event
    runtime Protocol check, which costs more than the fold itself.
    """
    for event in events:
        aggregate = event.mutate(aggregate)
    return aggregate

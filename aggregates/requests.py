"""Requests made to an invocation from outside while it may be running.

A cancel request is its own aggregate (one per invocation), not an event of the
invocation: the invocation's stream has one writer, the worker that runs it,
and a request appended there from another process would collide with that
worker's next commit. The worker notices the request and records the outcome
(``Terminated`` with reason ``cancelled``) in the invocation itself.
"""

from __future__ import annotations

from datetime import datetime

from eventsourcing.domain import CanInitAggregate

from aggregates.events import ChainedAggregate, DomainEvent

CANCEL_REQUEST_PREFIX = "cancel:"
"""The namespace of cancel requests' ids (no invocation id starts with it: ``aggregates.ids``)."""


def cancel_request_id(invocation_id: str) -> str:
    """The id of an invocation's cancel request."""
    return f"{CANCEL_REQUEST_PREFIX}{invocation_id}"


class CancelRequested(DomainEvent, CanInitAggregate[str]):
    """Someone asked an invocation to stop."""

    originator_topic: str
    invocation_id: str
    by: str | None = None
    reason: str | None = None


class CancelRequest(ChainedAggregate):
    """An invocation's cancel request."""

    def __init__(self) -> None:
        """Construct an empty shell; ``CancelRequested`` fills it."""
        self.invocation_id = ""
        self.by: str | None = None
        self.reason: str | None = None

    @classmethod
    def record(
        cls, invocation_id: str, *, at: datetime, by: str | None = None, reason: str | None = None
    ) -> CancelRequest:
        """Create the request (records ``CancelRequested``)."""
        return cls._create_chained(  # type: ignore[no-any-return]
            CancelRequested,
            id=cancel_request_id(invocation_id),
            timestamp=at,
            invocation_id=invocation_id,
            by=by,
            reason=reason,
        )

    def _evolve(self, event: DomainEvent) -> None:
        if isinstance(event, CancelRequested):
            self.invocation_id = event.invocation_id
            self.by = event.by
            self.reason = event.reason

"""The effect ledger: one ``Effect`` aggregate per external write, keyed by its effect key.

A checkpoint says what the loop decided and observed; only the owning service's
receipt proves that a write happened. The ledger records, for each write, what
the runtime knows about it:

    prepared → dispatched → committed | rejected | outcome_unknown → reconciled

``prepared`` and ``dispatched`` are committed before the call starts (with the
invocation's ``BatchDispatched``), the outcome after. A write that timed out or
lost its connection is ``outcome_unknown`` — never ``failed`` — and is resolved
by asking the owning service (``reconcile(effect_key)``), never by a blind retry.
A service that answers "not found" sends the effect back to ``prepared``: it is
dispatched again, with the same key.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from enum import StrEnum
from typing import Any, cast

from eventsourcing.domain import CanInitAggregate
from pydantic import JsonValue

from aggregates.decisions import EffectStatus
from aggregates.errors import IllegalTransitionError
from aggregates.events import ChainedAggregate, DomainEvent

EFFECT_KEY_PREFIX = "eff-"
"""The namespace of effect keys (no invocation id starts with it: ``aggregates.ids``)."""

KEY_SEPARATOR = "\x1f"


def effect_key(invocation_id: str, step: int, call_id: str) -> str:
    """The effect key of a call: stable across retries, restarts and workers, never random.

    Call ids are only unique within one batch, so the step is part of the key.
    The parts are joined by the unit separator (U+001F); the id cannot contain it
    (``aggregates.ids``) and the step is digits, so the first two separators are
    the joins and two different calls never share a key, whatever characters the
    call id has.

    Raises:
        ValueError: the invocation id contains the separator.
    """
    if KEY_SEPARATOR in invocation_id:
        raise ValueError(f"invocation id {invocation_id!r} contains the key separator \\x1f")
    parts = f"{invocation_id}{KEY_SEPARATOR}{step}{KEY_SEPARATOR}{call_id}"
    digest = hashlib.sha256(parts.encode()).hexdigest()
    return f"{EFFECT_KEY_PREFIX}{digest[:40]}"


class Resolution(StrEnum):
    """What the owning service said about an effect key when asked."""

    COMMITTED = "committed"
    REJECTED = "rejected"
    NOT_FOUND = "not_found"


class EffectEvent(DomainEvent):
    """Base of every Effect event."""


class EffectPrepared(EffectEvent, CanInitAggregate[str]):
    """A write was validated and is about to be dispatched for the first time."""

    originator_topic: str
    invocation_id: str
    step: int
    call_id: str
    tool: str
    arguments_digest: str


class EffectDispatched(EffectEvent):
    """The write is handed to its tool (attempt 1, or again after a "not found")."""

    attempt: int


class EffectCommitted(EffectEvent):
    """The tool returned: the service committed the write; its receipt."""

    receipt: JsonValue = None


class EffectRejected(EffectEvent):
    """The service refused the write."""

    reason: str


class EffectOutcomeUnknown(EffectEvent):
    """The call timed out or lost its connection: the write may or may not have happened."""

    reason: str


class EffectReconciled(EffectEvent):
    """The owning service was asked by effect key and answered."""

    resolution: Resolution
    receipt: JsonValue = None
    reason: str | None = None


EFFECT_EVENT_TYPES: tuple[type[EffectEvent], ...] = (
    EffectPrepared,
    EffectDispatched,
    EffectCommitted,
    EffectRejected,
    EffectOutcomeUnknown,
    EffectReconciled,
)

OPEN_STATUSES = frozenset({EffectStatus.DISPATCHED, EffectStatus.OUTCOME_UNKNOWN})
"""Effects whose outcome nobody knows yet: the reconciler's backlog."""


class Effect(ChainedAggregate):
    """One external write and what is known about it."""

    def __init__(self) -> None:
        """Construct an empty shell; ``EffectPrepared`` fills it in ``_evolve``."""
        self.invocation_id = ""
        self.step = 0
        self.call_id = ""
        self.tool = ""
        self.arguments_digest = ""
        self.status = EffectStatus.PREPARED
        self.attempt = 0
        self.receipt: Any = None
        self.reason: str | None = None
        self.resolution: Resolution | None = None

    @classmethod
    def prepare(
        cls,
        *,
        invocation_id: str,
        step: int,
        call_id: str,
        tool: str,
        arguments_digest: str,
        at: datetime,
    ) -> Effect:
        """Create the ledger entry of a write (records ``EffectPrepared``)."""
        return cls._create_chained(  # type: ignore[no-any-return]
            EffectPrepared,
            id=effect_key(invocation_id, step, call_id),
            timestamp=at,
            invocation_id=invocation_id,
            step=step,
            call_id=call_id,
            tool=tool,
            arguments_digest=arguments_digest,
        )

    @property
    def key(self) -> str:
        """The effect key (the aggregate id)."""
        return self.id

    @property
    def is_open(self) -> bool:
        """True while nobody knows whether the write happened."""
        return self.status in OPEN_STATUSES

    def take_events(self) -> list[EffectEvent]:
        """Remove and return the events not yet saved."""
        return cast("list[EffectEvent]", self.collect_events())

    def dispatch(self, *, at: datetime) -> None:
        """Record that the write is handed to its tool (next attempt)."""
        self.trigger_event(EffectDispatched, timestamp=at, attempt=self.attempt + 1)

    def commit(self, receipt: Any, *, at: datetime) -> None:
        """Record the service's receipt."""
        self.trigger_event(EffectCommitted, timestamp=at, receipt=receipt)

    def reject(self, reason: str, *, at: datetime) -> None:
        """Record that the service refused the write."""
        self.trigger_event(EffectRejected, timestamp=at, reason=reason)

    def mark_unknown(self, reason: str, *, at: datetime) -> None:
        """Record that the write's outcome is unknown."""
        self.trigger_event(EffectOutcomeUnknown, timestamp=at, reason=reason)

    def reconcile(
        self,
        resolution: Resolution,
        *,
        at: datetime,
        receipt: Any = None,
        reason: str | None = None,
    ) -> None:
        """Record what the owning service said about this key."""
        self.trigger_event(
            EffectReconciled, timestamp=at, resolution=resolution, receipt=receipt, reason=reason
        )

    def _refuse(self, event: EffectEvent, why: str) -> IllegalTransitionError:
        return IllegalTransitionError(
            f"{type(event).__name__} refused for effect {self.id} in status "
            f"{self.status.value}: {why}"
        )

    def _evolve(self, event: EffectEvent) -> None:
        """Check that ``event`` is legal now, then apply it (the only place state changes)."""
        match event:
            case EffectPrepared():
                self.invocation_id = event.invocation_id
                self.step = event.step
                self.call_id = event.call_id
                self.tool = event.tool
                self.arguments_digest = event.arguments_digest
                self.status = EffectStatus.PREPARED
            case EffectDispatched():
                if self.status is not EffectStatus.PREPARED:
                    raise self._refuse(event, "only a prepared write is dispatched")
                if event.attempt != self.attempt + 1:
                    raise self._refuse(event, f"attempt must be {self.attempt + 1}")
                self.attempt = event.attempt
                self.status = EffectStatus.DISPATCHED
            case EffectCommitted() | EffectRejected() | EffectOutcomeUnknown():
                if self.status is not EffectStatus.DISPATCHED:
                    raise self._refuse(event, "an outcome needs a dispatched write")
                if isinstance(event, EffectCommitted):
                    self.status, self.receipt = EffectStatus.COMMITTED, event.receipt
                elif isinstance(event, EffectRejected):
                    self.status, self.reason = EffectStatus.REJECTED, event.reason
                else:
                    self.status, self.reason = EffectStatus.OUTCOME_UNKNOWN, event.reason
            case EffectReconciled():
                if self.status not in OPEN_STATUSES:
                    raise self._refuse(event, "only an open effect is reconciled")
                if event.resolution is Resolution.NOT_FOUND:
                    # The service never saw this key: dispatch again, with the same key.
                    self.status = EffectStatus.PREPARED
                else:
                    self.status = EffectStatus.RECONCILED
                    self.resolution = event.resolution
                    self.receipt = event.receipt
                    self.reason = event.reason
            case _:
                raise IllegalTransitionError(f"unknown event {type(event).__name__}")


def effect_status_after(event: object) -> str | None:
    """The ledger status an effect event leads to (None for a non-effect event).

    Read models use it to follow effects without loading the aggregate.
    """
    match event:
        case EffectPrepared():
            return EffectStatus.PREPARED.value
        case EffectDispatched():
            return EffectStatus.DISPATCHED.value
        case EffectCommitted():
            return EffectStatus.COMMITTED.value
        case EffectRejected():
            return EffectStatus.REJECTED.value
        case EffectOutcomeUnknown():
            return EffectStatus.OUTCOME_UNKNOWN.value
        case EffectReconciled(resolution=Resolution.NOT_FOUND):
            return EffectStatus.PREPARED.value
        case EffectReconciled():
            return EffectStatus.RECONCILED.value
        case _:
            return None

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
dispatched again, with the same key. An open effect that no service can settle
(a write tool without ``reconcile``) is settled by a person
(``EffectResolvedByHand``: committed with a receipt, or rejected with a reason,
and who said so).
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from enum import StrEnum
from typing import Any, assert_never, cast

from eventsourcing.domain import CanInitAggregate
from pydantic import JsonValue

from aggregates.decisions import EffectStatus
from aggregates.errors import AggregateError, IllegalTransitionError
from aggregates.events import ByClass, ChainedAggregate, DomainEvent
from aggregates.ids import EFFECT_KEY_PREFIX
from aggregates.invocation import Phase
from aggregates.standing import stopped
from aggregates.values import DEFAULT_MAX_OUTPUT_BYTES, check_json, json_size

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


class EffectResolvedByHand(EffectEvent):
    """A person settled an open effect: the write happened (its receipt) or it did not (why)."""

    resolution: Resolution
    """``committed`` or ``rejected`` (never ``not_found``: a person does not re-send a write)."""
    by: str
    """Who settled it."""
    receipt: JsonValue = None
    """For ``committed``: the receipt (as its tool redacts it, when the agent was known)."""
    reason: str | None = None
    """Why: required for ``rejected``, an optional note for ``committed``."""


EFFECT_EVENT_TYPES: tuple[type[EffectEvent], ...] = (
    EffectPrepared,
    EffectDispatched,
    EffectCommitted,
    EffectRejected,
    EffectOutcomeUnknown,
    EffectReconciled,
    EffectResolvedByHand,
)

OPEN_STATUSES = frozenset({EffectStatus.DISPATCHED, EffectStatus.OUTCOME_UNKNOWN})
"""Effects whose outcome nobody knows yet: the reconciler's backlog."""


_OPENED: dict[type[EffectEvent], frozenset[EffectStatus]] = {
    # What the service or a person says about an open write: reconciled ``not_found``
    # prepares it to be dispatched again; any other answer settles it.
    EffectReconciled: frozenset({EffectStatus.RECONCILED, EffectStatus.PREPARED}),
    EffectResolvedByHand: frozenset({EffectStatus.RECONCILED}),
}

LEDGER_TRANSITIONS: dict[EffectStatus, dict[type[EffectEvent], frozenset[EffectStatus]]] = {
    EffectStatus.PREPARED: {EffectDispatched: frozenset({EffectStatus.DISPATCHED})},
    EffectStatus.DISPATCHED: {
        EffectCommitted: frozenset({EffectStatus.COMMITTED}),
        EffectRejected: frozenset({EffectStatus.REJECTED}),
        EffectOutcomeUnknown: frozenset({EffectStatus.OUTCOME_UNKNOWN}),
        **_OPENED,
    },
    EffectStatus.OUTCOME_UNKNOWN: dict(_OPENED),
    EffectStatus.COMMITTED: {},
    EffectStatus.REJECTED: {},
    EffectStatus.RECONCILED: {},
}
"""The table of the effect ledger: status and event → the statuses the event may lead to.

``EffectPrepared`` creates the entry (in status ``prepared``) and comes once, first.
An event outside its status's row is refused before anything changes.
"""

_REFUSED_WHY: dict[type[EffectEvent], str] = {
    EffectPrepared: "an effect is prepared once, first",
    EffectDispatched: "only a prepared write is dispatched",
    EffectCommitted: "an outcome needs a dispatched write",
    EffectRejected: "an outcome needs a dispatched write",
    EffectOutcomeUnknown: "an outcome needs a dispatched write",
    EffectReconciled: "only an open effect is reconciled",
    EffectResolvedByHand: "only an open effect is resolved by hand",
}
"""Why an event outside its status's row is refused, by event class."""


class InvalidResolutionError(AggregateError):
    """Raised when a resolution by hand is malformed; nothing is recorded."""


class Settler(StrEnum):
    """Who can settle an open effect."""

    SWEEPER = "sweeper"
    """A resume or a sweep (``loop-actors reconcile``) asks its service again."""
    PERSON = "person"
    """Only a person can (``loop-actors effects resolve``)."""
    RECONCILE_OR_PERSON = "reconcile_or_person"
    """Its invocation ended, and the tools are not known: a sweep (``loop-actors reconcile``)
    settles it if its tool has a ``reconcile`` function, else only a person can."""


def who_settles(*, invocation_ended: bool, service_can_be_asked: bool | None) -> Settler:
    """Who settles an open effect.

    ``service_can_be_asked`` is known only with the agent (does its tool have a
    ``reconcile`` function?); without it (None), an effect whose invocation ended is
    the sweep's if its tool can ask the service, else a person's: no run of it will
    settle it.
    """
    if service_can_be_asked is None:
        return Settler.RECONCILE_OR_PERSON if invocation_ended else Settler.SWEEPER
    return Settler.SWEEPER if service_can_be_asked else Settler.PERSON


def hand_resolution(*, committed: bool, rejected: bool) -> Resolution:
    """The resolution a person chose: exactly one of committed and rejected.

    Raises:
        InvalidResolutionError: both or neither.
    """
    if committed and rejected:
        raise InvalidResolutionError("say either committed or rejected, not both")
    if not committed and not rejected:
        raise InvalidResolutionError("say whether the write happened: committed or rejected")
    return Resolution.COMMITTED if committed else Resolution.REJECTED


MAX_HAND_RECEIPT_BYTES = DEFAULT_MAX_OUTPUT_BYTES
"""The largest receipt a person gives (compact JSON bytes): a larger one is refused, not cut."""


def receipt_problem(receipt: Any) -> str | None:
    """Why a receipt cannot enter the ledger, or None: the one check of every receipt.

    A service's receipt (reconciled) and a person's (resolved by hand) are both checked
    here, with the rules of every stored JSON value (:func:`aggregates.values.check_json`:
    no NaN or Infinity, integers within 64 bits, at most 64 levels deep, no lone
    surrogate, string keys).
    """
    return check_json(receipt)


def storable_receipt(receipt: Any) -> JsonValue:
    """A receipt given by hand, checked: JSON that reads back equal, by :func:`receipt_problem`.

    Raises:
        InvalidResolutionError: it is not JSON, or not stored faithfully (NaN,
            Infinity, a tuple, a key that is not a string, a lone surrogate, an
            integer outside 64 bits, deeper than 64 levels), or it is larger than
            :data:`MAX_HAND_RECEIPT_BYTES`.
    """
    try:
        text = json.dumps(receipt, allow_nan=False, ensure_ascii=False)
        text.encode()
    except (TypeError, ValueError, RecursionError) as error:
        raise InvalidResolutionError(f"the receipt cannot be stored as JSON: {error}") from None
    if json.loads(text) != receipt:
        raise InvalidResolutionError(
            "the receipt would not read back as given (tuples, keys that are not strings "
            "and the like are not JSON): give plain JSON"
        )
    problem = receipt_problem(receipt)
    if problem is not None:
        raise InvalidResolutionError(f"the receipt cannot be stored as JSON: {problem}")
    size = json_size(receipt)
    if size > MAX_HAND_RECEIPT_BYTES:
        raise InvalidResolutionError(
            f"the receipt is {size} bytes of JSON, more than {MAX_HAND_RECEIPT_BYTES}: "
            "give the part that identifies the write (an id, a reference)"
        )
    return cast("JsonValue", receipt)


def check_hand_resolution(
    resolution: Resolution, *, by: str, receipt: Any, reason: str | None
) -> JsonValue:
    """Check what a person says about an effect, before anything is read or written.

    Returns the receipt as it will be stored (before the tool's redaction).

    Raises:
        InvalidResolutionError: no name, ``not_found``, a rejection without a
            reason or with a receipt, a receipt that cannot be stored faithfully.
    """
    if not isinstance(by, str) or not by.strip():
        raise InvalidResolutionError("say who settles the effect (by): it is recorded")
    if reason is not None and not isinstance(reason, str):
        raise InvalidResolutionError("the reason must be text")
    match resolution:
        case Resolution.COMMITTED:
            return storable_receipt(receipt)
        case Resolution.REJECTED:
            if reason is None or not reason.strip():
                raise InvalidResolutionError(
                    "a rejection needs a reason: it is recorded and told to the model"
                )
            if receipt is not None:
                raise InvalidResolutionError(
                    "a rejected write has no receipt: give a receipt only with committed"
                )
            return None
        case Resolution.NOT_FOUND:
            raise InvalidResolutionError(
                "a person settles a write as committed or rejected; a write the service "
                "never saw is dispatched again only by a resume"
            )
        case _:
            raise InvalidResolutionError(f"unknown resolution {resolution!r}")


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
        self.resolved_by: str | None = None
        """Who settled it by hand (None when a service answered)."""

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

    @property
    def happened(self) -> bool | None:
        """Whether the write happened, as the ledger knows it for good; None: not known.

        True when the tool returned, or its service or a person said it was committed;
        False when it was refused or said rejected; None while it is prepared,
        dispatched or of unknown outcome.
        """
        match self.status:
            case EffectStatus.COMMITTED:
                return True
            case EffectStatus.REJECTED:
                return False
            case EffectStatus.RECONCILED:
                return self.resolution is Resolution.COMMITTED
            case EffectStatus.PREPARED | EffectStatus.DISPATCHED | EffectStatus.OUTCOME_UNKNOWN:
                return None
            case _:
                assert_never(self.status)

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

    def resolve_by_hand(
        self,
        resolution: Resolution,
        *,
        by: str,
        invocation_phase: Phase,
        at: datetime,
        receipt: Any = None,
        reason: str | None = None,
    ) -> None:
        """Record that a person settled this open effect (``EffectResolvedByHand``).

        ``receipt`` is stored as given: redact it first (the tool's
        ``sensitive_output``). ``invocation_phase`` is its invocation's phase:
        an invocation that is neither paused nor ended may still be running the
        write, and its effect is not settled behind its back.

        Raises:
            InvalidResolutionError: see :func:`check_hand_resolution`.
            IllegalTransitionError: the effect is not open (already settled, or
                prepared to be dispatched again), or its invocation may still be running.
        """
        check_hand_resolution(resolution, by=by, receipt=receipt, reason=reason)
        if not self.is_open:
            settled = self.resolution.value if self.resolution is not None else None
            who = f" by {self.resolved_by}" if self.resolved_by else ""
            raise IllegalTransitionError(
                f"effect {self.id} is not open (status {self.status.value}"
                + (f": {settled}{who}" if settled else "")
                + "): there is nothing to settle"
            )
        if stopped(invocation_phase) is None:
            raise IllegalTransitionError(
                f"effect {self.id}: its invocation {self.invocation_id} is neither paused nor "
                f"ended (phase {invocation_phase.value}), so the write may still be running; "
                "resume it (it pauses reconciliation_required when the service cannot be "
                "asked) or cancel it, then resolve"
            )
        self.trigger_event(
            EffectResolvedByHand,
            timestamp=at,
            resolution=resolution,
            by=by,
            receipt=receipt,
            reason=reason,
        )

    def _refuse(self, event: EffectEvent, why: str) -> IllegalTransitionError:
        return IllegalTransitionError(
            f"{type(event).__name__} refused for effect {self.id} in status "
            f"{self.status.value}: {why}"
        )

    def _evolve(self, event: EffectEvent) -> None:
        """Check that ``event`` is legal now, then apply it (the only place state changes).

        First the table (:data:`LEDGER_TRANSITIONS`), then the event's own checks.
        """
        if isinstance(event, EffectPrepared):
            if self.invocation_id:
                raise self._refuse(event, _REFUSED_WHY[EffectPrepared])
        elif type(event) not in LEDGER_TRANSITIONS[self.status]:
            raise self._refuse(
                event, _REFUSED_WHY.get(type(event), f"unknown event {type(event).__name__}")
            )
        match event:
            case EffectPrepared():
                self.invocation_id = event.invocation_id
                self.step = event.step
                self.call_id = event.call_id
                self.tool = event.tool
                self.arguments_digest = event.arguments_digest
                self.status = EffectStatus.PREPARED
            case EffectDispatched():
                if event.attempt != self.attempt + 1:
                    raise self._refuse(event, f"attempt must be {self.attempt + 1}")
                self.attempt = event.attempt
                self.status = EffectStatus.DISPATCHED
            case EffectCommitted():
                self.status, self.receipt = EffectStatus.COMMITTED, event.receipt
            case EffectRejected():
                self.status, self.reason = EffectStatus.REJECTED, event.reason
            case EffectOutcomeUnknown():
                self.status, self.reason = EffectStatus.OUTCOME_UNKNOWN, event.reason
            case EffectReconciled():
                if event.resolution is Resolution.NOT_FOUND:
                    # The service never saw this key: dispatch again, with the same key.
                    self.status = EffectStatus.PREPARED
                else:
                    self.status = EffectStatus.RECONCILED
                    self.resolution = event.resolution
                    self.receipt = event.receipt
                    self.reason = event.reason
            case EffectResolvedByHand():
                if event.resolution is Resolution.NOT_FOUND:
                    raise self._refuse(event, "a person settles a write as committed or rejected")
                self.status = EffectStatus.RECONCILED
                self.resolution = event.resolution
                self.receipt = event.receipt
                self.reason = event.reason
                self.resolved_by = event.by
            case _:
                raise IllegalTransitionError(f"unknown event {type(event).__name__}")


def effect_status_after(event: object) -> str | None:
    """The ledger status an effect event leads to (None for a non-effect event).

    Read models use it to follow effects without loading the aggregate, for every event
    they see: the answer of every class but ``EffectReconciled``'s is its class's, looked
    up (``ByClass``), so an event of any other class costs one dict lookup.
    """
    status = _STATUS_OF_CLASS[type(event)]
    if status is not _BY_RESOLUTION:
        return status
    reconciled = cast("EffectReconciled", event)
    return _PREPARED if reconciled.resolution is Resolution.NOT_FOUND else _RECONCILED


_BY_RESOLUTION = "by resolution"
"""A class whose events lead to a status their resolution says (``EffectReconciled``)."""


def _class_status(cls: type) -> str | None:
    """What every event of ``cls`` leads to, or ``_BY_RESOLUTION``."""
    if not issubclass(cls, EffectEvent):
        return None
    for case, status in _CLASS_STATUSES:
        if issubclass(cls, case):
            return status
    return None


# The statuses' values, read once (an enum member's ``value`` is a Python property).
_PREPARED = EffectStatus.PREPARED.value
_DISPATCHED = EffectStatus.DISPATCHED.value
_COMMITTED = EffectStatus.COMMITTED.value
_REJECTED = EffectStatus.REJECTED.value
_OUTCOME_UNKNOWN = EffectStatus.OUTCOME_UNKNOWN.value
_RECONCILED = EffectStatus.RECONCILED.value
_CLASS_STATUSES: tuple[tuple[type, str], ...] = (
    (EffectPrepared, _PREPARED),
    (EffectDispatched, _DISPATCHED),
    (EffectCommitted, _COMMITTED),
    (EffectRejected, _REJECTED),
    (EffectOutcomeUnknown, _OUTCOME_UNKNOWN),
    (EffectReconciled, _BY_RESOLUTION),
    (EffectResolvedByHand, _RECONCILED),
)
"""Each effect event class and the status its events lead to (the classes are disjoint)."""
_STATUS_OF_CLASS: ByClass[str | None] = ByClass(_class_status)

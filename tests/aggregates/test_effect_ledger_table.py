"""The effect ledger's table: every status and event, applied where the table says, or refused."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import pytest

from aggregates.decisions import EffectStatus
from aggregates.effect import (
    LEDGER_TRANSITIONS,
    Effect,
    EffectCommitted,
    EffectDispatched,
    EffectEvent,
    EffectOutcomeUnknown,
    EffectPrepared,
    EffectReconciled,
    EffectRejected,
    EffectResolvedByHand,
    Resolution,
)
from aggregates.errors import IllegalTransitionError
from aggregates.invocation import Phase

AT = datetime(2026, 1, 1, tzinfo=UTC)

EVENTS: list[type[EffectEvent]] = [
    EffectPrepared,
    EffectDispatched,
    EffectCommitted,
    EffectRejected,
    EffectOutcomeUnknown,
    EffectReconciled,
    EffectResolvedByHand,
]


def _prepared() -> Effect:
    return Effect.prepare(
        invocation_id="i", step=1, call_id="c", tool="t", arguments_digest="d", at=AT
    )


def _steps(*steps: Callable[[Effect], None]) -> Callable[[Effect], None]:
    def reach(effect: Effect) -> None:
        for step in steps:
            step(effect)

    return reach


def _dispatch(effect: Effect) -> None:
    effect.dispatch(at=AT)


_REACH: dict[EffectStatus, Callable[[Effect], None]] = {
    EffectStatus.PREPARED: _steps(),
    EffectStatus.DISPATCHED: _steps(_dispatch),
    EffectStatus.COMMITTED: _steps(_dispatch, lambda e: e.commit({"id": 1}, at=AT)),
    EffectStatus.REJECTED: _steps(_dispatch, lambda e: e.reject("no", at=AT)),
    EffectStatus.OUTCOME_UNKNOWN: _steps(_dispatch, lambda e: e.mark_unknown("t", at=AT)),
    EffectStatus.RECONCILED: _steps(
        _dispatch, lambda e: e.reconcile(Resolution.COMMITTED, receipt={"id": 1}, at=AT)
    ),
}

# Each event with every content that leads somewhere else (not_found prepares again).
_FIRE: dict[type[EffectEvent], list[Callable[[Effect], None]]] = {
    EffectPrepared: [
        lambda e: e.trigger_event(
            EffectPrepared,
            timestamp=AT,
            originator_topic="aggregates.effect:Effect",
            invocation_id="i",
            step=1,
            call_id="c",
            tool="t",
            arguments_digest="d",
        )
    ],
    EffectDispatched: [lambda e: e.dispatch(at=AT)],
    EffectCommitted: [lambda e: e.commit({"id": 2}, at=AT)],
    EffectRejected: [lambda e: e.reject("no", at=AT)],
    EffectOutcomeUnknown: [lambda e: e.mark_unknown("lost", at=AT)],
    EffectReconciled: [
        lambda e: e.reconcile(Resolution.COMMITTED, receipt={"id": 2}, at=AT),
        lambda e: e.reconcile(Resolution.NOT_FOUND, at=AT),
    ],
    EffectResolvedByHand: [
        lambda e: e.resolve_by_hand(
            Resolution.REJECTED, by="op", reason="no", invocation_phase=Phase.TERMINATED, at=AT
        )
    ],
}


def _state(effect: Effect) -> dict[str, object]:
    return {k: v for k, v in vars(effect).items() if k != "_pending_events"}


_CELLS = [(status, event) for status in EffectStatus for event in EVENTS]


@pytest.mark.parametrize(
    ("status", "event_type"), _CELLS, ids=[f"{s.value}-{e.__name__}" for s, e in _CELLS]
)
def test_each_cell_of_the_ledger_table_leads_where_it_says_or_is_refused_with_nothing_changed(
    status: EffectStatus, event_type: type[EffectEvent]
) -> None:
    """Only ``IllegalTransitionError`` counts as a refusal (an assert would fail the test)."""
    row = LEDGER_TRANSITIONS[status]
    for fire in _FIRE[event_type]:
        effect = _prepared()
        _REACH[status](effect)
        effect.take_events()
        assert effect.status is status
        before = _state(effect)
        if event_type in row:
            fire(effect)
            assert effect.status in row[event_type]
            assert [type(e) for e in effect.take_events()] == [event_type]
        else:
            with pytest.raises(IllegalTransitionError):
                fire(effect)
            assert _state(effect) == before
            assert effect.take_events() == []


def test_the_ledger_table_names_every_status_and_its_destinations_are_all_reached() -> None:
    assert set(LEDGER_TRANSITIONS) == set(EffectStatus)
    settled = {EffectStatus.COMMITTED, EffectStatus.REJECTED, EffectStatus.RECONCILED}
    assert all(not LEDGER_TRANSITIONS[status] for status in settled)
    reached = set()
    for status, row in LEDGER_TRANSITIONS.items():
        for event_type in row:
            for fire in _FIRE[event_type]:
                effect = _prepared()
                _REACH[status](effect)
                fire(effect)
                reached.add((status, event_type, effect.status))
    table = {
        (s, e, d) for s, row in LEDGER_TRANSITIONS.items() for e, ds in row.items() for d in ds
    }
    assert reached == table

"""The read models' shortcuts give what the plain code gives.

``aggregates.events.isoformat`` is ``datetime.isoformat``; a ``ByClass`` table answers what
``isinstance`` answers; ``effect_status_after`` answers what its match answers, for every
event class and every event of the mixed-histories fixture; ``built`` and the fold's copy
of a model make what pydantic's ``model_construct`` and ``model_copy`` make.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from eventsourcing.persistence import StoredEvent
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, TypeAdapter

import projections.trajectory_fold as trajectory_module
from aggregates.audit_coverage import event_classes
from aggregates.decisions import EffectStatus, ToolEffect, built
from aggregates.effect import (
    EffectCommitted,
    EffectDispatched,
    EffectEvent,
    EffectOutcomeUnknown,
    EffectPrepared,
    EffectReconciled,
    EffectRejected,
    EffectResolvedByHand,
    Resolution,
    effect_status_after,
)
from aggregates.events import ByClass, DomainEvent, isoformat
from aggregates.invocation import InvocationEvent, Terminated
from loop_actors.store.mapper import PydanticEventMapper
from loop_actors.store.store import EventStore
from projections.trajectory import CallView, InvocationStatus, Trajectory

FIXTURES = Path(__file__).parents[1] / "fixtures"

ZONES = st.sampled_from(
    [
        None,
        UTC,
        timezone(timedelta(0), "named"),
        timezone(timedelta(hours=2)),
        timezone(-timedelta(hours=5, minutes=30)),
        timezone(timedelta(seconds=30)),
        ZoneInfo("Europe/London"),
        ZoneInfo("America/New_York"),
    ]
)


@settings(max_examples=500, deadline=None)
@given(moment=st.datetimes(min_value=datetime(1, 1, 1)), zone=ZONES)
def test_isoformat_is_datetimes_own(moment: datetime, zone: timezone | ZoneInfo | None) -> None:
    aware = moment.replace(tzinfo=zone)
    assert isoformat(aware) == aware.isoformat()


@pytest.mark.parametrize(
    "text",
    [
        "2026-12-01T17:15:05.196716Z",
        "2026-12-01T17:15:05Z",
        "2026-12-01T17:15:05.000001+00:00",
        "0999-01-01T00:00:00Z",
        "2026-12-01T17:15:05.5+02:00",
        "2026-12-01T17:15:05",
    ],
)
def test_isoformat_of_the_times_pydantic_reads(text: str) -> None:
    moment = TypeAdapter(datetime).validate_json(f'"{text}"')
    assert isoformat(moment) == moment.isoformat()
    assert isoformat(moment) == moment.isoformat()  # again, once the zone is remembered


def test_a_table_by_class_answers_as_isinstance() -> None:
    class Base:
        pass

    class Sub(Base):
        pass

    asked: list[type] = []

    def decide(cls: type) -> bool:
        asked.append(cls)
        return issubclass(cls, (InvocationEvent, Base))

    table = ByClass(decide)
    classes = [*event_classes(), Base, Sub, int]
    for cls in classes:
        assert table[cls] is issubclass(cls, (InvocationEvent, Base))
        assert table[cls] is issubclass(cls, (InvocationEvent, Base))
    assert asked == classes  # once per class


@pytest.fixture
def fixture_store(tmp_path: Path) -> Iterator[EventStore]:
    """The mixed-histories fixture's store (108 events of every kind the read models show)."""
    path = tmp_path / "mixed.db"
    connection = sqlite3.connect(path)
    connection.executescript((FIXTURES / "mixed-histories.sql").read_text())
    connection.commit()
    connection.close()
    store = EventStore(f"sqlite:///{path}", create=False)
    yield store
    store.close()


def _status_by_match(event: object) -> str | None:
    """What an effect event leads to, written as the plain match over its classes."""
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
        case EffectReconciled() | EffectResolvedByHand():
            return EffectStatus.RECONCILED.value
        case _:
            return None


def test_effect_status_after_answers_as_its_match(fixture_store: EventStore) -> None:
    recorder, mapper = fixture_store.app.recorder, fixture_store.app.mapper
    notifications = recorder.select_notifications(start=0, limit=10_000)
    events: list[DomainEvent] = [mapper.to_domain_event(n) for n in notifications]  # type: ignore[misc]
    assert {type(e) for e in events} >= {EffectCommitted, Terminated}
    for event in events:
        assert effect_status_after(event) == _status_by_match(event)
    for cls in event_classes():
        if not issubclass(cls, EffectEvent) or issubclass(cls, EffectReconciled):
            continue
        event = object.__new__(cls)  # its class is all either looks at
        assert effect_status_after(event) == _status_by_match(event)
    for resolution in Resolution:  # EffectReconciled: its resolution says which
        reconciled = EffectReconciled.model_construct(
            originator_id="eff-x",
            originator_version=2,
            timestamp=datetime.now(UTC),
            resolution=resolution,
        )
        assert effect_status_after(reconciled) == _status_by_match(reconciled)
    assert effect_status_after(object()) is None


def _reference(cls: type[DomainEvent], originator_id: str, version: int, plain: bytes) -> Any:
    """What pydantic's own reader makes of the record (the store's id and version put back)."""
    fields = json.loads(plain)
    return cls.model_validate_json(
        json.dumps({"originator_id": originator_id, "originator_version": version, **fields})
    )


def test_the_store_decodes_every_event_as_pydantic_reads_its_record(
    fixture_store: EventStore,
) -> None:
    """The mapper builds the JSON it validates by hand: the same events, for any id and version."""
    recorder, mapper = fixture_store.app.recorder, fixture_store.app.mapper
    assert isinstance(mapper, PydanticEventMapper)
    notifications = recorder.select_notifications(start=0, limit=10_000)
    assert len(notifications) == 108
    for n in notifications:
        plain = mapper.plain_state(n)
        for originator_id, version in [
            (str(n.originator_id), n.originator_version),
            ('inv-\u00fc "\u2603"\\', 12_345),
            ("x", 999),
            ("y", 1000),
        ]:
            stored = StoredEvent(
                originator_id=originator_id,
                originator_version=version,
                topic=n.topic,
                state=n.state,
            )
            decoded: DomainEvent = mapper.to_domain_event(stored)
            expected = _reference(type(decoded), originator_id, version, plain)
            assert type(decoded) is type(expected)
            assert decoded == expected
            assert decoded.model_fields_set == expected.model_fields_set
            assert decoded.model_dump_json() == expected.model_dump_json()


def _slots(model: BaseModel) -> tuple[Any, ...]:
    """Everything a pydantic model holds: its class, fields, fields set, extra and private."""
    return (
        type(model),
        model.__dict__,
        model.__pydantic_fields_set__,
        model.__pydantic_extra__,
        model.__pydantic_private__,
    )


def test_built_makes_the_model_model_construct_makes() -> None:
    """``built`` sets pydantic's slots through their descriptors: as ``model_construct`` does."""
    fields: dict[str, Any] = {
        "call_id": "c1",
        "name": "lookup",
        "arguments": {"key": "a"},
        "status": "dispatched",
        "output": None,
        "error_message": None,
        "duration_ms": None,
        "effect": ToolEffect.WRITE,
        "effect_key": "k",
        "effect_status": "dispatched",
        "plan_step": None,
    }
    made = built(CallView, dict(fields))
    assert _slots(made) == _slots(CallView.model_construct(**fields))
    assert made.model_dump_json() == CallView.model_construct(**fields).model_dump_json()


@pytest.mark.parametrize(
    "update", [{"events": 7}, {"events": 7, "status": InvocationStatus.PAUSED}, {}]
)
def test_the_folds_copy_of_a_model_is_model_copy_with_the_update(update: dict[str, Any]) -> None:
    """The fold's ``_replace`` is ``model_copy(update=...)``, for a model with fewer fields set."""
    trajectory = Trajectory(invocation_id="i", goal="g", agent_name="a", steps=[])
    copied = trajectory_module._replace(trajectory, update)
    assert _slots(copied) == _slots(trajectory.model_copy(update=update))
    assert copied.__dict__ is not trajectory.__dict__
